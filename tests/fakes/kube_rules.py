"""What a real API server does to the objects rlops sends, beyond storing them: the schemas it merges
by, the defaults it fills in, the quantities it canonicalizes, and the updates it refuses.

Every rule names its upstream source (kubernetes/kubernetes at release-1.33 unless said otherwise).
Admission: the NamespaceLifecycle and ServiceAccount plugins (below, "admission"); the storage plugins'
rules are with the updates they refuse. What is not modelled: admission webhooks and other plugins, pods
beyond their admission (a RayCluster that names a claim stands for the pods KubeRay makes from it),
validation beyond the rules below, and defaults of fields rlops never sends.
"""

import gzip
import re
from decimal import Decimal
from functools import cache
from pathlib import Path

import yaml

from fakes.kube_ssa import Schema

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
# The KubeRay releases whose RayCluster CRD the fake can serve (tests/schemas/SOURCES.txt).
KUBERAY_CRDS = {"v1.7.0": "ray.io_rayclusters.yaml", "v1.5.2": "ray.io_rayclusters-v1.5.2.yaml.gz"}


def kuberay_crd(kuberay: str) -> str:
    """The CRD file that stands for a release: its own if stored, else its version line's. The fields rlops sends
    (rayVersion, headGroupSpec, workerGroupSpecs: groupName, replicas, min/maxReplicas, numOfHosts,
    rayStartParams, template) are in ray-operator/config/crd/bases/ray.io_rayclusters.yaml from v1.2.2 on, and
    `upgradeStrategy` from v1.6.0 on: v1.5.2's CRD stands for v1.1-v1.5, v1.7.0's for v1.6+."""
    if kuberay in KUBERAY_CRDS:
        return KUBERAY_CRDS[kuberay]
    major, minor = (int(part) for part in kuberay.lstrip("v").split(".")[:2])
    return KUBERAY_CRDS["v1.7.0" if (major, minor) >= (1, 6) else "v1.5.2"]


@cache
def _crd_schema(name: str) -> dict:
    path = SCHEMAS / name
    crd = yaml.load(gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@cache
def _networking(kind: str) -> dict:
    return yaml.safe_load((SCHEMAS / "networking.gke.io_v1.yaml").read_text())[kind]


ATOMIC = {"x-kubernetes-list-type": "atomic"}
# ObjectMeta (apimachinery pkg/apis/meta/v1/types.go): labels and annotations are maps of their own
# keys, finalizers `+listType=set`, ownerReferences a map by uid.
METADATA = {"properties": {"finalizers": {"x-kubernetes-list-type": "set"},
                           "ownerReferences": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]}}}


@cache
def _pod_template() -> dict:
    """core/v1 PodTemplateSpec as KubeRay's CRD embeds it: controller-gen copies k8s.io/api's
    `+listType`/`+listMapKey` markers (containers, env, volumes by name; ports by containerPort and
    protocol; volumeMounts by mountPath; tolerations and the affinity terms atomic), so the same
    schema serves the DaemonSet's template."""
    return _crd_schema("ray.io_rayclusters.yaml")["properties"]["spec"]["properties"]["headGroupSpec"][
        "properties"]["template"]


@cache
def schema(plural: str, kuberay: str = "v1.7.0") -> Schema:
    # LabelSelector and ObjectReference are `+structType=atomic` (apimachinery meta/v1 types.go,
    # k8s.io/api core/v1 types.go); accessModes and mountOptions are `+listType=atomic`.
    selector = {"x-kubernetes-map-type": "atomic"}
    built_in = {
        "daemonsets": {"properties": {"spec": {"properties": {"selector": selector, "template": _pod_template()}}}},
        "persistentvolumes": {"properties": {"spec": {"properties": {
            "accessModes": ATOMIC, "mountOptions": ATOMIC, "claimRef": {"x-kubernetes-map-type": "atomic"}}}}},
        "persistentvolumeclaims": {"properties": {"spec": {"properties": {"accessModes": ATOMIC,
                                                                          "selector": selector}}}},
        "secrets": {}, "serviceaccounts": {"properties": {"secrets": ATOMIC, "imagePullSecrets": ATOMIC}},
        # NamespaceSpec.finalizers is `+listType=atomic` (k8s.io/api core/v1 types.go).
        "namespaces": {"properties": {"spec": {"properties": {"finalizers": ATOMIC}}}},
    }
    if plural == "rayclusters":
        node = dict(_crd_schema(kuberay_crd(kuberay)))
    elif plural in ("gkenetworkparamsets", "networks"):
        node = dict(_networking({"gkenetworkparamsets": "GKENetworkParamSet", "networks": "Network"}[plural]))
    else:
        node = built_in[plural]
    node["properties"] = dict(node.get("properties") or {}, metadata=METADATA)
    return Schema(node)


