"""Checkpoints copied to Cloud Storage and verified there, object by object: `rlops checkpoints export`, the
recipes' `export:` policy (followed by the snapshot tick) and `rlops checkpoints import`.

Locally the checkpoint is read from the environment's Lustre directory and uploaded with the real
storage client. On GKE only the cluster mounts Lustre: the copy is the Lustre API's `exportData`, a
long-running operation started by one call and followed by name (the CLI waits for it with its
counters; the snapshot tick looks again at its next run). Either way the export is then verified by
listing alone against the manifest (`checkpoints.export`), and the run record keeps it.

An import copies a verified export into an environment's Lustre (`importData` on GKE; a download into
a directory renamed into place once it verifies, locally) and stores its manifest with the
environment's state, so the run's next attempt resumes from it, through the checkpoint gate.
"""

import functools
import hashlib
import json
import shlex
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from google.cloud import storage

from rlops.checkpoints import export, layout, manifest
from rlops.cloud.base import CloudError, Connection, is_conflict
from rlops.cloud.ray_jobs import ACTIVE, JobRequest, status_of
from rlops.errors import Failure
from rlops.logs import emit
from rlops.permissions import lacking_permission
from rlops.runs import jobs, policy
from rlops.sites import Site
from rlops.spec.model import GcpEnvironment
from rlops.state.bucket import client, write_json_if
from rlops.state.run_records import RunRecord

if TYPE_CHECKING:
    from rlops.cloud.lustre import Transfers, TransferState

POLL_SECONDS = 10.0


