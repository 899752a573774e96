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
"""

import itertools
import time

from fakes.kuberay import GROUP_LABEL, NODE_TYPE_LABEL

SCHEDULER, AUTOSCALER = "default-scheduler", "cluster-autoscaler"
_uids = itertools.count(1)


class Scheduling:
    """The GPU nodes the cloud has given, and what the autoscaler says of the rest. Set by tests."""

    def __init__(self, gpu_nodes: int | None):
        self.gpu_nodes = gpu_nodes          # None: every worker gets a node; a number: that many at most
        self.scale_up_refused: str | None = None  # the autoscaler's reason for not trying (NotTriggerScaleUp)
        self.scale_up_failed: str | None = None   # the cloud's reason a scale-up failed (FailedScaleUp)
        self.zone = "us-central1-b"
        self.installer_missing: set[str] = set()  # GPU nodes whose NCCL gIB installer has not run yet

    def place(self, objects: dict) -> None:
        """Each pod's node and status, and the events of those that do not run."""
        workers = sorted(key for key, pod in objects.items()
                         if key[0] == "pods" and pod["metadata"]["labels"][NODE_TYPE_LABEL] == "worker")
        placed = workers if self.gpu_nodes is None else workers[:self.gpu_nodes]
        nodes = {key: f"gke-gpu-node-{index}" for index, key in enumerate(placed)}
        for key, pod in list(objects.items()):
            if key[0] != "pods":
                continue
            if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "head":
                pod["spec"]["nodeName"] = "gke-system-node-0"
                pod["status"] = _running()
            elif key in nodes:
                pod["spec"]["nodeName"] = nodes[key]
                pod["status"] = _initializing() if nodes[key] in self.installer_missing else _running()
            else:
                self._unschedulable(objects, key, pod, len(nodes) + 1)

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


def _record(objects: dict, key: tuple, pod: dict, kind: str, reason: str, source: str, message: str) -> None:
    """An event about the pod, aggregated with an identical earlier one (its count grows)."""
    namespace, name = key[1], key[2]
    for event_key, event in objects.items():
        if event_key[0] == "events" and event["involvedObject"]["uid"] == pod["metadata"]["uid"] \
                and event["reason"] == reason and event["message"] == message:
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
        "firstTimestamp": _now(), "lastTimestamp": _now()}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
