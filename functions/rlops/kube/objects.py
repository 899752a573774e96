"""The in-cluster objects rlops applies, as data, names and changes (no I/O): the shape of an object, which kinds,
how an object is named, and what a plan says of a change to one."""

from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, cast


class Manifest(TypedDict, total=False):
    """A Kubernetes object as JSON (not a checkpoint's manifest, `rlops.checkpoints.manifest`): as rlops renders and
    applies it, and as the API server answers with it. Every object has a kind and metadata (an item of a list comes
    without its kind: `KubeApi.list_labelled` puts it back); the rest depends on the kind (a Namespace has no spec,
    a Secret has data), and the server adds status. A kind's own fields below `spec` are not typed."""

    apiVersion: str
    kind: Required[str]
    metadata: Required[dict[str, Any]]
    spec: dict[str, Any]
    data: dict[str, str]
    status: dict[str, Any]


def as_manifest(document: object) -> Manifest:
    """A YAML document that is a Kubernetes object (a mapping with a kind and metadata), as one; a ValueError for
    anything else."""
    if not (isinstance(document, dict) and isinstance(document.get("kind"), str)
            and isinstance(document.get("metadata"), dict)):
        raise ValueError(f"not a Kubernetes object (a mapping with a kind and metadata): a {type(document).__name__}")
    return cast(Manifest, document)  # kind and metadata checked; the rest is the kind's own


def spec_of(obj: Manifest) -> dict[str, Any]:
    """The spec of an object of a kind that has one (a KeyError for one that has none, as obj["spec"] would)."""
    if "spec" not in obj:
        raise KeyError("spec")
    return obj["spec"]


# kind -> (API path prefix, plural, namespaced): the kinds rlops applies.
KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Secret": ("/api/v1", "secrets", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "RayCluster": ("/apis/ray.io/v1", "rayclusters", True),
    "GKENetworkParamSet": ("/apis/networking.gke.io/v1", "gkenetworkparamsets", False),
    "Network": ("/apis/networking.gke.io/v1", "networks", False),
    "Pod": ("/api/v1", "pods", True),  # never applied: KubeRay's, read for readiness and deleted to recreate
    "Event": ("/api/v1", "events", True),  # never applied: read to say why a pod waits
    "Node": ("/api/v1", "nodes", False),  # never applied: read to measure a wake (created, Ready)
}
# What serves a kind that may not be there yet.
SERVED_BY = {
    "RayCluster": "the Ray operator add-on (cluster.ray_operator), which GKE installs with the cluster",
    "GKENetworkParamSet": "GKE multi-networking (cluster.multi_networking), on once the cluster is updated",
    "Network": "GKE multi-networking (cluster.multi_networking), on once the cluster is updated",
}


@dataclass(frozen=True)
class Ref:
    kind: str
    name: str
    namespace: str = ""

    @classmethod
    def of(cls, obj: Manifest) -> "Ref":
        return cls(obj["kind"], obj["metadata"]["name"],
                   obj["metadata"].get("namespace", "") if KINDS[obj["kind"]][2] else "")

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace + '/' if self.namespace else ''}{self.name}"


@dataclass
class ObjectChange:
    ref: Ref
    action: str                      # create, update, replace, delete, or wait (the kind is not served yet)
    fields: list[str] = field(default_factory=list)
    desired: Manifest | None = None
    reason: str = ""
    # Who recreates the RayCluster's pods for this update: KubeRay, rlops, or "leftover" (rlops, for pods an
    # earlier apply left on an older template).
    restarts_pods: str = ""

    def line(self) -> str:
        symbol = {"create": "+", "update": "~", "replace": "-/+", "delete": "-", "wait": "+"}[self.action]
        detail = self.reason or ", ".join(self.fields)
        if self.restarts_pods:
            detail += "; every pod restarts" + {
                "KubeRay": " (KubeRay's upgradeStrategy Recreate)",
                "rlops": ": this KubeRay has no upgradeStrategy (before v1.6), so rlops deletes the pods for KubeRay "
                         "to make them again",
                "leftover": ": rlops deletes the pods on an older template for KubeRay to make them again",
            }[self.restarts_pods] + ", once no Ray job is pending or running"
        return f"{symbol} {self.ref}" + (f"  ({detail})" if detail else "")

    def summary(self) -> dict[str, Any]:
        """The change as data, for `plan --format json`: never the object itself (a Secret's values are in it)."""
        return {"kind": self.ref.kind, "name": self.ref.name, "namespace": self.ref.namespace or None,
                "action": self.action, "fields": list(self.fields), "reason": self.reason or None,
                "restarts_pods": self.restarts_pods or None}
