"""Why a run's GPU workers are not up, in one line, from what the environment reports. Pure.

Locally the GPU pool is one Ray worker process; on GKE it is the RayCluster's worker pods, which wait on
the scheduler, the cluster autoscaler, the node pool, its reservation and, once on a node, the NCCL gIB
installer. Each says something different; the most specific one that applies is the cause.
"""

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeGuard

REAPED = "the reaper scaled the GPU pool down and no train message has woken it yet"
# The events the scheduler and the autoscaler write about a waiting pod, most telling first: a cloud refusal
# names its reason, a refused scale-up names the autoscaler's, a triggered one says nodes are on their way.
EVENT_ORDER = ("FailedScaleUp", "NotTriggerScaleUp", "TriggeredScaleUp", "FailedScheduling")
NCCL_INIT_CONTAINER = "wait-for-gib"  # kube/manifests/worker-rdma.yaml
# The labels KubeRay puts on every pod it makes (ray-operator utils/constant.go).
NODE_TYPE_LABEL, GROUP_LABEL = "ray.io/node-type", "ray.io/group"
# A Kubernetes object or a Ray node as its API gives it, read only (kube.objects.Manifest is one).
Json = Mapping[str, Any]


def on_local(nodes: Sequence[Json], pool_scaled_down: bool, joining: dict[str, float] | None = None) -> str | None:
    """A local run waits when no GPU-pool node (a non-head Ray node) is alive. `joining`: the GPU-pool workers
    started but told to join later (`local.gpu_pool.join_delay`), with when they join."""
    if any(node["state"] == "ALIVE" and not node.get("is_head_node") for node in nodes):
        return None
    if pool_scaled_down:
        return f"no GPU-pool node: {REAPED}"
    if joining:
        name, at = min(joining.items(), key=lambda item: item[1])
        return (f"no GPU-pool node is up: {name} was started and joins Ray at about {_clock(at)} "
                "(local.gpu_pool.join_delay)")
    return "no GPU-pool node is up (stopped, or lost): `rlops up` starts it again"


def in_gate(line: dict | None) -> str | None:
    """What an attempt's checkpoint gate says it waits for (its last `[rlops-wait]` line: `checkpoints.gate.waits`);
    None when it said none or is done waiting."""
    if line is None or "got" in line:
        return None
    if "backoff" in line:
        return f"the attempt's gate backs off until {_clock(line['until'])}: the GPUs did not come for the one before"
    return (f"the attempt's gate waits for {line['need']:g} {line['resource']} (Ray has {line['have']:g}) until "
            f"{_clock(line['until'])}, then the attempt is retried")


def queued_behind(runs: list[str]) -> str:
    """Why Ray holds a job PENDING while the GPU workers are up: other runs' jobs have their resources."""
    return (f"queued: Ray starts this job when the GPU pool's resources are free; now running: {', '.join(runs)} "
            "(`rlops cancel` one to make room)")


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


@dataclass
class GkeWorkers:
    """What GKE and Kubernetes say of an environment's GPU workers, read at one tick."""

    wanted: dict[str, int]                  # GPU pool (the worker group) -> Ray worker pods the spec asks for
    pods: Sequence[Json]                        # the RayCluster's worker pods, as the API server has them
    events: Sequence[Json] = field(default_factory=list)          # events about those pods
    pool_problems: dict[str, str] = field(default_factory=dict)  # pool -> what GKE says is wrong with it
    reservations: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # pool -> (name, unused, count)
    pool_scaled_down: bool = False


def missing(workers: GkeWorkers) -> dict[str, int]:
    """GPU pool -> how many of the worker pods the spec asks for are not running and ready; only pools short."""
    groups = _groups(workers.pods)
    short = {pool: wanted - sum(map(_ready, groups.get(pool, []))) for pool, wanted in workers.wanted.items()}
    return {pool: count for pool, count in short.items() if count > 0}


def on_gke(workers: GkeWorkers) -> str | None:
    """'N of M GPU nodes not up: CAUSE', None when every worker the spec asks for runs and is ready."""
    short, groups = missing(workers), _groups(workers.pods)
    if not short:
        return None
    line = f"{sum(short.values())} of {sum(workers.wanted.values())} GPU nodes not up: "
    if workers.pool_scaled_down:
        return line + REAPED
    return line + "; ".join(_pool_cause(workers, pool, count, groups.get(pool, []))
                            for pool, count in sorted(short.items()))


