"""Bringing the cluster's objects to what rlops renders: plan by server-side dry run, apply, prune, wait.

The plan is Argo CD's server-side diff: each object is applied with `dryRun=All` under rlops's
field manager and what the server would store is compared with what it stores now, so defaults,
canonical quantities and fields other managers own are never drift, while a console edit of a
field rlops owns is. Only objects carrying rlops's labels for this environment are changed or
pruned; one that exists without them is refused, never taken over. A kind the server does not
serve yet (a CRD whose add-on is still coming up) is waited for, never listed or pruned.

Some fields are the cluster's once an object exists, and apply sends back what is live:
- worker replicas: the idle reaper's and the wake's (manager `rlops-reaper`);
- a PV's claimRef: the PV binder completes it with the claim's uid;
- a claim's storage request: a claim with storage class "" cannot be resized (the
  PersistentVolumeClaimResize admission refuses it); the PV's capacity is what grows.
A change the server refuses as immutable (a replaced Lustre instance's address in the PV's source)
is a replacement: the object and what holds it (the claim bound to the PV, the RayCluster whose
pods mount the claim) are deleted, waited on until gone, and created again.

KubeRay never changes a running pod when the RayCluster's template changes. From v1.6 the spec's
`upgradeStrategy: Recreate` makes it recreate every pod; an older KubeRay's CRD has no such field
(the server drops it, which the dry run shows), and rlops deletes the pods itself so that KubeRay
makes them again from the new template. Either way every pod of the cluster restarts, and so it does when
the RayCluster is replaced; so either change is held while a Ray job is pending or running, and applied by
the first apply after it ends. Only a list of jobs from the head says none runs: an answer that is not one
(the service proxy's 503 for a head pod failing its readiness probe, a timeout) holds the change as a
running job would, unless no head pod runs at all. Readiness counts only pods made from the current
template (render.TEMPLATE_DIGEST).

The Ray pods' namespace, when rlops renders it, is applied before everything else (an object in a namespace
that does not exist is refused). A Namespace is never pruned: deleting one deletes everything in it, rlops's
or not, so one no longer rendered (ray.namespace changed) stays, empty of rlops's objects, until destroy
deletes the environment's objects (`delete_all`, the Namespace last) or someone deletes it. A namespace that
exists without rlops's labels (made by hand) is used as it is: neither taken over nor refused.
"""

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlops.kube.cluster import KubeApi, KubeError
from rlops.kube.objects import SERVED_BY, ObjectChange, Ref
from rlops.kube.render import TEMPLATE_DIGEST, pod_templates, pods_made_from
from rlops.ownership import labels_for

# Deleted in this order (and applied in the reverse): what uses a thing goes before it.
DELETE_ORDER = ["RayCluster", "Secret", "ServiceAccount", "PersistentVolumeClaim", "PersistentVolume", "DaemonSet",
                "Network", "GKENetworkParamSet", "Namespace"]
NEVER_PRUNED = {"Namespace"}  # see the module's docstring
RAY_CLUSTER_LABEL = "ray.io/cluster"  # on every pod KubeRay makes (ray-operator utils/constant.go)
RAY_NODE_TYPE_LABEL = "ray.io/node-type"  # "head" or "worker", likewise
SERVER_METADATA = ("resourceVersion", "generation", "uid", "managedFields", "creationTimestamp", "selfLink")


def owned_by(obj: dict, env_name: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in labels_for(env_name).items())


def keep_live(rendered: dict, live: dict | None, replacing: bool = False) -> dict:
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


def shown(obj: dict) -> dict:
    """An object as the server holds it, without what the server writes about it (metadata, status)."""
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k not in SERVER_METADATA}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}


