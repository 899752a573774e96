"""The part of KubeRay's RayCluster controller the fake API server plays: a RayCluster's pods.

Each rule is read from ray-project/kuberay, ray-operator/controllers/ray/ at v1.5.2, v1.6.0 and v1.7.0:
- `reconcilePods` (raycluster_controller.go): one head pod, and per worker group `replicas` x `numOfHosts`
  worker pods; missing pods are created from the group's *current* template, extra workers deleted.
  Pods carry the template's labels and annotations (common/pod.go DefaultHeadPodTemplate,
  DefaultWorkerPodTemplate) and the labels `ray.io/cluster`, `ray.io/node-type`, `ray.io/group`
  (utils/constant.go).
- A pod that exists is never changed when the RayCluster's template changes. Only from v1.6.0, with
  `spec.upgradeStrategy.type: Recreate`: `createHeadPod` stamps `ray.io/upgrade-strategy-recreate-hash`
  (`GenerateHashWithoutReplicasAndWorkersToDelete`, utils/util.go: the spec without replicas,
  min/maxReplicas, workersToDelete, tolerations, schedulingGates and upgradeStrategy) and
  `ray.io/kuberay-version` on the head pod, and `shouldRecreatePodsForUpgrade` deletes every pod of the
  cluster when the head pod's hash is not the spec's; they come back from the new template.
- Before v1.6.0 the CRD has no `upgradeStrategy`: the API server prunes it from what is sent
  (kube_rules.prune_unknown), so the spec never asks for a recreate.
- Pods are owned by their RayCluster and go with it (the garbage collector).
- Each pod is created through the API server's admission (kube_rules: NamespaceLifecycle, ServiceAccount).
  A refused create is not retried in that reconcile: `createHeadPod` / `createWorkerPod` record a Warning
  event on the RayCluster, `FailedToCreateHeadPod` "Failed to create head Pod NS/NAME, ERR" or
  `FailedToCreateWorkerPod` "Failed to create worker Pod for the cluster NS/CLUSTER, ERR", and
  `reconcilePods` returns the error, so the reconcile is retried later and nothing after it is created
  (a refused head: no worker either). The recorder is `raycluster-controller`; repeats of an event with
  the same object and reason are aggregated into one whose count grows (client-go tools/record
  events_cache.go; the pod's name in the message is the fake's, a real head or worker has a generated one).
The hash is the fake's own (a digest of that reduced spec), compared only with itself.
- An operator upgrade (`shouldRecreatePodsForUpgrade`, raycluster_controller.go v1.6.0 L1138-1177, v1.7.0
  L1463-1502): a head pod whose `ray.io/kuberay-version` is set and is not the running operator's gets the
  current spec's hash and the operator's version stamped on it, and nothing is recreated in that reconcile; a
  head pod without the hash (made by a KubeRay before v1.6, or without Recreate) is never recreated.

Which release is played is `kuberay` ("v1.2.2", "v1.5.2", "v1.6.0", "v1.7.0", ...); its version line decides:
- Status is written only when `InconsistentRayClusterStatus` finds State, Reason, one of the five worker
  counts, Endpoints, Head or Conditions changed (utils/consistency.go v1.5.2-v1.7.0 L16-34;
  raycluster_controller.go v1.2.2 L380-418 `inconsistentRayClusterStatus`, called by `updateRayClusterStatus`
  L1517-1528): `observedGeneration` and `lastUpdateTime`, though computed, are not written on their own.
- Every count is `omitempty` (apis/ray/v1/raycluster_types.go RayClusterStatus): a zero is absent.
- `availableWorkerReplicas` counts worker pods in phase Running, `readyWorkerReplicas` (from v1.2.0) those Running
  with the pod condition Ready=True (utils/util.go `CalculateAvailableReplicas`, `CalculateReadyReplicas`,
  `IsRunningAndReady`, v1.2.2 L346-374); `desiredWorkerReplicas` is replicas x numOfHosts per group.
- `state: ready` once every pod of the cluster is Running and not un-Ready (`CheckAllPodsRunning`, v1.2.2
  util.go L471-490) and, from v1.3.0, only when no reconcile error and there are exactly desired + 1 pods
  (calculateStatus, v1.2.2 L1217, v1.5.2 L1516-1521, v1.7.0 L2017-2022); it is never set back.
- Conditions only from v1.3.0, where the RayClusterStatusConditions gate is on by default (pkg/features/
  features.go; Alpha, off, in v1.2): `HeadPodReady` from the head pod's Ready condition (`FindHeadPodReadyCondition`,
  utils/util.go) or False/HeadPodNotFound, `RayClusterProvisioned` until first True, `ReplicaFailure` with
  FailedCreateHeadPod / FailedCreateWorkerPod while a pod's create is refused (utils/constant.go
  ErrFailedCreateHeadPod; calculateStatus v1.7.0 L1978-1995). A condition keeps its lastTransitionTime until its
  status changes (apimachinery meta.SetStatusCondition).
- `head.podName` and `head.serviceName` (updateHeadInfo, v1.7.0 L2203-2224): a recreated head is a status change.
"""