CUSTOM = ("rayclusters", "gkenetworkparamsets", "networks")


# -- pruning --------------------------------------------------------------------------------------

def prune_unknown(obj: dict, node: Schema) -> list[str]:
    """A custom resource loses every field its structural schema does not declare, silently (with
    fieldValidation Warn, the default, only a warning header says so): apiextensions-apiserver
    pkg/apiserver/schema/pruning/algorithm.go, run on every write (customresource_handler.go). An object
    node keeps its `properties`, or everything under `additionalProperties` or
    `x-kubernetes-preserve-unknown-fields`. The root's apiVersion, kind and metadata are ObjectMeta's, not
    the schema's. Returns the pruned paths."""
    pruned: list[str] = []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    _prune(body, node, "", pruned)
    for name in set(obj) - set(body) - {"apiVersion", "kind", "metadata"}:
        del obj[name]
    return [path.lstrip(".") for path in pruned]


def _prune(value, node: Schema, path: str, pruned: list[str]) -> None:
    if node.node.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        declared = node.node.get("properties") or {}
        if not node.node.get("additionalProperties"):
            for key in [k for k in value if k not in declared]:
                del value[key]
                pruned.append(f"{path}.{key}")
        for key, child in value.items():
            _prune(child, node.field(key), f"{path}.{key}", pruned)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _prune(item, node.item(), f"{path}[{index}]", pruned)


# -- defaulting -------------------------------------------------------------------------------------

def apply_defaults(plural: str, obj: dict, kuberay: str = "v1.7.0") -> None:
    if plural in CUSTOM:
        _schema_defaults(obj, schema(plural, kuberay))
        return
    {"daemonsets": _daemonset, "persistentvolumes": _persistent_volume, "persistentvolumeclaims": _claim,
     "secrets": _secret, "serviceaccounts": lambda obj: None, "namespaces": _namespace}[plural](obj)


def _schema_defaults(value, node: Schema) -> None:
    """A CRD's structural-schema `default:`s, filled into every object present that lacks the field
    (apiextensions-apiserver pkg/apiserver/schema/defaulting/algorithm.go): ports' protocol TCP,
    workerGroupSpecs' numOfHosts 1, minReplicas 0, maxReplicas 2147483647..."""
    if isinstance(value, dict):
        for name, child in (node.node.get("properties") or {}).items():
            if name not in value and "default" in child:
                value[name] = child["default"]
        for name, child in value.items():
            _schema_defaults(child, node.field(name))
    elif isinstance(value, list):
        for item in value:
            _schema_defaults(item, node.item())


def _daemonset(obj: dict) -> None:
    """apps/v1 SetDefaults_DaemonSet (pkg/apis/apps/v1/defaults.go), then the pod template's."""
    spec = obj.setdefault("spec", {})
    strategy = spec.setdefault("updateStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", 1)
        rolling.setdefault("maxSurge", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    _pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))


def _pod_spec(spec: dict) -> None:
    """core/v1 SetDefaults_PodSpec, _Container, _ContainerPort, _Volume, _HostPathVolumeSource
    (pkg/apis/core/v1/defaults.go) and resource quantities in canonical form (apimachinery
    pkg/api/resource/quantity.go: a Quantity is stored and served as `CanonicalizeBytes` writes it)."""
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("securityContext", {})
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        container.setdefault("imagePullPolicy", _pull_policy(container.get("image", "")))
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for port in container.get("ports", []):
            port.setdefault("protocol", "TCP")
            if spec.get("hostNetwork"):  # defaultHostNetworkPorts
                port.setdefault("hostPort", port["containerPort"])
        for amounts in (container.get("resources") or {}).values():
            amounts.update({name: canonical(value) for name, value in amounts.items()})
    for volume in spec.get("volumes", []):
        if set(volume) == {"name"}:
            volume["emptyDir"] = {}
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")