def differences(wanted, live, path: str = "") -> list[str]:
    """The paths at which two objects differ; list items named by their `name`/`groupName` where they have one.
    Only paths: a Secret's values never reach a plan."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        return [p for key in sorted(set(wanted) | set(live))
                for p in differences(wanted.get(key), live.get(key), f"{path}.{key}".lstrip("."))]
    if isinstance(wanted, list) and isinstance(live, list) and len(wanted) == len(live) and wanted != live:
        return [p for i, (a, b) in enumerate(zip(wanted, live)) for p in differences(a, b, f"{path}[{_label(a, i)}]")]
    return [] if wanted == live else [path]


def _label(item, index: int) -> str:
    return str(item.get("name") or item.get("groupName") or index) if isinstance(item, dict) else str(index)


def plan(api: KubeApi, env_name: str, rendered: list[dict], secret_values_known: bool) -> list[ObjectChange]:
    changes, wanted, lives = [], set(), {}
    for obj in rendered:
        ref = Ref.of(obj)
        wanted.add(ref)
        if not api.served(ref.kind):
            changes.append(ObjectChange(ref, "wait", desired=obj,
                                        reason=f"{ref.kind} is not served yet; {_served_by(ref.kind)} serves it"))
            continue
        live = lives[ref] = api.get(ref)
        if live is None:
            changes.append(ObjectChange(ref, "create", desired=obj))
            continue
        if not owned_by(live, env_name):
            if ref.kind == "Namespace":
                continue  # someone's namespace: the objects go into it, it stays theirs
            raise KubeError(f"{ref} exists without rlops's labels for {env_name}; rlops does not take over objects "
                            "it did not create: delete it or rename it in the spec")
        desired = keep_live(obj, live)
        restarts = ""
        if desired["kind"] == "Secret" and not secret_values_known:
            # A plan never reads the values: only which tokens there are can be compared.
            changed = [f"data.{k}" for k in sorted(set(desired.get("data", {})) ^ set(live.get("data") or {}))]
        else:
            try:
                after = api.apply(desired, dry_run=True)
            except KubeError as error:
                if error.code != 422 or "immutable" not in error.said:
                    raise
                changes.append(ObjectChange(ref, "replace", desired=keep_live(obj, live, replacing=True),
                                            reason=f"the server cannot change it in place: {error.said}"))
                continue
            changed = differences(shown(after), shown(live))
            if desired["kind"] == "RayCluster" and pods_made_from(after) != pods_made_from(live):
                restarts = "KubeRay" if after["spec"].get("upgradeStrategy", {}).get("type") == "Recreate" else "rlops"
        if changed:
            changes.append(ObjectChange(ref, "update", changed, desired, restarts_pods=restarts))
    changes = _with_holders_replaced(changes, rendered, lives)
    changes += [ObjectChange(ref, "delete") for ref in owned_refs(api, env_name)
                if ref not in wanted and ref.kind not in NEVER_PRUNED]
    return changes


def _served_by(kind: str) -> str:
    return SERVED_BY.get(kind, "its CRD")


def _holds(holder: dict, held: Ref) -> bool:
    """A claim holds the volume it is bound to; a RayCluster's pods hold the claims they mount."""
    if holder["kind"] == "PersistentVolumeClaim" and held.kind == "PersistentVolume":
        return holder["spec"].get("volumeName") == held.name
    if holder["kind"] == "RayCluster" and held.kind == "PersistentVolumeClaim":
        return held.name in _claims_mounted(holder)
    return False


def _claims_mounted(ray_cluster: dict) -> set[str]:
    return {volume["persistentVolumeClaim"]["claimName"] for template in pod_templates(ray_cluster)
            for volume in template["spec"].get("volumes", []) if "persistentVolumeClaim" in volume}


