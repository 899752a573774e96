"""What the scheduler, the kubelet and GKE's cluster autoscaler make of the fake KubeRay's pods: where each
runs, its status, and the events a person reads with `kubectl describe pod`.

Each rule, from the component's own code (kubernetes v1.33, kubernetes/autoscaler cluster-autoscaler 1.33):
- A pod that fits no node stays Pending with the condition PodScheduled=False, reason Unschedulable, and the
  scheduler records a Warning `FailedScheduling` event whose message is FitError.Error()
  (pkg/scheduler/framework/types.go): "0/N nodes are available: " and each filter's reason with the count
  of nodes it rejected, sorted, e.g. "2 node(s) didn't match Pod's node affinity/selector" (the NodeAffinity
  plugin's ErrReasonPod, pkg/scheduler/framework/plugins/nodeaffinity).
- The cluster autoscaler answers an unschedulable pod with one Normal event (processors/status/
  eventing_scale_up_processor.go): `TriggeredScaleUp` "pod triggered scale-up: [{GROUP CURRENT->NEW (max:
  MAX)}]", or `NotTriggerScaleUp` "pod didn't trigger scale-up: " and its reasons ("1 max node group size
  reached", "1 in backoff after failed scale-up"). GKE's autoscaler adds a Warning `FailedScaleUp` when the
  cloud refuses the nodes: "Node scale up in zones ZONE associated with this pod failed: REASON. Pod is at
  risk of not being scheduled." (GKE's cluster autoscaler visibility docs: "GCE out of resources", "GCE quota
  exceeded", "IP space exhausted").
- A scheduled pod runs its init containers first; until they end it is Pending with Initialized=False and
  the init container's state `running` (the kubelet, pkg/kubelet/status/generate.go).
- Events with the same object, reason, source and message are aggregated into one whose `count` grows
  (client-go tools/record/events_cache.go).

With `timings` set, a worker pod's way up takes time on the server's clock, and only what has happened by then
is shown: its node's Node object appears (creationTimestamp, label cloud.google.com/gke-nodepool) and turns
Ready (the Ready condition's lastTransitionTime), then the pod is scheduled (PodScheduled), the kubelet pulls
the image (a Normal `Pulling` event "Pulling image "X"", then `Pulled` "Successfully pulled image "X" in D (D
including waiting). Image size: N bytes.", D a Go duration: pkg/kubelet/images/image_manager.go, v1.33), and the
container starts (containerStatuses[].state.running.startedAt, ContainersReady). The API server stamps a pod's
creationTimestamp when it is made (ObjectMeta, pkg/registry/rest/create.go).
"""

import datetime
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fakes.kuberay import GROUP_LABEL, NODE_TYPE_LABEL

SCHEDULER, AUTOSCALER = "default-scheduler", "cluster-autoscaler"
_uids = itertools.count(1)


@dataclass
class Timings:
    """How long each part of a GPU worker's way up takes, in seconds of the fake's clock. The defaults are an A3
    Ultra-class node on GKE and the ~20 GB NeMo RL image: a GPU VM's create and boot to its Node object 2 min,
    to Ready 45 s (the GPU driver and device plugin), the image's pull 7 min from nvcr.io (~50 MB/s) and 30 s
    with image streaming from Artifact Registry (the container starts while its layers stream), the container's
    start 20 s."""

    boot: float = 120.0
    # Each further node of a resize boots this much after the one before: GKE creates them together, but they do
    # not come up together.
    node_spread: float = 0.0
    node_ready: float = 45.0
    scheduling: float = 1.0
    pull: dict[bool, float] = field(default_factory=lambda: {False: 420.0, True: 30.0})  # by image streaming
    pulls: dict[tuple[str, bool], float] = field(default_factory=dict)  # (image, streaming) -> seconds: per image
    image_bytes: int = 21_000_000_000
    container_start: float = 20.0
    # Whether a pool streams its images: its node config's gcfsConfig.enabled, as the fake GKE stores it.
    streaming: Callable[[str], bool] = lambda pool: False

    def pull_seconds(self, image: str, pool: str) -> float:
        streamed = self.streaming(pool)
        return self.pulls.get((image, streamed), self.pull[streamed])


