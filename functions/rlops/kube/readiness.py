"""Whether what rlops applied is ready, from what the cluster says of it (no I/O): a DaemonSet's status, and a
RayCluster's pods, each carrying the digest of the template it was made from.

Nothing here reads the RayCluster's `status.observedGeneration`: KubeRay writes its status only when a field other
than it and lastUpdateTime changed (`InconsistentRayClusterStatus`, ray-operator/controllers/ray/utils/
consistency.go, v1.1-v1.7), so a change that moves no pod moves no status. What rlops reads instead is what every
version writes: the pods, each carrying its template's digest (render.TEMPLATE_DIGEST), their phases and Ready
conditions. Readiness counts only pods made from the current template, whatever KubeRay's version: its head pod
Running and Ready, and per worker group at least the pool's min_nodes worker pods Running and Ready
(`availableWorkerReplicas` counts Running pods, not Ready ones; KubeRay 1.1-1.2's `state: ready` waits for every
desired worker, Spot ones included).
"""

from dataclasses import dataclass

from rlops.kube.objects import Manifest, spec_of
from rlops.kube.render import TEMPLATE_DIGEST

RAY_CLUSTER_LABEL = "ray.io/cluster"  # on every pod KubeRay makes (ray-operator utils/constant.go)
RAY_NODE_TYPE_LABEL = "ray.io/node-type"  # "head" or "worker", likewise
RAY_GROUP_LABEL = "ray.io/group"  # the worker group's name (utils/constant.go RayNodeGroupLabelKey)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    what: str


def template_digest_of(ray_cluster: Manifest) -> str | None:
    """The digest a RayCluster's head template carries (None for one rlops made before it stamped one)."""
    template = spec_of(ray_cluster)["headGroupSpec"]["template"]
    return ((template.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_DIGEST)


def annotation(obj: Manifest | None, key: str) -> str | None:
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(key)


def pods_behind(ray_cluster: Manifest, pods: list[Manifest]) -> list[str]:
    """The names of the pods (not on their way out) not made from the RayCluster's current template."""
    digest = template_digest_of(ray_cluster)
    if digest is None:
        return []
    return sorted(pod["metadata"]["name"] for pod in pods if not pod["metadata"].get("deletionTimestamp")
                  and annotation(pod, TEMPLATE_DIGEST) != digest)


def readiness_of(live: Manifest) -> Readiness:
    """A DaemonSet's, from what its controller publishes about the current generation (it writes
    `observedGeneration` with every status: pkg/controller/daemon); a status about an older generation says
    nothing about this one. A RayCluster's: `ray_cluster_readiness`."""
    status = live.get("status") or {}
    generation = live.get("metadata", {}).get("generation")
    if status.get("observedGeneration") is None or (generation and status["observedGeneration"] < generation):
        return Readiness(False, f"the controller has not seen generation {generation} yet")
    wanted = status.get("desiredNumberScheduled", 0)
    updated, ready = status.get("updatedNumberScheduled", 0), status.get("numberReady", 0)
    return Readiness(updated >= wanted and ready >= wanted,
                     f"{min(updated, ready)} of {wanted} nodes installed with the current template")


def pods_current(ray_cluster: Manifest, pods: list[Manifest]) -> Readiness:
    """Whether every pod of the cluster (not on its way out) was made from its current template: KubeRay
    does not replace running pods unless told to (`kube.sync`)."""
    live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
    old = pods_behind(ray_cluster, live)
    if not old:
        return Readiness(True, f"{len(live)} pods on the current template")
    return Readiness(False, f"{len(old)} of {len(live)} pods still run an older template ({', '.join(old)})")


def _pod_ready(pod: Manifest) -> bool:
    """Running with the condition Ready=True (KubeRay's own IsRunningAndReady, utils/util.go)."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))


def _pod_state(pod: Manifest) -> str:
    status = pod.get("status") or {}
    phase = status.get("phase") or "not started"
    failing = [c for c in status.get("conditions", []) if c.get("status") == "False" and c.get("reason")]
    if phase == "Running" and not _pod_ready(pod):
        return "Running, not Ready" + (f" ({failing[-1]['reason']})" if failing else "")
    return phase + (f" ({failing[0]['reason']})" if failing else "")


def ray_cluster_readiness(live: Manifest, pods: list[Manifest], min_workers: dict[str, int]) -> Readiness:
    """From the pods, the same on every KubeRay version: the head pod on the current template Running and Ready,
    and per worker group at least min(replicas, min_workers) x numOfHosts workers on it Running and Ready. Not
    `state` (1.1-1.2: ready only once every desired worker runs) nor `readyWorkerReplicas` or
    `availableWorkerReplicas` (omitempty, written only with another change of status, and "available" counts
    Running pods, not Ready ones). What KubeRay says of a failing reconcile (its ReplicaFailure condition, from
    v1.3) is the cause given while the head is missing."""
    digest = template_digest_of(live)
    pods = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
    current = [pod for pod in pods if digest is None or annotation(pod, TEMPLATE_DIGEST) == digest]
    heads = [pod for pod in current if pod["metadata"]["labels"].get(RAY_NODE_TYPE_LABEL) == "head"]
    if heads and _pod_ready(heads[0]):
        head = "head ready"
    elif heads:
        head = f"head pod {heads[0]['metadata']['name']} {_pod_state(heads[0])}"
    else:
        failures = [c for c in (live.get("status") or {}).get("conditions", [])
                    if c.get("type") == "ReplicaFailure" and c.get("status") == "True"]
        head = "no head pod on the current template" + (
            f" (KubeRay: {failures[0].get('reason')}: {failures[0].get('message', '')})" if failures else "")
    desired = needed = ready_total = 0
    short, unready = [], 0
    for group in live.get("spec", {}).get("workerGroupSpecs", []):
        hosts, replicas = group.get("numOfHosts", 1), group.get("replicas", 0)
        want = min(replicas, min_workers.get(group["groupName"], replicas)) * hosts
        mine = [pod for pod in current if pod["metadata"]["labels"].get(RAY_NODE_TYPE_LABEL) == "worker"
                and pod["metadata"]["labels"].get(RAY_GROUP_LABEL) == group["groupName"]]
        ready = sum(1 for pod in mine if _pod_ready(pod))
        unready += sum(1 for pod in mine if (pod.get("status") or {}).get("phase") == "Running" and not _pod_ready(pod))
        desired, needed, ready_total = desired + replicas * hosts, needed + want, ready_total + ready
        if ready < want:
            short.append(group["groupName"])
    what = f"{head}, {ready_total} of {desired} workers ready, {needed} needed"
    if unready:
        what += f" ({unready} running, not Ready yet)"
    old = pods_behind(live, pods)
    what += f"; {len(pods) - len(old)} pods on the current template" + (
        f", {len(old)} on an older one ({', '.join(old)})" if old else "")
    return Readiness(head == "head ready" and not short and not old, what)
