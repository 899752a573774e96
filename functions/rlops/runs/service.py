"""What the `train` and `watch` functions do: a message becomes one Ray job; a tick brings run records up to date.

From a train message to the Ray call: `handle_train` → `message.parse` / `settings` →
`jobs.request` → `RayJobs.submit_once` (cloud/ray_jobs.py).
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlops import environments
from rlops.cloud.ray_jobs import RayJobs, described, status_of
from rlops.logs import emit
from rlops.runs import jobs, message, policy, progress, records

TAIL_LINES = 2000  # NeMo RL prints a few dozen lines a step: a tick sees the last dozens of steps


@dataclass
class Site:
    """One environment's runs: its spec, its Ray head, its run records and its events topic."""

    name: str
    env: object
    ray: RayJobs
    records: records.RunRecords
    publish: Callable[[dict], None]
    lustre_root: str
    entrypoint_resources: dict[str, float]
    checkpoints_here: bool  # /lustre is a directory of this machine (local), not only of the cluster (GKE)

    def request(self, recipe_name: str, run: str, settings: dict, requested_by: str, attempt: int):
        return jobs.request(self.name, recipe_name, self.env.recipes[recipe_name], run, settings, requested_by,
                            attempt, self.lustre_root, self.entrypoint_resources)


def load_environment(name: str):
    """The spec of environment NAME from the environments directory, or a Poison saying why not."""
    from rlops.spec.load import load

    path = environments.directory() / f"{name}.yaml"
    if not path.is_file():
        raise message.Poison(f"environment: no environment {name!r} (no {path.name} among the deployed specs)")
    loaded = load(path)
    if loaded.environment is None:
        raise message.Poison(f"environment: the spec of {name} does not validate: {loaded.problems[0]}")
    return loaded.environment


def ticked_environments(wanted: str | None, what: str) -> list[tuple[str, object]]:
    """(name, spec) of the environments a `what` tick covers: the one it names, or else every deployed GCP
    environment that has cloud resources. A spec that does not load is logged and left out.

    A local environment is ticked by its own scheduler (`rlops up`), one in another project than
    RLOPS_PROJECT (the deployment's) by that project's deployment, and a spec that was never applied
    (an example) or was destroyed has no Ray to watch: ticking those would log an error every minute.
    """
    ticked = []
    for name in [wanted] if wanted else [path.stem for path in environments.spec_files()]:
        try:
            env = load_environment(name)
        except message.Poison as poison:
            emit("WARNING", f"{what} tick for an unknown environment", reason=str(poison))
            continue
        if wanted or _has_cloud_resources(name, env):
            ticked.append((name, env))
    return ticked


def _has_cloud_resources(name: str, env) -> bool:
    from rlops.spec.model import LocalEnvironment
    from rlops.state.bucket import client
    from rlops.state.record import ResourceRecord

    if isinstance(env, LocalEnvironment):
        return False
    own_project = os.environ.get("RLOPS_PROJECT")
    if own_project and env.project.id != own_project:
        emit("INFO", "tick skips an environment of another project", environment=name, project=env.project.id)
        return False
    try:
        resources = ResourceRecord(client(env.project.id).bucket(env.state.bucket), env.state.prefix, name).load()
    except Exception:  # noqa: BLE001 - an unreadable bucket is the tick's to report, with the environment's name
        return True
    if not resources.resources:
        emit("INFO", "tick skips an environment with no cloud resources (never applied, or destroyed)",
             environment=name)
    return bool(resources.resources)


def placement(env) -> tuple[str, dict[str, float]]:
    """Where /lustre is for this environment's jobs, and the Ray resources a run's driver asks for."""
    from rlops.spec.model import LocalEnvironment

    if isinstance(env, LocalEnvironment):
        from rlops.local.stack import lustre_directory

        return str(lustre_directory(env)), {env.local.gpu_pool.resource: 1}
    return "/lustre", {}


def open_site(name: str, env) -> Site:
    from rlops.spec.model import LocalEnvironment
    from rlops.state.bucket import client

    if isinstance(env, LocalEnvironment):
        from rlops.local.stack import LOCAL_PROJECT, Stack

        ray = RayJobs(Stack(name, env, lambda _: None).dashboard_url())
        project = LOCAL_PROJECT
    else:
        ray = RayJobs(*_gke_dashboard(name, env))
        project = env.project.id
    lustre, resources = placement(env)
    bucket = client(project).bucket(env.state.bucket)
    return Site(name, env, ray, records.RunRecords(bucket, env.state.prefix, name), _publisher(project), lustre,
                resources, checkpoints_here=isinstance(env, LocalEnvironment))