import copy
import hashlib
import itertools
import json
import time

from fakes import kube_rules

RECREATE_HASH = "ray.io/upgrade-strategy-recreate-hash"
VERSION_ANNOTATION = "ray.io/kuberay-version"
CLUSTER_LABEL, NODE_TYPE_LABEL, GROUP_LABEL = "ray.io/cluster", "ray.io/node-type", "ray.io/group"
HEAD_GROUP = "headgroup"  # utils.RayNodeHeadGroupLabelValue
_names = itertools.count(1)


def line_of(kuberay: str) -> tuple[int, int]:
    major, minor = (int(part) for part in kuberay.lstrip("v").split(".")[:2])
    return major, minor


def supports_upgrade_strategy(kuberay: str) -> bool:
    return line_of(kuberay) >= (1, 6)


def has_conditions(kuberay: str) -> bool:
    """RayClusterStatusConditions on by default (Beta) from v1.3.0 (pkg/features/features.go)."""
    return line_of(kuberay) >= (1, 3)


def has_ready_count(kuberay: str) -> bool:
    """`readyWorkerReplicas` is in RayClusterStatus from v1.2.0 (apis/ray/v1/raycluster_types.go; not in v1.1.1)."""
    return line_of(kuberay) >= (1, 2)


def spec_hash(spec: dict) -> str:
    reduced = copy.deepcopy(spec)
    reduced.pop("upgradeStrategy", None)
    reduced["headGroupSpec"]["template"].get("spec", {}).pop("tolerations", None)
    reduced["headGroupSpec"]["template"].get("spec", {}).pop("schedulingGates", None)
    for group in reduced.get("workerGroupSpecs", []):
        for name in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(name, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
        group["template"].get("spec", {}).pop("tolerations", None)
        group["template"].get("spec", {}).pop("schedulingGates", None)
    return hashlib.sha1(json.dumps(reduced, sort_keys=True).encode()).hexdigest()


def reconcile(objects: dict, kuberay: str) -> dict[tuple[str, str], str]:
    """Brings the pods in `objects` ((plural, namespace, name) -> object) to what each RayCluster asks. Returns the
    reconcile error of each cluster whose pod create was refused (its ReplicaFailure reason), for `write_status`."""
    clusters = {(ns, name): obj for (plural, ns, name), obj in objects.items() if plural == "rayclusters"}
    for key, pod in list(objects.items()):
        if key[0] == "pods" and (key[1], pod["metadata"]["labels"][CLUSTER_LABEL]) not in clusters:
            del objects[key]  # its RayCluster is gone
    failures = {}
    for (namespace, name), cluster in clusters.items():
        failure = _reconcile_cluster(objects, namespace, name, cluster, kuberay)
        if failure:
            failures[(namespace, name)] = failure
    return failures


def write_status(objects: dict, kuberay: str, failures: dict[tuple[str, str], str]) -> None:
    """calculateStatus then updateRayClusterStatus for every RayCluster, once its pods are placed (the module's
    docstring): the status is stored only when the consistency check says a field other than
    observedGeneration and lastUpdateTime changed."""
    for (plural, namespace, name), cluster in objects.items():
        if plural != "rayclusters":
            continue
        pods = list(pods_of(objects, namespace, name).values())
        new = calculated_status(cluster, pods, kuberay, failures.get((namespace, name)))
        if inconsistent(cluster.get("status") or {}, new):
            cluster["status"] = new


def calculated_status(cluster: dict, pods: list[dict], kuberay: str, failure: str | None) -> dict:
    """What calculateStatus makes of the pods, as its JSON (every count omitempty)."""
    old = cluster.get("status") or {}
    status = copy.deepcopy(old)  # newInstance := instance.DeepCopy(): what is not recomputed stays
    conditions = status.get("conditions", [])
    if has_conditions(kuberay):
        if failure:
            _set_condition(conditions, "ReplicaFailure", "True", failure, f"{failure} (the fake's reconcile error)")
        else:
            conditions[:] = [c for c in conditions if c["type"] != "ReplicaFailure"]
    status["observedGeneration"] = cluster["metadata"]["generation"]
    workers = [pod for pod in pods if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "worker"]
    groups = cluster["spec"].get("workerGroupSpecs", [])
    counts = {
        "readyWorkerReplicas": sum(1 for pod in workers if running_and_ready(pod)) if has_ready_count(kuberay) else 0,
        "availableWorkerReplicas": sum(1 for pod in workers if _phase(pod) == "Running"),
        "desiredWorkerReplicas": sum(g.get("replicas", 0) * g.get("numOfHosts", 1) for g in groups),
        "minWorkerReplicas": sum(g.get("minReplicas", 0) * g.get("numOfHosts", 1) for g in groups),
        "maxWorkerReplicas": sum(g.get("maxReplicas", 0) * g.get("numOfHosts", 1) for g in groups)}
    for field, count in counts.items():
        if count:
            status[field] = count
        else:
            status.pop(field, None)  # omitempty
    complete = line_of(kuberay) < (1, 3) or (not failure and len(pods) == counts["desiredWorkerReplicas"] + 1)
    if complete and all_running(pods):
        status["state"] = "ready"
        status.pop("reason", None)
    heads = [pod for pod in pods if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "head"]
    if has_conditions(kuberay):
        if heads:
            ready = next((c for c in heads[0]["status"].get("conditions", []) if c["type"] == "Ready"), None)
            state = ready["status"] if ready else "False"
            _set_condition(conditions, "HeadPodReady", state,
                           (ready or {}).get("reason") or ("HeadPodRunningAndReady" if state == "True" else "Unknown"),
                           (ready or {}).get("message", ""))
        else:
            _set_condition(conditions, "HeadPodReady", "False", "HeadPodNotFound", "Head Pod not found")
        if not any(c["type"] == "RayClusterProvisioned" and c["status"] == "True" for c in conditions):
            if all_running(pods):
                _set_condition(conditions, "RayClusterProvisioned", "True", "AllPodRunningAndReadyFirstTime",
                               "All Ray Pods are ready for the first time")
            else:
                _set_condition(conditions, "RayClusterProvisioned", "False", "RayClusterPodsProvisioning",
                               "RayCluster Pods are being provisioned for first time")
        if conditions:
            status["conditions"] = conditions
    status["head"] = {"serviceName": f"{cluster['metadata']['name']}-head-svc",
                      **({"podName": heads[0]["metadata"]["name"]} if heads else {})}
    status["lastUpdateTime"] = _now()
    return status


def inconsistent(old: dict, new: dict) -> bool:
    """InconsistentRayClusterStatus (utils/consistency.go L16-34): only these fields count."""
    fields = ("state", "reason", "readyWorkerReplicas", "availableWorkerReplicas", "desiredWorkerReplicas",
              "minWorkerReplicas", "maxWorkerReplicas", "endpoints", "head", "conditions")
    return any(old.get(field) != new.get(field) for field in fields)


def running_and_ready(pod: dict) -> bool:
    """IsRunningAndReady (utils/util.go)."""
    return _phase(pod) == "Running" and any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in pod["status"].get("conditions", []))


