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


def supports_upgrade_strategy(kuberay: str) -> bool:
    major, minor = (int(part) for part in kuberay.lstrip("v").split(".")[:2])
    return (major, minor) >= (1, 6)


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


def reconcile(objects: dict, kuberay: str) -> None:
    """Brings the pods in `objects` ((plural, namespace, name) -> object) to what each RayCluster asks."""
    clusters = {(ns, name): obj for (plural, ns, name), obj in objects.items() if plural == "rayclusters"}
    for key, pod in list(objects.items()):
        if key[0] == "pods" and (key[1], pod["metadata"]["labels"][CLUSTER_LABEL]) not in clusters:
            del objects[key]  # its RayCluster is gone
    for (namespace, name), cluster in clusters.items():
        _reconcile_cluster(objects, namespace, name, cluster, kuberay)


def pods_of(objects: dict, namespace: str, cluster: str) -> dict[tuple, dict]:
    return {key: pod for key, pod in objects.items()
            if key[0] == "pods" and key[1] == namespace and pod["metadata"]["labels"][CLUSTER_LABEL] == cluster}


def _reconcile_cluster(objects: dict, namespace: str, name: str, cluster: dict, kuberay: str) -> None:
    spec = cluster["spec"]
    current_hash = spec_hash(spec)
    pods = pods_of(objects, namespace, name)
    heads = [pod for pod in pods.values() if pod["metadata"]["labels"][NODE_TYPE_LABEL] == "head"]
    recreate = supports_upgrade_strategy(kuberay) and (spec.get("upgradeStrategy") or {}).get("type") == "Recreate"
    if recreate and heads and heads[0]["metadata"]["annotations"].get(RECREATE_HASH) not in (None, current_hash):
        for key in pods:
            del objects[key]
        pods, heads = {}, []
    if not heads:
        head = _pod(namespace, f"{name}-head", name, "head", HEAD_GROUP, spec["headGroupSpec"]["template"])
        if supports_upgrade_strategy(kuberay):
            head["metadata"]["annotations"].update({RECREATE_HASH: current_hash, VERSION_ANNOTATION: kuberay})
        if not _created(objects, cluster, head, "FailedToCreateHeadPod",
                        f"Failed to create head Pod {namespace}/{head['metadata']['name']}"):
            return
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
                return


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
                         "annotations": metadata.get("annotations", {}), "uid": f"pod-uid-{next(_names)}"},
            "spec": copy.deepcopy(template.get("spec") or {}), "status": {"phase": "Pending"}}