def _pull_policy(image: str) -> str:
    """SetDefaults_Container: Always for `:latest` or no tag (ParseImageName calls that `latest`),
    IfNotPresent otherwise; an image by digest alone has no tag and is IfNotPresent."""
    name = image.split("@", 1)[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ("" if "@" in image else "latest")
    return "Always" if tag == "latest" else "IfNotPresent"


def _persistent_volume(obj: dict) -> None:
    spec = obj.setdefault("spec", {})  # SetDefaults_PersistentVolume
    spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
    spec.setdefault("volumeMode", "Filesystem")
    spec["capacity"] = {name: canonical(value) for name, value in (spec.get("capacity") or {}).items()}
    obj.setdefault("status", {}).setdefault("phase", "Pending")


def _claim(obj: dict) -> None:
    spec = obj.setdefault("spec", {})  # SetDefaults_PersistentVolumeClaimSpec, _PersistentVolumeClaim
    spec.setdefault("volumeMode", "Filesystem")
    requests = (spec.get("resources") or {}).get("requests") or {}
    requests.update({name: canonical(value) for name, value in requests.items()})
    obj.setdefault("status", {}).setdefault("phase", "Pending")


def _secret(obj: dict) -> None:
    obj.setdefault("type", "Opaque")  # SetDefaults_Secret


def _namespace(obj: dict) -> None:
    """SetDefaults_Namespace (pkg/apis/core/v1/defaults.go): the label kubernetes.io/metadata.name; the
    registry's PrepareForCreate (pkg/registry/core/namespace/strategy.go): phase Active and the finalizer
    `kubernetes` in spec.finalizers, which the namespace controller removes once the namespace is empty."""
    obj.setdefault("metadata", {}).setdefault("labels", {})[NAME_LABEL] = obj["metadata"]["name"]
    obj.setdefault("spec", {}).setdefault("finalizers", [NAMESPACE_FINALIZER])
    obj.setdefault("status", {}).setdefault("phase", "Active")


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|)$")
_BINARY = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_DECIMAL = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def canonical(quantity) -> str:
    """A Quantity as the server writes it back: `1024Mi` -> `1Gi`, `1000m` -> `1`, `0.5` -> `500m`.
    The suffix family of the input is kept; the largest suffix that keeps the number whole wins."""
    text = str(quantity)
    match = _QUANTITY.match(text)
    if not match:
        return text
    number, suffix = Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY and suffix:
        value = number * 1024 ** _BINARY.index(suffix)
        if value != value.to_integral_value():
            return text
        power = max(p for p in range(len(_BINARY)) if value % (1024 ** p) == 0)
        return f"{int(value) // 1024 ** power}{_BINARY[power]}"
    exponent = {v: k for k, v in _DECIMAL.items()}[suffix]
    value = number * Decimal(10) ** exponent
    for power in sorted(_DECIMAL, reverse=True):
        scaled = value / Decimal(10) ** power
        if scaled == scaled.to_integral_value() and (scaled != 0 or power == 0):
            return f"{int(scaled)}{_DECIMAL[power]}"
    return text


# -- what an update may not change -------------------------------------------------------------------

def refused_update(plural: str, old: dict, new: dict, storage_classes: dict[str, bool]) -> tuple[int, str, str] | None:
    """(code, reason, message) of a refused update, worded as the API server words it; None if allowed."""
    spec, before = new.get("spec") or {}, old.get("spec") or {}
    if plural == "persistentvolumes":
        # ValidatePersistentVolumeUpdate (pkg/apis/core/validation/validation.go): the volume source
        # (here `csi`) and volumeMode are immutable; capacity may change.
        source = {k: v for k, v in spec.items() if k not in _PV_MUTABLE}
        if source != {k: v for k, v in before.items() if k not in _PV_MUTABLE}:
            return 422, "Invalid", (f'PersistentVolume "{new["metadata"]["name"]}" is invalid: '
                                    "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is "
                                    "immutable after creation")
    if plural == "persistentvolumeclaims":
        grown = _bytes(_storage(spec)) - _bytes(_storage(before))
        others = ({k: v for k, v in spec.items() if k != "resources"},
                  {k: v for k, v in before.items() if k != "resources"})
        if others[0] != others[1] or (grown and (old.get("status") or {}).get("phase") != "Bound"):
            # ValidatePersistentVolumeClaimUpdate
            return 422, "Invalid", (f'PersistentVolumeClaim "{new["metadata"]["name"]}" is invalid: spec: Forbidden: '
                                    "spec is immutable after creation except resources.requests and "
                                    "volumeAttributesClassName for bound claims")
        if grown < 0:
            return 422, "Invalid", (f'PersistentVolumeClaim "{new["metadata"]["name"]}" is invalid: '
                                    "spec.resources.requests.storage: Forbidden: field can not be less than "
                                    "status.capacity")
        if grown > 0 and not storage_classes.get(spec.get("storageClassName") or ""):
            # PersistentVolumeClaimResize admission (plugin/pkg/admission/storage/persistentvolume/resize)
            return 403, "Forbidden", (f'persistentvolumeclaims "{new["metadata"]["name"]}" is forbidden: only '
                                      "dynamically provisioned pvc can be resized and the storageclass that "
                                      "provisions the pvc must support resize")
    if plural == "daemonsets" and spec.get("selector") != before.get("selector"):
        return 422, "Invalid", (f'DaemonSet.apps "{new["metadata"]["name"]}" is invalid: spec.selector: Invalid '
                                "value: field is immutable")  # ValidateDaemonSetUpdate
    if plural == "secrets" and old.get("type") != new.get("type"):
        return 422, "Invalid", f'Secret "{new["metadata"]["name"]}" is invalid: type: Invalid value: field is immutable'
    return None


