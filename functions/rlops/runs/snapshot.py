"""What the `snapshot` function does: a manifest for each new complete checkpoint of recent runs, written once;
then the exports the recipes ask for (`checkpoint_transfers.py`).

Manifests go to `PREFIX/environments/ENV/runs/RUN/manifests/step-N.json` with a create-only
precondition, so repeated or concurrent ticks write each exactly once; the tick that wrote it links
it from the run record and publishes a `checkpoint` event. Locally the checkpoints are hashed where
they are; GKE environments hash them where /lustre is mounted: a CPU-only Ray job on the cluster
(`rlops.checkpoints.scan`) prints the manifests, and the next tick stores them.
"""

import hashlib
import json
import shlex
import tempfile
from pathlib import Path
from typing import Any, cast

from google.cloud import storage

from rlops.checkpoints import layout, manifest, scan
from rlops.cloud.ray_jobs import ACTIVE, JobRequest, status_of
from rlops.logs import emit
from rlops.runs import checkpoint_transfers, policy
from rlops.runs.jobs import shipped_rlops
from rlops.sites import Site
from rlops.state.bucket import read_json, write_json_if
from rlops.state.run_records import RunRecord


def tick(site: Site) -> list[dict[str, Any]]:
    """The manifests of new complete checkpoints, then what the recipes' `export:` policies want
    (`checkpoint_transfers.tick`); the events."""
    recent = {run: record for run, (record, _) in sorted(site.records.all().items())
              if policy.recent(record, site.clock.time())}  # read once for the relink and the manifests
    events = _relink(site, recent)
    events += _manifests_here(site, recent) if site.checkpoints_here else _tick_on_cluster(site)
    return events + checkpoint_transfers.tick(site)


def _relink(site: Site, recent: dict[str, RunRecord]) -> list[dict[str, Any]]:
    """Manifests stored without their link in the run record (a tick died, or lost its record write, between
    the two writes): linked now, and their event published, since a stored manifest is never written again."""
    events = []
    for run, record in recent.items():
        for step, blob in sorted(site.records.manifest_objects(run).items()):
            if str(step) not in record.manifests:
                content, _ = read_json(blob)
                name = cast(str, blob.name)  # a listed object has one (a Blob made without one has none)
                if content is not None and manifest.intact(content) and \
                        _link(site, run, step, name, content["digest"], content.get("save")):
                    events.append(_published(site, run, content, name))
    return events


def _manifests_here(site: Site, recent: dict[str, RunRecord]) -> list[dict[str, Any]]:
    events = []
    for run, record in recent.items():
        known = site.records.manifest_objects(run)
        for checkpoint in layout.complete(Path(record.checkpoint_dir)):
            try:
                if checkpoint.step in known and not _saved_again(record, checkpoint.step,
                                                                 manifest.save_id(checkpoint.path)):
                    continue
                content = manifest.build(checkpoint.path, run)
            except (manifest.ManifestError, OSError) as error:  # pruned or torn between listing and hashing
                emit("WARNING", "checkpoint not snapshotted", run=run, step=checkpoint.step, reason=str(error))
                continue
            events += _store(site, run, content, known.get(checkpoint.step))
    return events


def _saved_again(record: RunRecord, step: int, save: str) -> bool:
    """Whether the step's checkpoint is another save than the one its manifest describes (a manifest linked before
    saves were told apart says nothing: taken as the same)."""
    linked = record.manifests.get(str(step)) or {}
    return linked.get("save") not in (None, save)


def _store(site: Site, run: str, content: dict[str, Any],
           replacing: storage.Blob | None = None) -> list[dict[str, Any]]:
    """Write a manifest once (create-only), or in place of the manifest of an earlier save of its step (kept
    under replaced-manifests/), link it from the run record, publish the event; [] if another tick did."""
    names = site.records.layout
    name = names.manifest(run, content["step"])
    blob = site.bucket.blob(name)
    generation = 0
    if replacing is not None:
        earlier, generation = read_json(replacing)
        if earlier is None or earlier.get("save") == content.get("save"):
            return []  # removed meanwhile, or another tick replaced it already
        write_json_if(site.bucket.blob(names.replaced_manifest(run, content["step"], earlier.get("save", "unknown"))),
                      earlier, 0)
    if not write_json_if(blob, content, generation):
        return []  # another tick wrote it first
    if not _link(site, run, content["step"], name, content["digest"], content.get("save")):
        return []  # a concurrent tick's relink found it first and said so
    return [_published(site, run, content, name, earlier.get("save") if replacing is not None else None)]


def _published(site: Site, run: str, content: dict[str, Any], name: str,
               replaced: str | None = None) -> dict[str, Any]:
    event = {"type": "checkpoint", "environment": site.name, "run": run, "step": content["step"], "manifest": name,
             "digest": content["digest"], "total_bytes": content["total_bytes"],
             **({"replaced": replaced} if replaced else {})}
    site.publish(event)
    return event