def template_digest_of(ray_cluster: dict) -> str | None:
    """The digest a RayCluster's head template carries (None for one rlops made before it stamped one)."""
    template = ray_cluster["spec"]["headGroupSpec"]["template"]
    return ((template.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_DIGEST)


def _with_holders_replaced(changes: list[ObjectChange], rendered: list[dict],
                           lives: dict[Ref, dict | None]) -> list[ObjectChange]:
    by_ref = {c.ref: c for c in changes}
    pending = [c.ref for c in changes if c.action == "replace"]
    while pending:
        held = pending.pop()
        for obj in rendered:
            ref = Ref.of(obj)
            existing = by_ref.get(ref)
            if _holds(obj, held) and (existing is None or existing.action == "update"):
                by_ref[ref] = ObjectChange(ref, "replace", desired=keep_live(obj, lives.get(ref), replacing=True),
                                           reason=f"it holds {held}, which is replaced")
                pending.append(ref)
    return [by_ref.get(Ref.of(obj)) for obj in rendered if Ref.of(obj) in by_ref] + \
        [c for c in changes if c.desired is None]


class Held(KubeError):
    """A change that would restart the RayCluster's pods under a live Ray job was not applied."""


def restarts_pods(change: ObjectChange) -> bool:
    """Whether applying the change ends every pod of a RayCluster: a template change, or deleting and creating
    the RayCluster again (a replacement)."""
    return bool(change.restarts_pods) or (change.action == "replace" and change.ref.kind == "RayCluster")


def apply(api: KubeApi, changes: list[ObjectChange], report: Callable[[str], None], timeout: float = 600.0,
          active_jobs: Callable[[], list[str]] = lambda: []) -> None:
    """Waits for kinds not served yet, replaces what cannot change in place (deleting in order and waiting
    until each is gone), applies the rest, prunes what is no longer rendered. A change that restarts the
    RayCluster's pods (`restarts_pods`) is held (`Held`, after everything else is done) while `active_jobs`
    names any job, or cannot say (it raised) while a head pod runs; so is a replacement the RayCluster's own
    replacement needs (the claim it mounts, the volume bound to that)."""
    for kind in dict.fromkeys(c.ref.kind for c in changes if c.action == "wait"):
        _wait_for(lambda: (api.forget_served(), api.served(kind))[1], timeout, report,  # noqa: B023 - called at once
                  f"{kind} to be served ({_served_by(kind)})")
    # Asked after the waits above, as close to the restart as the order of the writes allows.
    restarting = [c for c in changes if restarts_pods(c)]
    busy = _busy(api, restarting, active_jobs, report) if restarting else None
    held = _with_what_they_need(restarting, changes) if busy else []
    if held:
        changes = [c for c in changes if c not in held]
    replaced = sorted((c for c in changes if c.action == "replace"), key=lambda c: DELETE_ORDER.index(c.ref.kind))
    for change in replaced:
        report(f"replacing {change.ref}: {change.reason}")
        api.delete(change.ref)
        _wait_for(lambda: api.get(change.ref) is None, timeout, report, f"{change.ref} to be gone")  # noqa: B023
    writes = sorted((c for c in changes if c.desired is not None), key=lambda c: -DELETE_ORDER.index(c.ref.kind))
    for change in writes:
        api.apply(change.desired)
        report(f"applied {change.ref} ({change.action})")
        if change.restarts_pods == "rlops":
            _recreate_pods(api, change.ref, report, timeout)
        elif change.restarts_pods:
            report(f"KubeRay recreates the pods of {change.ref} (upgradeStrategy Recreate); no Ray job is pending "
                   "or running")
    deletes = sorted((c for c in changes if c.action == "delete"), key=lambda c: DELETE_ORDER.index(c.ref.kind))
    for change in deletes:
        api.delete(change.ref)
        report(f"deleted {change.ref} (rlops's, no longer rendered)")
    if held:
        raise Held("held, not applied: " + "; ".join(_held_line(c) for c in held) + f": {busy.why}. Everything "
                   f"else is applied; run apply again once {busy.until}")


@dataclass(frozen=True)
class Busy:
    why: str    # what keeps the pods from being restarted now
    until: str  # what lets the next apply go ahead


def _busy(api: KubeApi, restarting: list[ObjectChange], active_jobs: Callable[[], list[str]],
          report: Callable[[str], None]) -> Busy | None:
    """Why the RayCluster's pods may not be restarted now, or None. Only a list of jobs from the head says no
    job runs; any other answer (the API server's proxy saying 503 "no endpoints available", a timeout, a body
    that is not a list) counts as a job running, unless no head pod runs at all: without its head (the GCS,
    the job supervisor) no Ray job can run."""
    try:
        running = active_jobs()
    except Exception as error:  # noqa: BLE001 - whatever kept the answer from coming, it is not "no jobs"
        heads = sorted({pod["metadata"]["name"] for c in restarting if c.ref.kind == "RayCluster"
                        for pod in api.list_labelled("Pod", {RAY_CLUSTER_LABEL: c.ref.name,
                                                             RAY_NODE_TYPE_LABEL: "head"}, c.ref.namespace)
                        if (pod.get("status") or {}).get("phase") == "Running"})
        if not heads:
            report(f"the Ray head did not answer which jobs run ({error}), and no head pod runs: no Ray job can run")
            return None
        return Busy(f"the Ray head did not answer which jobs run ({error}) while its pod {', '.join(heads)} runs: "
                    "held as if a job ran",
                    "the Ray head answers (its dashboard, through the API server's service proxy) and no job is "
                    "pending or running")
    if not running:
        return None
    return Busy(f"Ray job(s) {', '.join(running)} pending or running",
                "the job(s) have ended (or stop them: `ray job stop`)")


def _with_what_they_need(restarting: list[ObjectChange], changes: list[ObjectChange]) -> list[ObjectChange]:
    """The changes held with `restarting`: a replacement its RayCluster's replacement depends on (the claim its
    pods mount cannot go while they run, nor the volume while the claim is bound to it)."""
    held = list(restarting)
    for holder in held:  # grows while it is walked
        for change in changes:
            if change not in held and change.action == "replace" and holder.desired is not None \
                    and _holds(holder.desired, change.ref):
                held.append(change)
    return held


def _held_line(change: ObjectChange) -> str:
    if change.restarts_pods:
        return f"{change.ref} ({', '.join(change.fields)}) would restart every pod"
    if change.ref.kind == "RayCluster":
        return f"{change.ref} would be deleted and created again, every pod with it ({change.reason})"
    return f"with it, the replacement of {change.ref} ({change.reason})"


def _recreate_pods(api: KubeApi, ref: Ref, report: Callable[[str], None], timeout: float) -> None:
    """Deletes the RayCluster's pods once KubeRay has seen the new spec: a KubeRay still on the old one
    would make them again from the old template."""
    def seen() -> bool:
        live = api.get(ref) or {}
        observed = (live.get("status") or {}).get("observedGeneration")
        return observed is not None and observed >= live.get("metadata", {}).get("generation", 0)

    _wait_for(seen, timeout, report, f"KubeRay to see the new spec of {ref}")
    pods = api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name}, ref.namespace)
    report(f"recreating the {len(pods)} pods of {ref}: this KubeRay has no upgradeStrategy (before v1.6) and "
           "keeps running pods on their old template; no Ray job is pending or running")
    for pod in pods:
        api.delete(Ref("Pod", pod["metadata"]["name"], ref.namespace))