def _pool_cause(workers: GkeWorkers, pool: str, short: int, pods: Sequence[Json]) -> str:
    if pool in workers.reservations:
        name, unused, count = workers.reservations[pool]
        if unused < short:
            return f"reservation {name} has {unused} unused of {count}"
    if pool in workers.pool_problems:
        return f"node pool {pool}: {workers.pool_problems[pool]}"
    causes = []
    installing = sorted({pod["spec"].get("nodeName", "?") for pod in pods if _in_init(pod, NCCL_INIT_CONTAINER)})
    if installing:
        causes.append(f"the NCCL gIB installer has not run on {', '.join(installing)} (the nccl-rdma-installer "
                      "DaemonSet)")
    waiting = {pod["metadata"]["name"] for pod in pods if not _ready(pod) and not _in_init(pod, NCCL_INIT_CONTAINER)}
    said = [event for event in workers.events
            if event.get("involvedObject", {}).get("name") in waiting and event.get("reason") in EVENT_ORDER]
    if said:
        rank = min(EVENT_ORDER.index(event["reason"]) for event in said)
        # Among events of the same reason the latest (RFC 3339 UTC timestamps sort as text).
        best = max((e for e in said if e["reason"] == EVENT_ORDER[rank]), key=lambda e: e.get("lastTimestamp") or "")
        causes.append(f"{best['reason']}: {best['message']}")
    if len(pods) < workers.wanted[pool]:
        causes.append(f"KubeRay has made {len(pods)} of {workers.wanted[pool]} worker pods (the RayCluster's "
                      "replicas)")
    return "; ".join(causes) or "worker pods starting (the image pull, then Ray joins)"


def _groups(pods: Sequence[Json]) -> dict[str, list[Json]]:
    """The pods of each worker group (a group is named after its GPU pool: kube/render.py)."""
    groups: dict[str, list[Json]] = {}
    for pod in pods:
        groups.setdefault(pod["metadata"].get("labels", {}).get(GROUP_LABEL, ""), []).append(pod)
    return groups


def _ready(pod: Json) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))


def _in_init(pod: Json, container: str) -> bool:
    return any(s.get("name") == container and "running" in (s.get("state") or {})
               for s in (pod.get("status") or {}).get("initContainerStatuses", []))


# The phases of a wake, in the order a wake goes through them, each ending when the last GPU node or worker pod the
# wake brings back is through it (as the last one joining Ray ends the wake's billing: rlops.costs). On GKE: the node
# pools' resize operation (start to end), the VM's boot (to its Node object's creationTimestamp), the node's Ready
# condition, the worker pod's PodScheduled condition, the image pull (the kubelet's `Pulled` event, its start
# that event less the pull's own duration in its message), the container's start (state.running.startedAt);
# locally the GPU-pool worker process's start. Then everywhere Ray's join (the node's start time in Ray's node
# table) and the job's first step (the run record's `first_step_at`).
GKE_PHASES = ("resize", "boot", "node-ready", "scheduling", "image-pull", "container-start")
LOCAL_PHASES = ("worker-start",)
LATER_PHASES = ("ray-join", "first-step")
WORKER_CONTAINER = "ray-worker"  # kube/manifests: the worker pods' Ray container
# The kubelet's events about an image (pkg/kubelet/images/image_manager.go, v1.33): `Pulled` with "Successfully
# pulled image "X" in 1m2.345s (1m2.4s including waiting). Image size: N bytes." after a pull, or "Container
# image "X" already present on machine" when none was needed; the first duration is the pull's own.
_PULLED = re.compile(r'Successfully pulled image "[^"]*" in ([0-9.hmµun]+s)')
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration(text: str) -> float:
    """Seconds of a Go `time.Duration.String()`: 1m2.345s, 45.1s, 350ms, 1h0m2s."""
    parts = re.findall(r"([0-9.]+)(h|ms|us|µs|ns|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def rfc3339(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gke_phases(at: float, wanted: int, resizes: list[tuple[float, float | None]], nodes: Sequence[Json],
               pods: Sequence[Json], events: Sequence[Json]) -> list[tuple[str, float, float]]:
    """A GKE wake at `at` phase by phase, as far as it got: (phase, start, end) of GKE_PHASES.

    A phase ends when the last of the `wanted` workers the wake brings back has passed it: Ray's job waits for all
    its GPUs (NeMo RL's virtual cluster counts them), so the slowest node is the wake's length. `resizes`: the GPU
    node pools' resize operations (start, end or None while running); `nodes`: the GPU pools' Node objects; `pods`:
    the RayCluster's worker pods; `events`: the events about them. Only what started at or after the wake counts
    (timestamps are whole seconds: a second's grace)."""

    def after(t: float | None) -> TypeGuard[float]:
        return t is not None and t >= at - 1

    wanted = max(1, wanted)
    mine = [pod for pod in pods if after(rfc3339(pod["metadata"].get("creationTimestamp")))]
    names = {pod["metadata"]["name"] for pod in mine}
    pulls: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        found = _PULLED.search(event.get("message") or "") if event.get("reason") == "Pulled" else None
        end = rfc3339(event.get("firstTimestamp") or event.get("eventTime"))
        pod = event.get("involvedObject", {}).get("name")
        if found and pod in names and after(end):
            pulls.setdefault(pod, []).append((end - go_duration(found.group(1)), end))

    def last(times: Iterable[float | None]) -> float | None:
        """When the `wanted`-th worker got there; None while fewer have."""
        reached = sorted(t for t in times if after(t))
        return reached[wanted - 1] if len(reached) >= wanted else None

    mine_resized = [(start, end) for start, end in resizes if after(start)]
    resized = [end for _, end in mine_resized if end is not None]
    ends = {
        "resize": max(resized) if mine_resized and len(resized) == len(mine_resized) else None,
        "boot": last(rfc3339(node["metadata"].get("creationTimestamp")) for node in nodes),
        "node-ready": last(rfc3339(c.get("lastTransitionTime")) for node in nodes
                           for c in (node.get("status") or {}).get("conditions", [])
                           if c.get("type") == "Ready" and c.get("status") == "True"),
        "scheduling": last(_condition(pod, "PodScheduled") for pod in mine),
        "image-pull": last(max(end for _, end in pulled) for pulled in pulls.values()),
        "container-start": last(_started(pod) for pod in mine),
    }
    # The slowest pod's pull: from its own start (the pull's duration in the kubelet's message) to its end.
    slowest_pull = next((min(start for start, _ in pulled) for pulled in pulls.values()
                         if max(end for _, end in pulled) == ends["image-pull"]), None)
    starts = {"resize": min((start for start, _ in mine_resized), default=None), "image-pull": slowest_pull}
    return chain(at, [(phase, starts.get(phase), ends[phase]) for phase in GKE_PHASES])