def _tick_on_cluster(site: Site) -> list[dict[str, Any]]:
    """GKE: collect what finished snapshot jobs printed, then start one for the runs' new checkpoints."""
    events, busy = [], False
    for job in site.ray.all():
        meta = job.metadata or {}  # not a run's job: no rlops-run, so the watcher and the reaper pass it by
        submission_id = job.submission_id  # None for a driver run without a submission: none of rlops's jobs
        if meta.get("rlops-environment") != site.name or meta.get("rlops-kind") != "snapshot" or submission_id is None:
            continue
        status = status_of(job)
        if status in ACTIVE:
            busy = True
            continue
        if status == "SUCCEEDED":
            for line in site.ray.logs(submission_id).splitlines():
                if line.startswith(scan.PREFIX):
                    content = json.loads(line[len(scan.PREFIX):])
                    if manifest.intact(content):
                        stored = site.records.manifest_objects(content["run"]).get(content["step"])
                        events += _store(site, content["run"], content, stored)
        else:
            emit("WARNING", "snapshot job did not succeed", submission_id=submission_id, status=status,
                 said=(job.message or "")[-300:])
        site.ray.client.delete_job(submission_id)  # collected: frees the id and Ray's copy of the output
    if not busy:
        _start_cluster_scan(site)
    return events


def _start_cluster_scan(site: Site) -> None:
    now = site.clock.time()
    runs = []
    for run, (record, _) in sorted(site.records.all().items()):
        if policy.recent(record, now):
            known = ",".join(f"{step}@{(record.manifests.get(str(step)) or {}).get('save', '')}"
                             for step in sorted(site.records.manifest_objects(run)))
            runs += ["--run", f"{run}={record.checkpoint_dir}:{known}"]
    if not runs:
        return
    with tempfile.TemporaryDirectory(prefix="rlops-job-") as staging:  # py_modules are uploaded by the submit
        # Named by what it scans: overlapping ticks (Scheduler fires every minute, Pub/Sub retries a slow one)
        # that both found no scan running submit the same id, and Ray runs it once.
        scanned = hashlib.sha256(json.dumps(runs).encode()).hexdigest()[:16]
        site.ray.submit_once(JobRequest(
            submission_id=f"rlops.{site.name}.snapshot.{scanned}",
            entrypoint=" ".join(shlex.quote(word) for word in ["python", "-m", "rlops.checkpoints.scan", *runs]),
            metadata={"rlops-environment": site.name, "rlops-kind": "snapshot"},
            runtime_env={"py_modules": shipped_rlops(Path(staging))},
            entrypoint_num_cpus=1))


def _link(site: Site, run: str, step: int, name: str, digest: str, save: str | None) -> bool:
    """Link the manifest from the run record; whether this call is the one that linked it (a concurrent tick's
    relink and the writer's own link race for it: only one of them publishes its event)."""
    link = {"object": name, "digest": digest, **({"save": save} if save else {})}
    linked_here = []

    def change(record: RunRecord) -> None:
        linked_here[:] = [record.manifests.get(str(step)) != link]
        record.manifests[str(step)] = link

    if not site.records.update(run, change):
        emit("WARNING", "manifest written but not linked from the run record", run=run, step=step)
        return True  # said now; a later tick's relink links it
    return linked_here[0]


def listing(site: Site, run: str) -> list[dict[str, Any]] | None:
    """A run's complete checkpoints, with what their manifests say and whether the files still match."""
    record, _ = site.records.get(run)
    if record is None:
        return None
    known = site.records.manifest_objects(run)
    directory = Path(record.checkpoint_dir)
    present = {c.step: c for c in layout.complete(directory)} if site.checkpoints_here else {}
    rows = []
    for step in sorted(set(known) | set(present)):
        content = json.loads(known[step].download_as_bytes()) if step in known else None
        if content is None:
            verified = "no manifest yet"
        elif step not in present:
            verified = "gone" if site.checkpoints_here else "not checked here"
        else:
            differences = manifest.verify(present[step].path, content)
            verified = "yes" if not any(differences.values()) else \
                "NO: " + ", ".join(f"{len(v)} {k}" for k, v in differences.items() if v)
        metrics = (content or {}).get("metrics", {})
        shown = {k: metrics[k] for k in ("reward", "loss", "val:accuracy", "total_steps") if k in metrics}
        saved = max(f["mtime"] for f in content["files"])[:19] if content and content["files"] else "-"
        rows.append({"step": step, "total_bytes": (content or {}).get("total_bytes"), "saved": saved,
                     "verified": verified, "metrics": json.dumps(shown) if shown else "-"})
    return rows
