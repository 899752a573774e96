"""What a plan compares (no I/O): whose an object is, what rlops sends for it given what is live, the object as the
server holds it, the paths at which two differ, and which objects hold which, so that a replacement takes its
holders with it.

Some fields are the cluster's once an object exists, and what rlops sends keeps what is live (`keep_live`):
- worker replicas: the idle reaper's and the wake's (manager `rlops-reaper`);
- a PV's claimRef: the PV binder completes it with the claim's uid;
- a claim's storage request: a claim with storage class "" cannot be resized (the
  PersistentVolumeClaimResize admission refuses it); the PV's capacity is what grows.
"""

import copy

from rlops.kube.objects import Manifest, ObjectChange, Ref, spec_of
from rlops.kube.render import pod_templates
from rlops.ownership import labels_for

SERVER_METADATA = ("resourceVersion", "generation", "uid", "managedFields", "creationTimestamp", "selfLink")


def owned_by(obj: Manifest, env_name: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in labels_for(env_name).items())


def keep_live(rendered: Manifest, live: Manifest | None, replacing: bool = False) -> Manifest:
    """The object to send: `rendered` with the fields that are the cluster's once it exists (see the module's
    docstring). A replacement keeps only the replicas: its claim and request are the new object's own."""
    desired = copy.deepcopy(rendered)
    if live is None:
        return desired
    spec, live_spec = desired.get("spec", {}), live.get("spec", {})
    if replacing and desired["kind"] != "RayCluster":
        return desired
    if desired["kind"] == "RayCluster":
        current = {g["groupName"]: g.get("replicas") for g in live_spec.get("workerGroupSpecs", [])}
        for group in spec["workerGroupSpecs"]:
            if current.get(group["groupName"]) is not None:
                group["replicas"] = current[group["groupName"]]
    elif desired["kind"] == "PersistentVolume":
        bound = live_spec.get("claimRef") or {}
        wanted = spec.get("claimRef") or {}
        if (bound.get("namespace"), bound.get("name")) == (wanted.get("namespace"), wanted.get("name")):
            spec["claimRef"] = bound
    elif desired["kind"] == "PersistentVolumeClaim":
        requested = live_spec.get("resources", {}).get("requests", {}).get("storage")
        if requested:
            spec["resources"]["requests"]["storage"] = requested
    return desired


def shown(obj: Manifest) -> Manifest:
    """An object as the server holds it, without what the server writes about it (metadata, status)."""
    held = obj.copy()
    held.pop("status", None)
    held["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k not in SERVER_METADATA}
    return held


def differences(wanted: object, live: object, path: str = "") -> list[str]:
    """The paths at which two JSON values differ; list items named by their `name`/`groupName` where they have one.
    Only paths: a Secret's values never reach a plan."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        return [p for key in sorted(set(wanted) | set(live))
                for p in differences(wanted.get(key), live.get(key), f"{path}.{key}".lstrip("."))]
    if isinstance(wanted, list) and isinstance(live, list) and len(wanted) == len(live) and wanted != live:
        return [p for i, (a, b) in enumerate(zip(wanted, live, strict=True))
                for p in differences(a, b, f"{path}[{_label(a, i)}]")]
    return [] if wanted == live else [path]


def _label(item: object, index: int) -> str:
    return str(item.get("name") or item.get("groupName") or index) if isinstance(item, dict) else str(index)


def holds(holder: Manifest, held: Ref) -> bool:
    """A claim holds the volume it is bound to; a RayCluster's pods hold the claims they mount."""
    if holder["kind"] == "PersistentVolumeClaim" and held.kind == "PersistentVolume":
        return spec_of(holder).get("volumeName") == held.name
    if holder["kind"] == "RayCluster" and held.kind == "PersistentVolumeClaim":
        return held.name in _claims_mounted(holder)
    return False


def _claims_mounted(ray_cluster: Manifest) -> set[str]:
    return {volume["persistentVolumeClaim"]["claimName"] for template in pod_templates(ray_cluster)
            for volume in template["spec"].get("volumes", []) if "persistentVolumeClaim" in volume}


def with_holders_replaced(changes: list[ObjectChange], rendered: list[Manifest],
                          lives: dict[Ref, Manifest | None]) -> list[ObjectChange]:
    """`changes` with every rendered object that holds one being replaced (`holds`) replaced too, in the order of
    `rendered`."""
    by_ref = {c.ref: c for c in changes}
    pending = [c.ref for c in changes if c.action == "replace"]
    while pending:
        held = pending.pop()
        for obj in rendered:
            ref = Ref.of(obj)
            existing = by_ref.get(ref)
            if holds(obj, held) and (existing is None or existing.action == "update"):
                by_ref[ref] = ObjectChange(ref, "replace", desired=keep_live(obj, lives.get(ref), replacing=True),
                                           reason=f"it holds {held}, which is replaced")
                pending.append(ref)
    return [by_ref[Ref.of(obj)] for obj in rendered if Ref.of(obj) in by_ref] + \
        [c for c in changes if c.desired is None]