def _gke_dashboard(name: str, env) -> tuple[str, dict[str, str]]:
    """The Ray head's dashboard through the GKE API server's service proxy, with the caller's Google token."""
    from rlops.cloud.container import ContainerAdapter
    from rlops.kube.cluster import ray_dashboard
    from rlops.provision.service import connection_from_environment, target_of

    cluster = ContainerAdapter(target_of(name, env), connection_from_environment()).read(
        "cluster", env.cluster.name, {})
    if cluster is None:
        raise RuntimeError(f"environment {name}: cluster {env.cluster.name} does not exist; run `rlops apply {name}`")
    return ray_dashboard(cluster.fields.get("dns_endpoint_host"), env.ray.namespace, env.ray.cluster_name)


def _publisher(project: str) -> Callable[[dict], None]:
    import os

    from rlops.cloud import pubsub

    def publish(event: dict) -> None:
        if project == "rlops-local" and not os.environ.get("PUBSUB_EMULATOR_HOST"):
            emit("INFO", "event (no Pub/Sub emulator to publish it to)", event=event)
            return
        pubsub.publish(project, pubsub.EVENTS_TOPIC, event, type=event["type"])

    return publish


# -- train ------------------------------------------------------------------------------------
def handle_train(data: bytes) -> str:
    """'submitted', 'duplicate' or 'poison'. A poison message is logged with its reason and never submitted;
    an error reaching Ray or the bucket raises, so that Pub/Sub delivers the message again."""
    try:
        request = message.parse(data)
        env = load_environment(request.environment)
        recipe = message.recipe_of(request, env)
        settings = message.settings(request, recipe)
    except message.Poison as poison:
        emit("WARNING", "train message refused", reason=str(poison), bytes=len(data))
        return "poison"
    site = open_site(request.environment, env)
    job = site.request(request.recipe, request.run, settings, request.requested_by, attempt=1)
    # The record outlives Ray's job table (a restarted head forgets its jobs and their ids): look there first.
    known = site.records.get(request.run)[0] is not None
    if not known:
        from rlops.reaper.service import wake

        wake(site)  # a reaped pool comes back before the job is submitted; records the acceptance either way
    if known or not site.ray.submit_once(job):
        emit("INFO", "train message for a run already submitted: nothing to do", environment=request.environment,
             run=request.run, submission_id=job.submission_id)
        return "duplicate"
    now = time.time()
    site.records.create(records.new(described(job), job.submission_id, now))
    emit("INFO", "run submitted", environment=request.environment, run=request.run, submission_id=job.submission_id)
    site.publish({"type": "submitted", "environment": request.environment, "run": request.run, "attempt": 1,
                  "recipe": request.recipe, "submission_id": job.submission_id, "requested_by": request.requested_by,
                  "at": now})
    return "submitted"


# -- watch ------------------------------------------------------------------------------------
def tick(site: Site) -> list[dict]:
    """One look at the environment's Ray jobs (one list call); updated run records; the transitions, as events."""
    by_run: dict[str, dict[int, dict]] = {}
    for job in site.ray.all():
        meta = described(job)
        if meta and meta.get("environment") == site.name:
            by_run.setdefault(meta["run"], {})[int(meta["attempt"])] = _plain(job, meta)
    stored = site.records.all()
    events, nodes = [], []
    for run in sorted(set(by_run) | set(stored)):
        record, generation = stored.get(run, (None, 0))
        attempts = by_run.get(run, {})
        if record is None:  # the train function stopped between submitting and writing the record
            first = attempts[min(attempts)]
            record = records.new(first["meta"], first["submission_id"], (first["start_time"] or 0) / 1000)
        changes = _advance(site, record, attempts, nodes)
        if not changes:
            continue
        if record["state"] in policy.TERMINAL:
            record["report"] = _publish_report(site, record)
        written = site.records.create(record) if generation == 0 else site.records.replace(record, generation)
        if not written:
            emit("INFO", "run record changed during this tick; the next tick will look again", run=run)
            continue
        for change in changes:
            event = {"type": "state-changed", "environment": site.name, "run": run, **change,
                     "step": record["step"], "last_checkpoint": record["last_checkpoint"],
                     **({"report": record["report"]} if record.get("report") else {})}
            site.publish(event)
            events.append(event)
    return events


def _publish_report(site: Site, record: dict) -> str | None:
    """The ended run's report in the state bucket; a report that cannot be drawn is logged, never blocks the
    record of how the run ended."""
    from rlops.runs import reporting

    try:
        return reporting.publish(site, record)
    except Exception as error:  # noqa: BLE001 - a plot's failure is not the run's
        emit("WARNING", "run report not written", run=record["run"], error=f"{type(error).__name__}: {error}"[-300:])
        return None


def _plain(job, meta: dict) -> dict:
    return {"submission_id": job.submission_id, "status": status_of(job),
            "message": job.message, "error_type": job.error_type, "start_time": job.start_time,
            "end_time": job.end_time, "driver_node_id": job.driver_node_id, "meta": meta}