class Scheduling:
    """The GPU nodes the cloud has given, and what the autoscaler says of the rest. Set by tests."""

    def __init__(self, gpu_nodes: int | None):
        self.gpu_nodes = gpu_nodes          # None: every worker gets a node; a number: that many at most
        self.scale_up_refused: str | None = None  # the autoscaler's reason for not trying (NotTriggerScaleUp)
        self.scale_up_failed: str | None = None   # the cloud's reason a scale-up failed (FailedScaleUp)
        self.zone = "us-central1-b"
        self.installer_missing: set[str] = set()  # GPU nodes whose NCCL gIB installer has not run yet
        self.timings: Timings | None = None  # None: a granted worker runs at once

    def place(self, objects: dict, now: float | None = None) -> None:
        """Each pod's node and status, and the events of those that do not run, as of `now` (epoch seconds)."""
        self.now = time.time() if now is None else now
        for key, pod in objects.items():
            if key[0] == "pods":
                pod["metadata"].setdefault("creationTimestamp", _at(self.now))
        workers = sorted(key for key, pod in objects.items()
                         if key[0] == "pods" and pod["metadata"]["labels"][NODE_TYPE_LABEL] == "worker")
        placed = workers if self.gpu_nodes is None else workers[:self.gpu_nodes]
        nodes = {key: f"gke-gpu-node-{index}" for index, key in enumerate(placed)}
        for key in [key for key in objects if key[0] == "nodes" and key[2] not in nodes.values()]:
            del objects[key]  # its pod is gone: the node pool shrank (the reaper's resize)
        for key, pod in list(objects.items()):
            if key[0] != "pods":
                continue
            if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "head":
                pod["spec"]["nodeName"] = "gke-system-node-0"
                pod["status"] = _running()
            elif key in nodes and self.timings is not None:
                self._come_up(objects, key, pod, nodes[key], len(nodes), placed.index(key))
            elif key in nodes:
                pod["spec"]["nodeName"] = nodes[key]
                pod["status"] = _initializing() if nodes[key] in self.installer_missing else _running()
            else:
                self._unschedulable(objects, key, pod, len(nodes) + 1)

    def _come_up(self, objects: dict, key: tuple, pod: dict, node: str, node_count: int, index: int) -> None:
        """A worker pod on its way up, by `timings`, from its creation: its node (the `index`-th), then itself."""
        t, pool = self.timings, pod["metadata"]["labels"][GROUP_LABEL]
        created = _epoch(pod["metadata"]["creationTimestamp"])
        booted = created + t.boot + index * t.node_spread
        ready = booted + t.node_ready
        scheduled = ready + t.scheduling
        image = next(c["image"] for c in pod["spec"]["containers"] if c["name"] == "ray-worker")
        pull = t.pull_seconds(image, pool)
        pulled = scheduled + pull
        started = pulled + t.container_start
        if self.now < booted:
            self._unschedulable(objects, key, pod, node_count)
            return
        objects[("nodes", "", node)] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "uid": f"node-{node}", "resourceVersion": "1", "creationTimestamp": _at(booted),
                         "labels": {"cloud.google.com/gke-nodepool": pool}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if self.now >= ready else "False",
                                       "reason": "KubeletReady" if self.now >= ready else "KubeletNotReady",
                                       "lastTransitionTime": _at(ready if self.now >= ready else booted)}]}}
        if self.now < scheduled:
            self._unschedulable(objects, key, pod, node_count)
            return
        pod["spec"]["nodeName"] = node
        _record(objects, key, pod, "Normal", "Pulling", "kubelet", f'Pulling image "{image}"', scheduled)
        if self.now < pulled:
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _at(scheduled)},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"}],
                "containerStatuses": [{"name": "ray-worker", "ready": False, "restartCount": 0, "image": image,
                                       "state": {"waiting": {"reason": "ContainerCreating"}}}]}
            return
        _record(objects, key, pod, "Normal", "Pulled", "kubelet",
                f'Successfully pulled image "{image}" in {_go(pull)} ({_go(pull)} including waiting). Image size: '
                f"{t.image_bytes} bytes.", pulled)
        if self.now < started:
            return
        pod["status"] = {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _at(scheduled)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": _at(scheduled)},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": _at(started)},
            {"type": "Ready", "status": "True", "lastTransitionTime": _at(started)}],
            "containerStatuses": [{"name": "ray-worker", "ready": True, "restartCount": 0, "image": image,
                                   "state": {"running": {"startedAt": _at(started)}}}]}

    def _unschedulable(self, objects: dict, key: tuple, pod: dict, node_count: int) -> None:
        fit_error = (f"0/{node_count} nodes are available: {node_count} node(s) didn't match Pod's node "
                     f"affinity/selector. preemption: 0/{node_count} nodes are available: {node_count} Preemption is "
                     "not helpful for scheduling.")
        pod["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": fit_error}]}
        _record(objects, key, pod, "Warning", "FailedScheduling", SCHEDULER, fit_error)
        group = pod["spec"].get("nodeSelector", {}).get("cloud.google.com/gke-nodepool",
                                                        pod["metadata"]["labels"][GROUP_LABEL])
        if self.scale_up_failed:
            _record(objects, key, pod, "Warning", "FailedScaleUp", AUTOSCALER,
                    f"Node scale up in zones {self.zone} associated with this pod failed: {self.scale_up_failed}. "
                    "Pod is at risk of not being scheduled.")
            _record(objects, key, pod, "Normal", "NotTriggerScaleUp", AUTOSCALER,
                    "pod didn't trigger scale-up: 1 in backoff after failed scale-up")
        elif self.scale_up_refused:
            _record(objects, key, pod, "Normal", "NotTriggerScaleUp", AUTOSCALER,
                    f"pod didn't trigger scale-up: {self.scale_up_refused}")
        else:
            granted = self.gpu_nodes or 0
            _record(objects, key, pod, "Normal", "TriggeredScaleUp", AUTOSCALER,
                    f"pod triggered scale-up: [{{gke-{group}-grp {granted}->{granted + 1} (max: {granted + 1})}}]")


