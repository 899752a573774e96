"""The composition root: the one place that wires an environment, local or on GKE, to what its runs use.

A `Site` is an environment's Ray head, state bucket (run records, pool state, lock), events topic
and GPU pool scaler. The functions (`runs/train.py`, `runs/watch.py`, `runs/snapshot.py`,
`reaper/reap.py`) and the CLI get one from `open_site` and never ask which kind of environment it is.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.cloud import storage

from rlops import environments, paths
from rlops import waiting as workers_waiting
from rlops.clock import SYSTEM, Clock
from rlops.cloud import pubsub
from rlops.cloud.ray_jobs import RayJobs
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.local.stack import LOCAL_PROJECT, Stack, lustre_directory
from rlops.logs import emit
from rlops.spec.load import load
from rlops.spec.model import GcpEnvironment, LocalEnvironment
from rlops.state.bucket import client, of_environment
from rlops.state.lock import Lock
from rlops.state.pool import PoolState
from rlops.state.resources import ResourceRecord
from rlops.state.run_records import RunRecords


class UnknownEnvironment(Failure):
    """A message or tick names an environment that is not deployed, or whose spec does not validate."""


@dataclass
class Site:
    """One environment's runs: its spec, its Ray head, its state bucket and its events topic."""

    name: str
    env: LocalEnvironment | GcpEnvironment
    endpoints: Endpoints  # a local environment's with its emulators
    ray: RayJobs
    bucket: storage.Bucket
    publish: Callable[[dict[str, Any]], None]
    scale: Callable[[bool], None]  # scale(down): the GPU pool down to zero, or back to the spec's sizes
    # waiting(pool_scaled_down): why the GPU workers are not all up, in one line; None when they are
    waiting: Callable[[bool], str | None]
    lustre_root: str
    entrypoint_resources: dict[str, float]
    checkpoints_here: bool  # /lustre is a directory of this machine (local), not only of the cluster (GKE)
    # wake_phases(wakes): {wake time: its phases so far}, as the cloud reports them (rlops.waiting), read once
    wake_phases: Callable[[list[float]], dict[float, list[tuple[str, float, float]]]] | None = None
    clock: Clock = SYSTEM  # what every decision of the functions reads the time from and waits on

    @property
    def records(self) -> RunRecords:
        return RunRecords(self.bucket, self.env.state.prefix, self.name, self.clock)

    @property
    def pool(self) -> PoolState:
        return PoolState(self.bucket, self.env.state.prefix, self.name)

    def lock(self, operation: str) -> Lock:
        return Lock(self.bucket, self.env.state.prefix, self.name, operation=operation, clock=self.clock)


def load_environment(name: str) -> LocalEnvironment | GcpEnvironment:
    """The spec of environment NAME from the environments directory."""
    try:  # a tick's message names it: data, confined to the environments directory
        path = paths.within(environments.directory(), f"{name}.yaml", "environment")
    except paths.OutsideDirectory as refused:
        raise UnknownEnvironment(f"environment: {refused}") from None
    if not path.is_file():
        raise UnknownEnvironment(f"environment: no environment {name!r} (no {path.name} among the deployed specs)")
    loaded = load(path)
    if loaded.environment is None:
        raise UnknownEnvironment(f"environment: the spec of {name} does not validate: {loaded.problems[0]}")
    return loaded.environment


def ticked_environments(wanted: str | None, what: str, endpoints: Endpoints, own_project: str | None) -> \
        list[tuple[str, LocalEnvironment | GcpEnvironment]]:
    """(name, spec) of the environments a `what` tick covers: the one it names, or else every deployed GCP
    environment that has cloud resources. A spec that does not load is logged and left out.

    A local environment is ticked by its own scheduler (`rlops up`), one in another project than
    `own_project` (the deployment's) by that project's deployment, and a spec that was never applied
    (an example) or was destroyed has no Ray to watch: ticking those would log an error every minute.
    """
    ticked = []
    for name in [wanted] if wanted else environments.known_names():
        try:
            env = load_environment(name)
        except UnknownEnvironment as unknown:
            emit("WARNING", f"{what} tick for an unknown environment", reason=str(unknown))
            continue
        if wanted or _has_cloud_resources(name, env, endpoints, own_project):
            ticked.append((name, env))
    return ticked