def _advance(site: Site, record: dict, attempts: dict[int, dict], nodes: list[dict]) -> list[dict]:
    """Bring `record` up to date with Ray; the state changes it went through."""
    changes = []
    known = {a["attempt"] for a in record["attempts"]}
    for number in sorted(set(attempts) - known):  # an attempt submitted by a tick whose record write lost
        record["attempts"].append(records.attempt(number, attempts[number]["submission_id"], time.time()))
    current = record["attempts"][-1]
    job = attempts.get(current["attempt"])
    if current["state"] in policy.TERMINAL and record["state"] in policy.TERMINAL:
        return changes
    if job is None:
        if time.time() - current["submitted_at"] < 60:
            return changes  # submitted a moment ago: Ray's list may not show it yet
        job = {"status": "FAILED", "message": "the Ray head no longer knows this job (it restarted?)",
               "error_type": "JOB_SUPERVISOR_ACTOR_DIED", "submission_id": current["submission_id"]}
    status = job["status"]
    recipe = site.env.recipes.get(record["recipe"])
    runner = recipe.runner if recipe else "trl"
    text = None
    if status != "PENDING" and job.get("start_time"):
        text = _update_progress(site, record, current, job, runner)
    if status == current["state"]:
        return changes
    if status in policy.TERMINAL and text:
        site.records.save_log(record["run"], current["attempt"], text)
    current["state"] = status
    changes.append({"attempt": current["attempt"], "state": status})
    record["history"].append({"at": time.time(), "attempt": current["attempt"], "state": status})
    record["state"] = status
    if status in ("FAILED", "STOPPED"):
        current["ended_at"] = (job.get("end_time") or time.time() * 1000) / 1000
        if status == "FAILED" and not nodes:
            nodes.extend(site.ray.nodes())
        kind = policy.failure_kind(job, nodes)
        current["failure"] = {"kind": kind, "error_type": job.get("error_type"),
                              "message": (job.get("message") or "")[-500:]}
        budget = recipe.resume_budget if recipe else 0
        if recipe and policy.resubmittable(record, kind, budget):
            number = current["attempt"] + 1
            request = site.request(record["recipe"], record["run"], record["settings"], record["requested_by"], number)
            site.ray.submit_once(request)
            record["attempts"].append(records.attempt(number, request.submission_id, time.time()))
            record["state"] = "PENDING"
            record["history"].append({"at": time.time(), "attempt": number, "state": "RESUBMITTED"})
            changes.append({"attempt": number, "state": "RESUBMITTED", "reason": kind})
            emit("INFO", "run resubmitted after its nodes went away", run=record["run"], attempt=number,
                 submission_id=request.submission_id)
        elif kind == "node-lost":
            changes[-1]["reason"] = f"node lost, resume budget of {budget} spent"
    elif status == "SUCCEEDED":
        current["ended_at"] = (job.get("end_time") or time.time() * 1000) / 1000
    return changes


def _update_progress(site: Site, record: dict, current: dict, job: dict, runner: str) -> str:
    """Step, reward and checkpoint from the job's output and its checkpoint directory; the output.

    A long run's output is megabytes: once what its beginning says is known (the first step, a
    resume), a tick reads only its end. The whole output is read at the end, to be kept.
    """
    whole = (job["status"] in policy.TERMINAL or not job.get("driver_node_id")
             or (runner == "trl" and current.get("first_step") is None))
    try:
        text = (site.ray.logs(job["submission_id"]) if whole
                else site.ray.tail(job["submission_id"], job["driver_node_id"], TAIL_LINES))
    except RuntimeError as error:  # the driver's node is gone, and its logs with it
        emit("INFO", "job logs unavailable", submission_id=job["submission_id"], error=str(error)[-200:])
        text = ""
    found = progress.from_logs(runner, text, current.get("epoch", 1))
    points = progress.series(runner, text, current.get("epoch", 1))
    if points["steps"] or points["saves"]:
        site.records.add_metrics(record["run"], current["attempt"], points)
    if found.get("epoch"):
        current["epoch"] = found["epoch"]
    if whole:
        for key in ("first_step", "resumed_from"):
            if found[key] is not None:
                current[key] = found[key]
    if found["step"] is not None:
        record["step"], record["reward"] = found["step"], found["reward"]
    directory = Path(record["checkpoint_dir"])
    if site.checkpoints_here and directory.is_dir():  # look at the checkpoints themselves
        record["last_checkpoint"] = progress.last_complete_checkpoint(directory)
    elif not site.checkpoints_here and record.get("manifests"):  # what the snapshot scan found complete
        record["last_checkpoint"] = max(map(int, record["manifests"]))
    elif runner == "trl" and found["reported_checkpoint"] is not None:  # printed once the save is done
        record["last_checkpoint"] = found["reported_checkpoint"]
    return text