_PV_MUTABLE = {"capacity", "claimRef", "persistentVolumeReclaimPolicy", "storageClassName", "mountOptions",
               "accessModes", "nodeAffinity", "volumeAttributesClassName"}


def _storage(spec: dict) -> str:
    return ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")


def _bytes(quantity: str) -> Decimal:
    match = _QUANTITY.match(str(quantity))
    if not match:
        return Decimal(0)
    number, suffix = Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * 1024 ** _BINARY.index(suffix)
    return number * Decimal(10) ** {v: k for k, v in _DECIMAL.items()}[suffix]


# -- admission -----------------------------------------------------------------------------------------

NAME_LABEL, NAMESPACE_FINALIZER = "kubernetes.io/metadata.name", "kubernetes"
# The namespaces every cluster has: the API server makes them at start and keeps them (the kube-* ones:
# pkg/controlplane/controller/systemnamespaces; default comes with the `kubernetes` service), and
# NamespaceLifecycle refuses to delete the "immortal" default, kube-system and kube-public.
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")
Refusal = tuple[int, str, str, dict]  # code, reason, message, the Status's details


def namespace_lifecycle(objects: dict, plural: str, group: str, namespace: str, name: str,
                        creating: bool) -> Refusal | None:
    """The NamespaceLifecycle admission plugin (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/
    lifecycle/admission.go; plugin/pkg/admission/namespace/lifecycle/admission.go before it moved), on a
    create or an update of a namespaced object (deletes and cluster-scoped objects pass): a namespace that
    does not exist is the lookup's own NotFound, `namespaces "NS" not found` (404); a create in a namespace
    being terminated is Forbidden (403) with the cause NamespaceTerminating. Dry runs are admitted the same way.
    `objects`: (plural, namespace, name) -> object, as the fake stores them."""
    if not namespace:
        return None
    found = objects.get(("namespaces", "", namespace))
    if found is None:
        return 404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
    if creating and (found.get("status") or {}).get("phase") == "Terminating":
        return _forbidden(plural, group, name, f"unable to create new content in namespace {namespace} because it "
                          "is being terminated",
                          [{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace"}])
    return None


def namespace_deletion(name: str) -> Refusal | None:
    """NamespaceLifecycle again: the immortal namespaces may not be deleted."""
    if name in IMMORTAL_NAMESPACES:
        return _forbidden("namespaces", "", name, "this namespace may not be deleted")
    return None


def service_account_admission(objects: dict, pod: dict) -> Refusal | None:
    """The ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount/admission.go), on a pod's
    create: an empty serviceAccountName becomes `default`, and the account must exist in the pod's own
    namespace, else Forbidden: `error looking up service account NS/NAME: serviceaccount "NAME" not found`.
    The account `default` is in every namespace (the service account controller makes it:
    pkg/controller/serviceaccount/serviceaccounts_controller.go)."""
    namespace, account = pod["metadata"]["namespace"], pod["spec"].get("serviceAccountName") or "default"
    if account == "default" or ("serviceaccounts", namespace, account) in objects:
        return None
    return _forbidden("pods", "", pod["metadata"]["name"], f"error looking up service account {namespace}/{account}: "
                      f'serviceaccount "{account}" not found')


def _forbidden(plural: str, group: str, name: str, why: str, causes: list | None = None) -> Refusal:
    """apimachinery's errors.NewForbidden, which admission.NewForbidden calls: `RESOURCE "NAME" is forbidden: WHY`."""
    resource = f"{plural}.{group}" if group else plural
    details = {"name": name, **({"group": group} if group else {}), "kind": plural,
               **({"causes": causes} if causes else {})}
    return 403, "Forbidden", f'{resource} "{name}" is forbidden: {why}', details