def all_running(pods: list[dict]) -> bool:
    """CheckAllPodsRunning (utils/util.go): some pods, each Running, none with Ready other than True."""
    return bool(pods) and all(_phase(pod) == "Running" and not any(
        c["type"] == "Ready" and c["status"] != "True" for c in pod["status"].get("conditions", [])) for pod in pods)


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "")


def _set_condition(conditions: list[dict], kind: str, status: str, reason: str, message: str) -> None:
    """meta.SetStatusCondition: lastTransitionTime moves only with the status."""
    for condition in conditions:
        if condition["type"] == kind:
            if condition["status"] != status:
                condition.update(status=status, lastTransitionTime=_now())
            condition.update(reason=reason, message=message)
            return
    conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": _now()})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pods_of(objects: dict, namespace: str, cluster: str) -> dict[tuple, dict]:
    return {key: pod for key, pod in objects.items()
            if key[0] == "pods" and key[1] == namespace and pod["metadata"]["labels"][CLUSTER_LABEL] == cluster}


def _reconcile_cluster(objects: dict, namespace: str, name: str, cluster: dict, kuberay: str) -> str | None:
    spec = cluster["spec"]
    current_hash = spec_hash(spec)
    pods = pods_of(objects, namespace, name)
    heads = [pod for pod in pods.values() if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "head"]
    recreate = supports_upgrade_strategy(kuberay) and (spec.get("upgradeStrategy") or {}).get("type") == "Recreate"
    if recreate and heads:
        annotations = heads[0]["metadata"]["annotations"]
        if annotations.get(VERSION_ANNOTATION) not in (None, "", kuberay):
            # Another operator made it: stamp, recreate nothing (shouldRecreatePodsForUpgrade's version branch).
            annotations.update({RECREATE_HASH: current_hash, VERSION_ANNOTATION: kuberay})
        elif annotations.get(RECREATE_HASH) not in (None, "", current_hash):
            for key in pods:
                del objects[key]
            pods, heads = {}, []
    if not heads:
        head = _pod(namespace, f"{name}-head", name, "head", HEAD_GROUP, spec["headGroupSpec"]["template"])
        # reconcilePods computes the hash whatever the strategy (v1.7.0 L935), createHeadPod stamps it (L1642-1646)
        if supports_upgrade_strategy(kuberay):
            head["metadata"]["annotations"].update({RECREATE_HASH: current_hash, VERSION_ANNOTATION: kuberay})
        if not _created(objects, cluster, head, "FailedToCreateHeadPod",
                        f"Failed to create head Pod {namespace}/{head['metadata']['name']}"):
            return "FailedCreateHeadPod"
    for group in spec.get("workerGroupSpecs", []):
        wanted = group.get("replicas", 0) * group.get("numOfHosts", 1)
        mine = sorted((key for key, pod in pods.items() if pod["metadata"]["labels"][GROUP_LABEL] == group["groupName"]
                       and pod["metadata"]["labels"][NODE_TYPE_LABEL] == "worker"), key=lambda key: key[2])
        for key in mine[wanted:]:
            del objects[key]
        for _ in range(wanted - len(mine)):
            worker = _pod(namespace, f"{name}-{group['groupName']}-worker", name, "worker", group["groupName"],
                          group["template"])
            if not _created(objects, cluster, worker, "FailedToCreateWorkerPod",
                            f"Failed to create worker Pod for the cluster {namespace}/{name}"):
                return "FailedCreateWorkerPod"
    return None