def _wait_until(check: Callable[[], tuple[bool, str]], subject: str, timeout: float, report: Callable[[str], None],
                started: float | None = None, max_poll_seconds: float = 5.0,
                progress_seconds: float = 30.0) -> tuple[bool, str]:
    """Calls `check` (-> done, what it saw) with growing pauses until it is done or `timeout` has passed since
    `started`; every `progress_seconds` reports what it saw. Returns the last (done, what it saw)."""
    started = time.monotonic() if started is None else started
    last_report, delay = time.monotonic(), 0.05
    while True:
        done, seen = check()
        elapsed = time.monotonic() - started
        if done or elapsed > timeout:
            return done, seen
        if time.monotonic() - last_report >= progress_seconds:
            report(f"[{elapsed:6.1f}s] waiting for {subject}" + (f": {seen}" if seen else ""))
            last_report = time.monotonic()
        time.sleep(delay)
        delay = min(max_poll_seconds, delay * 1.5)


def _wait_for(condition: Callable[[], bool], timeout: float, report: Callable[[str], None], subject: str) -> None:
    if not _wait_until(lambda: (condition(), ""), subject, timeout, report)[0]:
        raise KubeError(f"gave up after {timeout:.0f}s waiting for {subject}; a re-run of apply continues from here")


def owned_refs(api: KubeApi, env_name: str) -> list[Ref]:
    """Everything rlops applied to the cluster for this environment, in delete order (RayCluster first);
    kinds the server does not serve have nothing to list."""
    return [Ref.of(obj) for kind in DELETE_ORDER for obj in api.list_labelled(kind, labels_for(env_name))]