def export_checkpoint(site: Site, run: str, step: int | None, destination: tuple[storage.Bucket, str] | None,
                      report: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Export step `step` of `run` (default: its newest with a manifest) to (bucket, prefix) (default: the state
    bucket's `runs/RUN/exports`) and verify it; what was done. On GKE this waits for the Lustre API's copy,
    reporting its progress."""
    record, known = _run(site, run)
    step = max(known) if step is None else step
    if step not in known:
        raise Failure(f"run {run} has no manifest for step {step}; it has {sorted(known)}")
    content = export.checked(_read(known[step]))
    bucket, prefix = destination or (site.bucket, site.records.layout.exports(run))
    if site.checkpoints_here:
        return _copy_here(site, record, content, bucket, prefix)
    transfers = _transfers(site)
    operation = _start_on_lustre(site, transfers, record, content, bucket, prefix)
    state = _waited(site, transfers, "exportData", operation, report)
    if state.error:
        _record(site, run, step, {"destination": f"gs://{bucket.name}/{export.objects_prefix(prefix, step)}",
                                  "operation": operation, "error": f"{state.error} ({state.said()})"})
        lacking = lacking_permission(state.error)
        raise Failure(f"the Lustre API's export of step {step} of {run} failed: {state.error} ({state.said()})"
                      + (f"; {lacking}" if lacking else ""))
    return _verified(site, run, content, bucket, prefix)


def tick(site: Site) -> list[dict[str, Any]]:
    """What the recipes' `export:` policies want and no export has yet: exported (locally) or started (GKE); GKE
    exports started by an earlier tick, looked at again and verified once done. The `checkpoint-exported` events."""
    events, now = [], site.clock.time()
    transfers = functools.cache(lambda: _transfers(site))  # one Lustre client a tick, and only if a run needs it
    for run, (record, _) in sorted(site.records.all().items()):
        recipe = site.env.recipes.get(record.recipe)
        if recipe is None or recipe.export.when == "none" or not policy.recent(record, now):
            continue
        known = site.records.manifest_objects(run)
        for step, entry in sorted(record.exports.items()):
            if "operation" in entry and not entry.get("verified_at") and not entry.get("error"):
                events += _follow(site, transfers(), record, known[int(step)], entry)
        due = policy.exports_due(record, sorted(known), recipe.export)
        for step in due:
            try:
                done = _export_due(site, transfers, record, export.checked(_read(known[step])), recipe.export.to)
            except CloudError as refused:
                if not is_conflict(refused):
                    raise
                # The Lustre API runs one transfer per instance (managed-lustre/docs/transfer-data): next tick.
                emit("INFO", "checkpoint export waits for the instance's transfer in progress", run=run, step=step)
                break
            except Failure as failed:  # a pruned or altered checkpoint: said once, not tried every tick
                emit("WARNING", "checkpoint not exported", run=run, step=step, reason=str(failed))
                _record(site, run, step, {"error": str(failed), "at": site.clock.time()})
                continue
            events += [done] if done else []
    return events


def storage_location(site: Site, url: str, given_as: str) -> tuple[storage.Bucket, str]:
    """(bucket, prefix) of a gs:// URL given as `given_as`, reached as the environment reaches Cloud Storage (for a
    local one: the emulator of the local environment whose state bucket it is, else its own)."""
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    if not url.startswith("gs://") or not bucket or not prefix.strip("/"):
        raise Failure(f"{given_as} {url}: expected gs://BUCKET/PREFIX")
    endpoints = site.endpoints
    if site.checkpoints_here:
        from rlops.local.stack import hosting  # noqa: PLC0415 the local stack's registry, for local environments only

        endpoints = hosting(bucket) or endpoints
    return client(None, endpoints).bucket(bucket), prefix.strip("/")


def _export_due(site: Site, transfers: "Callable[[], Transfers]", record: RunRecord, content: dict[str, Any],
                to: str | None) -> dict[str, Any] | None:
    bucket, prefix = site.bucket, site.records.layout.exports(record.run)
    if to:
        bucket_name, _, path = to.removeprefix("gs://").partition("/")
        bucket, prefix = site.bucket.client.bucket(bucket_name), "/".join(filter(None, (path.strip("/"), record.run)))
    if site.checkpoints_here:
        return _copy_here(site, record, content, bucket, prefix)
    _start_on_lustre(site, transfers(), record, content, bucket, prefix)
    return None


def _follow(site: Site, transfers: "Transfers", record: RunRecord, manifest_object: storage.Blob,
            entry: dict[str, Any]) -> list[dict[str, Any]]:
    content = export.checked(_read(manifest_object))
    step = content["step"]
    state = transfers.state(entry["operation"])
    if not state.done:
        return []
    if state.error:
        _record(site, record.run, step, {**entry, "error": f"{state.error} ({state.said()})"})
        emit("WARNING", "checkpoint export failed", run=record.run, step=step, error=state.error)
        return []
    bucket = site.bucket.client.bucket(entry["bucket"])
    try:
        return [_verified(site, record.run, content, bucket, entry["prefix"])]
    except Failure as failed:
        _record(site, record.run, step, {**entry, "error": str(failed)})
        return []


def _run(site: Site, run: str) -> tuple[RunRecord, dict[int, storage.Blob]]:
    record, _ = site.records.get(run)
    if record is None:
        raise Failure(site.records.unknown(run))
    known = site.records.manifest_objects(run)
    if not known:
        raise Failure(f"run {run} has no checkpoint with a manifest yet (run `rlops snapshot {site.name}` first)")
    return record, known


def _copy_here(site: Site, record: RunRecord, content: dict[str, Any], bucket: storage.Bucket,
               prefix: str) -> dict[str, Any]:
    step = content["step"]
    checkpoint = {c.step: c for c in layout.complete(Path(record.checkpoint_dir))}.get(step)
    if checkpoint is None:
        raise Failure(f"step {step} of {record.run} is no longer on Lustre; nothing to export")
    before = manifest.verify(checkpoint.path, content)
    if any(before.values()):
        raise Failure(f"step {step} of {record.run} does not match its manifest ({export.said(before)}); not exported")
    export.upload(bucket, prefix, checkpoint.path, content)
    return _verified(site, record.run, content, bucket, prefix)


def _start_on_lustre(site: Site, transfers: "Transfers", record: RunRecord, content: dict[str, Any],
                     bucket: storage.Bucket, prefix: str) -> str:
    """exportData of the checkpoint's directory to `gs://BUCKET/PREFIX/step-N/`; the operation, kept in the run
    record so that a later tick (or another CLI) can follow it."""
    step = content["step"]
    source = lustre_path(site, PurePosixPath(record.checkpoint_dir) / layout.directory(content["layout"], step))
    destination = f"gs://{bucket.name}/{export.objects_prefix(prefix, step)}"
    operation = transfers.export(source, destination)
    _record(site, record.run, step, {"destination": destination, "bucket": bucket.name, "prefix": prefix,
                                     "operation": operation, "started_at": site.clock.time()})
    emit("INFO", "checkpoint export started", run=record.run, step=step, operation=operation)
    return operation


def _verified(site: Site, run: str, content: dict[str, Any], bucket: storage.Bucket, prefix: str) -> dict[str, Any]:
    """The manifest next to the export, the export listed against it, recorded and said; what was done."""
    step = content["step"]
    export.upload_manifest(bucket, prefix, content)
    after = export.verify(bucket, prefix, content)
    if any(after.values()):
        raise Failure(f"the export of step {step} of {run} does not match its manifest: {export.said(after)}")
    done = {"destination": f"gs://{bucket.name}/{export.objects_prefix(prefix, step)}",
            "objects": len(content["files"]), "bytes": content["total_bytes"], "verified_at": site.clock.time()}
    _record(site, run, step, done)
    event = {"type": "checkpoint-exported", "environment": site.name, "run": run, "step": step, **done}
    site.publish(event)
    return event


def _record(site: Site, run: str, step: int, entry: dict[str, Any]) -> None:
    if not site.records.update(run, lambda record: record.exports.update({str(step): entry})):
        emit("WARNING", "export not linked from the run record", run=run, step=step)


def _transfers(site: Site) -> "Transfers":
    from rlops.cloud.lustre import Transfers  # noqa: PLC0415 cold start: the Lustre client only for a GKE export

    env = _on_gke(site)
    return Transfers(env.project.id, env.zone, env.lustre.name, Connection.to(site.endpoints))


def _on_gke(site: Site) -> GcpEnvironment:
    """The environment of a site whose checkpoints only its cluster reaches, on the Lustre instance it mounts."""
    if not isinstance(site.env, GcpEnvironment):
        raise Failure(f"environment {site.name} has no Lustre instance: its checkpoints are on this machine")
    return site.env


def lustre_path(site: Site, mounted: PurePosixPath) -> str:
    """A path as the cluster mounts it (under `ray.lustre_mount`), as the Lustre API names it (from the file
    system's root: the PersistentVolume mounts the whole file system)."""
    mount = PurePosixPath(_on_gke(site).ray.lustre_mount)
    if not mounted.is_relative_to(mount):
        raise Failure(f"{mounted} is not on Lustre ({mount})")
    return "/" + str(mounted.relative_to(mount)) + "/"


def import_checkpoint(site: Site, run: str, recipe_name: str, source: tuple[storage.Bucket, str],
                      report: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Bring the export at (bucket, PREFIX/step-N) into run `run`'s checkpoint directory of this environment, once
    the export verifies against its manifest; the manifest stored with this environment's state. What was done."""
    bucket, step_prefix = source
    base, _, leaf = step_prefix.rstrip("/").rpartition("/")
    if not leaf.startswith("step-") or not leaf[5:].isdigit():
        raise Failure(f"gs://{bucket.name}/{step_prefix}: expected an export's step, …/step-N (as `rlops checkpoints "
                      "export` wrote it)")
    step = int(leaf[5:])
    blob = bucket.blob(export.manifest_object(base, step))
    if not blob.exists():
        raise Failure(f"no manifest at gs://{bucket.name}/{blob.name}: not an rlops export")
    content = export.checked(_read(blob))
    found = export.verify(bucket, base, content)
    if any(found.values()):
        raise Failure(f"the export at gs://{bucket.name}/{export.objects_prefix(base, step)} does not match its "
                      f"manifest ({export.said(found)}); not imported")
    recipe = site.env.recipes.get(recipe_name)
    if recipe is None:
        raise Failure(f"environment {site.name} has no recipe {recipe_name}")
    run_dir = PurePosixPath(jobs.checkpoint_dir(recipe, run, site.lustre_root))
    target = run_dir / layout.directory(content["layout"], step)
    if site.checkpoints_here:
        export.download(bucket, base, content, Path(target))
        verified = "verified on Lustre"
    else:
        # importData copies into a directory that exists (LustrePath, google-cloud-lustre types/transfer.py): only
        # the cluster can make one. A half-imported checkpoint is harmless: the gate verifies it before any resume.
        _on_cluster(site, "import", ["mkdir", "-p", str(target)], report)
        transfers = _transfers(site)
        operation = transfers.import_(f"gs://{bucket.name}/{export.objects_prefix(base, step)}",
                                             lustre_path(site, target))
        state = _waited(site, transfers, "importData", operation, report)
        if state.error:
            raise Failure(f"the Lustre API's import of step {step} failed: {state.error} ({state.said()})")
        verified = "to be verified on the cluster by the run's checkpoint gate when it starts"
    stored = site.bucket.blob(site.records.layout.manifest(run, step))
    if not write_json_if(stored, content, 0) and _read(stored)["digest"] != content["digest"]:
        raise Failure(f"{site.name} already has a different manifest for step {step} of {run}")
    site.publish({"type": "checkpoint-imported", "environment": site.name, "run": run, "step": step,
                  "source": f"gs://{bucket.name}/{export.objects_prefix(base, step)}", "directory": str(target)})
    return {"step": step, "directory": str(target), "objects": len(content["files"]), "bytes": content["total_bytes"],
            "verified": verified}


CLUSTER_JOB_SECONDS = 300.0


def _waited(site: Site, transfers: "Transfers", verb: str, operation: str,
            report: Callable[[str], None]) -> "TransferState":
    """The transfer's state once its operation is done, its counters reported as it goes: polled after 0.5 s,
    then twice as long each time up to POLL_SECONDS (an export of a large checkpoint takes minutes)."""
    delay = 0.5
    while True:
        state = transfers.state(operation)
        report(f"{verb} {operation.rsplit('/', 1)[-1]}: {'done' if state.done else 'running'}, {state.said()}")
        if state.done:
            return state
        site.clock.sleep(delay)  # the Lustre API tells progress only when asked again
        delay = min(delay * 2, POLL_SECONDS)


def _on_cluster(site: Site, kind: str, words: list[str], report: Callable[[str], None]) -> None:
    """Run `words` as a small Ray job on the cluster's head (which mounts /lustre) and wait for it to succeed."""
    command = " ".join(shlex.quote(word) for word in words)
    submission = f"rlops.{site.name}.{kind}.{hashlib.sha256(command.encode()).hexdigest()[:16]}"
    site.ray.submit_once(JobRequest(submission, command, {"rlops-environment": site.name, "rlops-kind": kind},
                                    entrypoint_num_cpus=0.1))
    deadline = site.clock.monotonic() + CLUSTER_JOB_SECONDS
    while True:
        job = site.ray.find(submission)
        if job is None:
            raise Failure(f"the Ray head no longer knows job {submission} (`{command}`; it restarted?); run the "
                          "command again")
        status = status_of(job)
        if status not in ACTIVE:
            break
        if site.clock.monotonic() > deadline:
            raise Failure(f"`{command}` on the cluster did not finish in {CLUSTER_JOB_SECONDS:.0f}s (Ray job "
                          f"{submission}); run the command again to wait for it")
        report(f"{command} on the cluster: {status}")
        site.clock.sleep(1.0)
    site.ray.client.delete_job(submission)  # so that the same command can run again
    if status != "SUCCEEDED":
        raise Failure(f"`{command}` on the cluster ended {status}: {(job.message or '')[-300:]}")


def _read(blob: storage.Blob) -> dict[str, Any]:
    return json.loads(blob.download_as_bytes())