def _running() -> dict:
    return {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True"}]}


def _initializing() -> dict:
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
         "message": "containers with incomplete status: [wait-for-gib]"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "initContainerStatuses": [{"name": "wait-for-gib", "ready": False, "restartCount": 0,
                                   "state": {"running": {"startedAt": _now()}}}]}


def _record(objects: dict, key: tuple, pod: dict, kind: str, reason: str, source: str, message: str,
            at: float | None = None) -> None:
    """An event about the pod, aggregated with an identical earlier one (its count grows); `at`: a kubelet's event,
    recorded once when it happened."""
    namespace, name = key[1], key[2]
    for event_key, event in objects.items():
        if event_key[0] == "events" and event["involvedObject"]["uid"] == pod["metadata"]["uid"] \
                and event["reason"] == reason and event["message"] == message:
            if at is None:
                event["count"] += 1
                event["lastTimestamp"] = _now()
            return
    event_name = f"{name}.{next(_uids):016x}"
    objects[("events", namespace, event_name)] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace, "resourceVersion": "1", "uid": f"event-{event_name}"},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": pod["metadata"]["uid"],
                           "apiVersion": "v1"},
        "reason": reason, "message": message, "source": {"component": source}, "type": kind, "count": 1,
        "firstTimestamp": _now() if at is None else _at(at), "lastTimestamp": _now() if at is None else _at(at)}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _at(epoch: float) -> str:
    """metav1.Time's JSON form: RFC 3339 in UTC, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _go(seconds: float) -> str:
    """A Go time.Duration's String() truncated to milliseconds, as the kubelet prints it: 7m0s, 30s, 1m2.345s."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds * 1000), 60_000)
    hours, minutes = divmod(minutes, 60)
    whole = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return (f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else "") + whole