def _created(objects: dict, cluster: dict, pod: dict, reason: str, failed: str) -> bool:
    """The pod's create, through admission; a refusal is an event on the RayCluster (the module's docstring)."""
    namespace = pod["metadata"]["namespace"]
    refused = kube_rules.namespace_lifecycle(objects, "pods", "", namespace, pod["metadata"]["name"], creating=True) \
        or kube_rules.service_account_admission(objects, pod)
    if refused is None:
        objects[("pods", namespace, pod["metadata"]["name"])] = pod
        return True
    _warn(objects, cluster, reason, f"{failed}, {refused[2]}")
    return False


def _warn(objects: dict, cluster: dict, reason: str, message: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    metadata = cluster["metadata"]
    for key, event in objects.items():
        if key[0] == "events" and event["involvedObject"]["uid"] == metadata["uid"] and event["reason"] == reason:
            event.update(message=message, count=event["count"] + 1, lastTimestamp=now)
            return
    name = f"{metadata['name']}.{next(_names):016x}"
    objects[("events", metadata["namespace"], name)] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": metadata["namespace"], "resourceVersion": "1", "uid": f"event-{name}"},
        "involvedObject": {"kind": "RayCluster", "namespace": metadata["namespace"], "name": metadata["name"],
                           "uid": metadata["uid"], "apiVersion": "ray.io/v1"},
        "reason": reason, "message": message, "source": {"component": "raycluster-controller"}, "type": "Warning",
        "count": 1, "firstTimestamp": now, "lastTimestamp": now}


def _pod(namespace: str, prefix: str, cluster: str, node_type: str, group: str, template: dict) -> dict:
    metadata = copy.deepcopy(template.get("metadata") or {})
    labels = {**metadata.get("labels", {}), CLUSTER_LABEL: cluster, NODE_TYPE_LABEL: node_type, GROUP_LABEL: group}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{prefix}-{next(_names):05d}", "namespace": namespace, "labels": labels,
                         "annotations": dict(metadata.get("annotations", {})), "uid": f"pod-uid-{next(_names)}"},
            "spec": copy.deepcopy(template.get("spec") or {}), "status": {"phase": "Pending"}}

