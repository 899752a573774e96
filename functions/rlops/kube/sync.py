"""Bringing the cluster's objects to what rlops renders: diff, server-side apply, prune, wait until ready.

Only objects carrying rlops's labels for this environment are changed or pruned; one that exists
without them is refused, never taken over. Worker replica counts are the idle reaper's to set: the
live value is kept, so a scaled-down cluster is not "drift".
"""

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlops.kube.cluster import KubeApi, KubeError, Ref
from rlops.provision.resources import labels_for

# Deleted in this order (and applied in the reverse): what uses a thing goes before it.
DELETE_ORDER = ["RayCluster", "Secret", "ServiceAccount", "PersistentVolumeClaim", "PersistentVolume", "DaemonSet",
                "Network", "GKENetworkParamSet"]


@dataclass
class ObjectChange:
    ref: Ref
    action: str                      # create, update, delete
    fields: list[str] = field(default_factory=list)
    desired: dict | None = None

    def line(self) -> str:
        symbol = {"create": "+", "update": "~", "delete": "-"}[self.action]
        changed = f"  ({', '.join(self.fields)})" if self.fields else ""
        return f"{symbol} {self.ref}{changed}"


def owned_by(obj: dict, env_name: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in labels_for(env_name).items())


def keep_live_replicas(desired: dict, live: dict | None) -> None:
    """The reaper scales worker groups to 0 and `train` back up: apply what is live, not the spec's count."""
    if live is None or desired["kind"] != "RayCluster":
        return
    current = {g["groupName"]: g.get("replicas") for g in live.get("spec", {}).get("workerGroupSpecs", [])}
    for group in desired["spec"]["workerGroupSpecs"]:
        if current.get(group["groupName"]) is not None:
            group["replicas"] = current[group["groupName"]]


def differences(desired, live, path: str = "") -> list[str]:
    """The paths where `desired` says something `live` does not (fields the server adds are ignored)."""
    if isinstance(desired, dict) and isinstance(live, dict):
        return [p for key, value in desired.items() for p in differences(value, live.get(key), f"{path}.{key}".lstrip("."))]
    return [] if desired == live else [path]


def comparable(desired: dict) -> dict:
    """`desired` as the API server shows it back: a Secret's stringData is stored base64-encoded in data."""
    if desired["kind"] != "Secret":
        return desired
    shown = {k: v for k, v in desired.items() if k != "stringData"}
    shown["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in desired.get("stringData", {}).items()}
    return shown


def plan(api: KubeApi, env_name: str, rendered: list[dict], secret_values_known: bool) -> list[ObjectChange]:
    changes, wanted = [], set()
    for desired in rendered:
        ref = Ref.of(desired)
        wanted.add(ref)
        live = api.get(ref)
        if live is None:
            changes.append(ObjectChange(ref, "create", desired=desired))
            continue
        if not owned_by(live, env_name):
            raise KubeError(f"{ref} exists without rlops's labels for {env_name}; rlops does not take over objects "
                            "it did not create: delete it or rename it in the spec")
        keep_live_replicas(desired, live)
        target = comparable(desired)
        if desired["kind"] == "Secret" and not secret_values_known:
            # Without the values (a plan never reads them) only the keys can be compared.
            target = {"data": {k: live.get("data", {}).get(k) for k in desired.get("stringData", {})}}
        changed = differences(target, live)
        if changed:
            changes.append(ObjectChange(ref, "update", changed, desired))
    changes += [ObjectChange(ref, "delete") for ref in owned_refs(api, env_name) if ref not in wanted]
    return changes


def apply(api: KubeApi, changes: list[ObjectChange], report: Callable[[str], None]) -> None:
    writes = [c for c in changes if c.action != "delete"]
    writes.sort(key=lambda c: -DELETE_ORDER.index(c.ref.kind))
    for change in writes:
        api.apply(change.desired)
        report(f"applied {change.ref} ({change.action})")
    deletes = sorted((c for c in changes if c.action == "delete"), key=lambda c: DELETE_ORDER.index(c.ref.kind))
    for change in deletes:
        api.delete(change.ref)
        report(f"deleted {change.ref} (rlops's, no longer rendered)")


def owned_refs(api: KubeApi, env_name: str) -> list[Ref]:
    """Everything rlops applied to the cluster for this environment, in delete order (RayCluster first)."""
    return [Ref.of(obj) for kind in DELETE_ORDER for obj in api.list_labelled(kind, labels_for(env_name))]


def delete_all(api: KubeApi, env_name: str, report: Callable[[str], None]) -> None:
    for ref in owned_refs(api, env_name):
        api.delete(ref)
        report(f"deleted {ref}")


def wait_ready(api: KubeApi, rendered: list[dict], report: Callable[[str], None], timeout: float,
               max_poll_seconds: float = 5.0, progress_seconds: float = 30.0) -> None:
    """The gIB installer ready on every GPU node, then the RayCluster ready; progress, and a timeout that names what is not."""
    started = last_report = time.monotonic()
    delay = 0.1
    for obj in rendered:
        if obj["kind"] not in ("DaemonSet", "RayCluster"):
            continue
        ref = Ref.of(obj)
        while True:
            live = api.get(ref) or {}
            status = live.get("status") or {}
            ready, what = _readiness(obj["kind"], status)
            if ready:
                report(f"ready: {ref} ({what})")
                break
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                raise KubeError(f"{ref} not ready after {timeout:.0f}s: {what}")
            if time.monotonic() - last_report >= progress_seconds:
                report(f"[{elapsed:6.1f}s] waiting for {ref}: {what}")
                last_report = time.monotonic()
            time.sleep(delay)
            delay = min(max_poll_seconds, delay * 1.5)


def _readiness(kind: str, status: dict) -> tuple[bool, str]:
    if kind == "DaemonSet":
        wanted, ready = status.get("desiredNumberScheduled"), status.get("numberReady", 0)
        return wanted is not None and ready >= wanted, f"{ready} of {wanted if wanted is not None else '?'} nodes installed"
    state = status.get("state", "not reported")
    return state == "ready", f"state {state}"