def chain(at: float, milestones: list[tuple[str, float | None, float | None]]) -> list[tuple[str, float, float]]:
    """(phase, start, end) for each phase reached, in order: one not seen is left out when a later one was seen (a
    resize with `[ray-workers]` only, an image already on the node), and ends the chain when none later was. A
    phase starts when it says it did, else when the one before it ended."""
    reached = max((i for i, (_, _, end) in enumerate(milestones) if end is not None), default=-1)
    phases, last = [], at
    for phase, start, end in milestones[:reached + 1]:
        if end is None:
            continue
        begin = min(max(start if start is not None else last, at), end)
        phases.append((phase, begin, end))
        last = max(last, end)
    return phases


def local_phases(at: float, wanted: int, worker_starts: list[float]) -> list[tuple[str, float, float]]:
    """A local wake: until the last of its `wanted` GPU-pool worker processes started after it."""
    started, wanted = sorted(t for t in worker_starts if t >= at - 1), max(1, wanted)
    return chain(at, [("worker-start", None, started[wanted - 1] if len(started) >= wanted else None)])


def wake_line(at: float, phases: list[tuple[str, float, float]], now: float, order: tuple[str, ...]) -> str:
    """'waking for 4 min 10 s: image-pull for 1 min 05 s so far (resize 1 min 30 s, boot 40 s, ...)'."""
    done = [phase for phase, _, _ in phases]
    ahead = [phase for phase in order if phase not in done and (not done or order.index(phase) > order.index(done[-1]))]
    since = max((end for _, _, end in phases), default=at)
    current = ahead[0] if ahead else "the job's first step"
    measured = ", ".join(f"{phase} {_span(end - start)}" for phase, start, end in phases)
    return (f"waking for {_span(now - at)}: {current} for {_span(now - since)} so far"
            + (f" ({measured})" if measured else ""))


def _span(seconds: float) -> str:
    minutes, rest = divmod(max(0, round(seconds)), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _condition(obj: Json, kind: str) -> float | None:
    return next((rfc3339(c.get("lastTransitionTime")) for c in (obj.get("status") or {}).get("conditions", [])
                 if c.get("type") == kind and c.get("status") == "True"), None)


def _started(pod: Json) -> float | None:
    """When the Ray container started (its running state), else when the pod's containers were all ready."""
    for status in (pod.get("status") or {}).get("containerStatuses", []):
        running = (status.get("state") or {}).get("running")
        if status.get("name") == WORKER_CONTAINER and running:
            return rfc3339(running.get("startedAt"))
    return _condition(pod, "ContainersReady")
