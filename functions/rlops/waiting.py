"""Why a run's GPU workers are not up, in one line, from what the environment reports. Pure.

Locally the GPU pool is one Ray worker process; on GKE it is the RayCluster's worker pods, which wait on
the scheduler, the cluster autoscaler, the node pool, its reservation and, once on a node, the NCCL gIB
installer. Each says something different; the most specific one that applies is the cause.
"""

import time
from dataclasses import dataclass, field

REAPED = "the reaper scaled the GPU pool down and no train message has woken it yet"
# The events the scheduler and the autoscaler write about a waiting pod, most telling first: a cloud refusal
# names its reason, a refused scale-up names the autoscaler's, a triggered one says nodes are on their way.
EVENT_ORDER = ("FailedScaleUp", "NotTriggerScaleUp", "TriggeredScaleUp", "FailedScheduling")
NCCL_INIT_CONTAINER = "wait-for-gib"  # kube/manifests/worker-rdma.yaml
# The labels KubeRay puts on every pod it makes (ray-operator utils/constant.go).
NODE_TYPE_LABEL, GROUP_LABEL = "ray.io/node-type", "ray.io/group"


def on_local(nodes: list[dict], pool_scaled_down: bool, joining: dict[str, float] | None = None) -> str | None:
    """A local run waits when no GPU-pool node (a non-head Ray node) is alive. `joining`: the GPU-pool workers
    started but told to join later (`local.gpu_pool.join_delay`), with when they join."""
    if any(node["state"] == "ALIVE" and not node.get("is_head_node") for node in nodes):
        return None
    if pool_scaled_down:
        return f"no GPU-pool node: {REAPED}"
    if joining:
        name, at = min(joining.items(), key=lambda item: item[1])
        return f"no GPU-pool node is up: {name} was started and joins Ray at about {_clock(at)} (local.gpu_pool.join_delay)"
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


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


@dataclass
class GkeWorkers:
    """What GKE and Kubernetes say of an environment's GPU workers, read at one tick."""

    wanted: dict[str, int]                  # GPU pool (the worker group) -> Ray worker pods the spec asks for
    pods: list[dict]                        # the RayCluster's worker pods, as the API server has them
    events: list[dict] = field(default_factory=list)          # events about those pods
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
    return line + "; ".join(_pool_cause(workers, pool, count, groups.get(pool, [])) for pool, count in sorted(short.items()))


def _pool_cause(workers: GkeWorkers, pool: str, short: int, pods: list[dict]) -> str:
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


def _groups(pods: list[dict]) -> dict[str, list[dict]]:
    """The pods of each worker group (a group is named after its GPU pool: kube/render.py)."""
    groups: dict[str, list[dict]] = {}
    for pod in pods:
        groups.setdefault(pod["metadata"].get("labels", {}).get(GROUP_LABEL, ""), []).append(pod)
    return groups


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))


def _in_init(pod: dict, container: str) -> bool:
    return any(s.get("name") == container and "running" in (s.get("state") or {})
               for s in (pod.get("status") or {}).get("initContainerStatuses", []))