def _has_cloud_resources(name: str, env: LocalEnvironment | GcpEnvironment, endpoints: Endpoints,
                         own_project: str | None) -> bool:
    if isinstance(env, LocalEnvironment):
        return False
    if own_project and env.project.id != own_project:
        emit("INFO", "tick skips an environment of another project", environment=name, project=env.project.id)
        return False
    try:
        resources = ResourceRecord(of_environment(env, endpoints), env.state.prefix, name).load()
    except Exception:  # an unreadable bucket is the tick's to report, with the environment's name
        return True
    if not resources.resources:
        emit("INFO", "tick skips an environment with no cloud resources (never applied, or destroyed)",
             environment=name)
    return bool(resources.resources)


def placement(env: LocalEnvironment | GcpEnvironment) -> tuple[str, dict[str, float]]:
    """Where /lustre is for this environment's jobs, and the Ray resources a run's driver asks for."""
    if isinstance(env, LocalEnvironment):
        return str(lustre_directory(env)), {env.local.gpu_pool.resource: 1}
    return "/lustre", {}


def open_site(name: str, env: LocalEnvironment | GcpEnvironment, endpoints: Endpoints) -> Site:
    if isinstance(env, LocalEnvironment):
        stack = Stack(name, env, lambda line: emit("INFO", line))
        endpoints = stack.endpoints(endpoints)
        ray, project = RayJobs(stack.dashboard_url()), LOCAL_PROJECT
        scale = lambda down: stack.stop_pool() if down else stack.start_pool()  # noqa: E731
        waiting = lambda scaled_down: workers_waiting.on_local(ray.nodes(), scaled_down, stack.joining())  # noqa: E731
        def phases(wakes: list[float]) -> dict[float, list[tuple[str, float, float]]]:
            starts = stack.pool_starts()
            return {at: workers_waiting.local_phases(at, env.woken_workers, starts) for at in wakes}
        publish = _publisher(project, endpoints, emulated=True)
    else:
        from rlops.kube.gke_cluster import GkeCluster  # noqa: PLC0415 cold start: Kubernetes' and GKE's clients
        from rlops.provision.service import target_of  # noqa: PLC0415 cold start: the Google API clients

        gke = GkeCluster(target_of(name, env), env, endpoints)
        ray, project, scale, waiting = RayJobs(*gke.dashboard()), env.project.id, gke.scale, gke.waiting
        phases = gke.wake_phases
        publish = _publisher(project, endpoints, emulated=False)
    lustre, resources = placement(env)
    return Site(name, env, endpoints, ray, state_bucket(name, env, endpoints), publish, scale, waiting, lustre,
                resources, checkpoints_here=isinstance(env, LocalEnvironment), wake_phases=phases)


def state_bucket(name: str, env: LocalEnvironment | GcpEnvironment, endpoints: Endpoints) -> storage.Bucket:
    """The environment's state bucket, as its functions reach it: a local environment's in its stack's storage
    emulator, which must be running (anywhere else would be a real bucket of the same name)."""
    if isinstance(env, GcpEnvironment):
        return client(env.project.id, endpoints).bucket(env.state.bucket)
    stack = Stack(name, env, lambda line: emit("INFO", line))
    if "storage" not in stack.processes():
        raise Failure(f"the local environment {name} is not up; run `rlops up {name}`")
    return client(LOCAL_PROJECT, stack.endpoints(endpoints)).bucket(env.state.bucket)


def run_records(name: str, env: LocalEnvironment | GcpEnvironment, endpoints: Endpoints) -> RunRecords:
    """The environment's run records alone, for what needs neither its Ray head nor its cluster."""
    return RunRecords(state_bucket(name, env, endpoints), env.state.prefix, name)


def _publisher(project: str, endpoints: Endpoints, emulated: bool) -> Callable[[dict[str, Any]], None]:
    def publish(event: dict[str, Any]) -> None:
        if emulated and not endpoints.pubsub:
            emit("INFO", "event (no Pub/Sub emulator to publish it to)", event=event)
            return
        pubsub.publish(endpoints, project, pubsub.EVENTS_TOPIC, event, type=event["type"])

    return publish