def delete_all(api: KubeApi, env_name: str, report: Callable[[str], None]) -> None:
    for ref in owned_refs(api, env_name):
        api.delete(ref)
        report(f"deleted {ref}")


@dataclass(frozen=True)
class Readiness:
    ready: bool
    what: str


def wait_ready(api: KubeApi, rendered: list[dict], report: Callable[[str], None], timeout: float,
               min_workers: dict[str, int] | None = None) -> None:
    """The gIB installer rolled out to every GPU node, then the RayCluster's head ready and at least
    `min_workers` (per worker group) of its workers; progress, and a timeout that names what is not."""
    started = time.monotonic()
    for ref in (Ref.of(obj) for obj in rendered if obj["kind"] in ("DaemonSet", "RayCluster")):
        def look(ref: Ref = ref) -> tuple[bool, str]:
            live = api.get(ref) or {}
            readiness = readiness_of(live, min_workers or {})
            if readiness.ready and ref.kind == "RayCluster":
                pods = pods_current(live, api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name}, ref.namespace))
                readiness = Readiness(pods.ready, f"{readiness.what}; {pods.what}")
            return readiness.ready, readiness.what

        ready, seen = _wait_until(look, str(ref), timeout, report, started)
        if not ready:
            raise KubeError(f"{ref} not ready after {timeout:.0f}s: {seen}")
        report(f"ready: {ref} ({seen})")


def readiness_of(live: dict, min_workers: dict[str, int]) -> Readiness:
    """From what the controllers publish about the object's current generation; a status about an older
    generation (`observedGeneration` behind) says nothing about this one."""
    status = live.get("status") or {}
    generation = live.get("metadata", {}).get("generation")
    if status.get("observedGeneration") is None or (generation and status["observedGeneration"] < generation):
        return Readiness(False, f"the controller has not seen generation {generation} yet")
    if live.get("kind") == "DaemonSet":
        wanted = status.get("desiredNumberScheduled", 0)
        updated, ready = status.get("updatedNumberScheduled", 0), status.get("numberReady", 0)
        return Readiness(updated >= wanted and ready >= wanted,
                         f"{min(updated, ready)} of {wanted} nodes installed with the current template")
    return _ray_cluster_readiness(live, status, min_workers)


def pods_current(ray_cluster: dict, pods: list[dict]) -> Readiness:
    """Whether every pod of the cluster (not on its way out) was made from its current template: KubeRay
    does not replace running pods unless told to (see the module's docstring)."""
    digest = template_digest_of(ray_cluster)
    live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
    old = [pod["metadata"]["name"] for pod in live
           if (pod["metadata"].get("annotations") or {}).get(TEMPLATE_DIGEST) != digest]
    if digest is None or not old:
        return Readiness(True, f"{len(live)} pods on the current template")
    return Readiness(False, f"{len(old)} of {len(live)} pods still run an older template ({', '.join(sorted(old))})")


def _ray_cluster_readiness(live: dict, status: dict, min_workers: dict[str, int]) -> Readiness:
    """KubeRay >= 1.3 publishes conditions (HeadPodReady) and readyWorkerReplicas; 1.1-1.2 only `state`,
    which goes to ready once and stays (raycluster_controller.go calculateStatus)."""
    groups = live.get("spec", {}).get("workerGroupSpecs", [])
    needed = sum(min(g.get("replicas", 0), min_workers.get(g["groupName"], g.get("replicas", 0)))
                 * g.get("numOfHosts", 1) for g in groups)
    desired = status.get("desiredWorkerReplicas", sum(g.get("replicas", 0) * g.get("numOfHosts", 1) for g in groups))
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    if "HeadPodReady" not in conditions:
        return Readiness(status.get("state") == "ready", f"state {status.get('state', 'not reported')}")
    head = conditions["HeadPodReady"]["status"] == "True"
    ready = status.get("readyWorkerReplicas", status.get("availableWorkerReplicas", 0))
    what = (f"head {'ready' if head else 'not ready (' + conditions['HeadPodReady'].get('reason', '') + ')'}, "
            f"{ready} of {desired} workers ready, {needed} needed")
    return Readiness(head and ready >= needed, what)
