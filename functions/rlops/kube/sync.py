"""Bringing the cluster's objects to what rlops renders: plan by server-side dry run, apply, prune, wait.

The plan is Argo CD's server-side diff: each object is applied with `dryRun=All` under rlops's
field manager and what the server would store is compared with what it stores now, so defaults,
canonical quantities and fields other managers own are never drift, while a console edit of a
field rlops owns is. Only objects carrying rlops's labels for this environment are changed or
pruned; one that exists without them is refused, never taken over. A kind the server does not
serve yet (a CRD whose add-on is still coming up) is waited for, never listed or pruned.

Some fields are the cluster's once an object exists, and apply sends back what is live (`diff.keep_live`).
A change the server refuses as immutable (a replaced Lustre instance's address in the PV's source)
is a replacement: the object and what holds it (the claim bound to the PV, the RayCluster whose
pods mount the claim) are deleted, waited on until gone, and created again.

KubeRay never changes a running pod when the RayCluster's template changes. From v1.6 the spec's
`upgradeStrategy: Recreate` makes it recreate every pod; an older KubeRay's CRD has no such field (the server
drops it, which the dry run shows), and rlops deletes the pods itself so that KubeRay makes them again from the
new template. Nothing here waits for the RayCluster's `status.observedGeneration`, which moves only with its
pods: what rlops reads is the pods, each carrying its template's digest (`kube.readiness`). After a template
change rlops waits until a head pod and every other pod carry the new digest, deleting the pods on an older one
itself when KubeRay will not: before v1.6 (and again if KubeRay, its cache behind, made them from the old spec);
from v1.6 when the head pod has no `ray.io/upgrade-strategy-recreate-hash` (made by a KubeRay before v1.6:
Recreate never replaces it), when its `ray.io/kuberay-version` changed while rlops waited (an upgraded operator's
first reconcile stamps its hash and recreates nothing: `shouldRecreatePodsForUpgrade`, raycluster_controller.go
v1.6.0), or when KubeRay has not started in `KUBERAY_GRACE_SECONDS`. A plan that finds pods on an older template
with no spec change (an apply stopped while waiting) plans their recreation, so a re-run finishes the job. Either
way every pod of the cluster restarts, and so it does when the RayCluster is replaced; so either change is held
while a Ray job is pending or running, and applied by the first apply after it ends. Only a list of jobs from the
head says none runs: an answer that is not one (the service proxy's 503 for a head pod failing its readiness
probe, a timeout) holds the change as a running job would, unless no head pod runs at all. Then apply waits until
what it applied is ready (`kube.readiness`).

The Ray pods' namespace, when rlops renders it, is applied before everything else (an object in a namespace
that does not exist is refused). A Namespace is never pruned: deleting one deletes everything in it, rlops's
or not, so one no longer rendered (ray.namespace changed) stays, empty of rlops's objects, until destroy
deletes the environment's objects (`delete_all`, the Namespace last) or someone deletes it. A namespace that
exists without rlops's labels (made by hand) is used as it is: neither taken over nor refused.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlops.kube.cluster import KubeApi, KubeError
from rlops.kube.diff import differences, holds, keep_live, owned_by, shown, with_holders_replaced
from rlops.kube.objects import SERVED_BY, Manifest, ObjectChange, Ref, spec_of
from rlops.kube.readiness import (
    RAY_CLUSTER_LABEL,
    RAY_NODE_TYPE_LABEL,
    annotation,
    pods_behind,
    ray_cluster_readiness,
    readiness_of,
    template_digest_of,
)
from rlops.kube.render import TEMPLATE_DIGEST, pods_made_from
from rlops.ownership import labels_for

# Deleted in this order (and applied in the reverse): what uses a thing goes before it.
DELETE_ORDER = ["RayCluster", "Secret", "ServiceAccount", "PersistentVolumeClaim", "PersistentVolume", "DaemonSet",
                "Network", "GKENetworkParamSet", "Namespace"]
NEVER_PRUNED = {"Namespace"}  # see the module's docstring
# On the head pod from KubeRay v1.6 (utils/constant.go UpgradeStrategyRecreateHashKey, KubeRayVersion).
RECREATE_HASH = "ray.io/upgrade-strategy-recreate-hash"
KUBERAY_VERSION = "ray.io/kuberay-version"
KUBERAY_GRACE_SECONDS = 60.0  # how long KubeRay's Recreate may take to start before rlops deletes the pods


def plan(api: KubeApi, env_name: str, rendered: list[Manifest], secret_values_known: bool) -> list[ObjectChange]:
    changes: list[ObjectChange] = []
    wanted: set[Ref] = set()
    lives: dict[Ref, Manifest | None] = {}
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
                restarts = "KubeRay" if spec_of(after).get("upgradeStrategy", {}).get("type") == "Recreate" else "rlops"
            elif desired["kind"] == "RayCluster":
                behind = pods_behind(after, api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name}, ref.namespace))
                if behind:
                    changes.append(ObjectChange(
                        ref, "update", changed, desired, restarts_pods="leftover",
                        reason=f"{len(behind)} pods on an older template ({', '.join(behind)}), with no spec change "
                               "left to make: an apply stopped before they were recreated"))
                    continue
        if changed:
            changes.append(ObjectChange(ref, "update", changed, desired, restarts_pods=restarts))
    changes = with_holders_replaced(changes, rendered, lives)
    changes += [ObjectChange(ref, "delete") for ref in owned_refs(api, env_name)
                if ref not in wanted and ref.kind not in NEVER_PRUNED]
    return changes


def plan_between(base: list[Manifest], head: list[Manifest]) -> list[ObjectChange]:
    """The objects' changes from one rendering to another, without a cluster (a reviewer's offline plan): what
    differs, and whether the RayCluster's pods restart. No server to ask, so no defaults, no replacements the
    server would refuse in place; Secrets are compared by their tokens' names only (both renderings redact)."""
    before = {Ref.of(obj): obj for obj in base}
    changes = []
    for obj in head:
        ref = Ref.of(obj)
        if ref not in before:
            changes.append(ObjectChange(ref, "create", desired=obj))
            continue
        changed = differences(obj, before[ref])
        if not changed:
            continue
        restarts = ""
        if obj["kind"] == "RayCluster" and pods_made_from(obj) != pods_made_from(before[ref]):
            restarts = "KubeRay" if spec_of(obj).get("upgradeStrategy", {}).get("type") == "Recreate" else "rlops"
        changes.append(ObjectChange(ref, "update", changed, obj, restarts_pods=restarts))
    wanted = {Ref.of(obj) for obj in head}
    return changes + [ObjectChange(ref, "delete") for ref in before
                      if ref not in wanted and ref.kind not in NEVER_PRUNED]


def _served_by(kind: str) -> str:
    return SERVED_BY.get(kind, "its CRD")


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
    writes = sorted(((c, c.desired) for c in changes if c.desired is not None),
                    key=lambda write: -DELETE_ORDER.index(write[0].ref.kind))
    for change, desired in writes:
        head_before = _head_pod(api, change.ref) if change.restarts_pods == "KubeRay" else None
        api.apply(desired)
        report(f"applied {change.ref} ({change.action})")
        if change.restarts_pods == "KubeRay":
            report(f"KubeRay recreates the pods of {change.ref} (upgradeStrategy Recreate); no Ray job is pending "
                   "or running")
        if change.restarts_pods:
            _recreate_pods(api, change, desired, report, timeout, head_before)
    deletes = sorted((c for c in changes if c.action == "delete"), key=lambda c: DELETE_ORDER.index(c.ref.kind))
    for change in deletes:
        api.delete(change.ref)
        report(f"deleted {change.ref} (rlops's, no longer rendered)")
    if held and busy is not None:
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
    except Exception as error:  # whatever kept the answer from coming, it is not "no jobs"
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
                    and holds(holder.desired, change.ref):
                held.append(change)
    return held


def _held_line(change: ObjectChange) -> str:
    if change.restarts_pods:
        return f"{change.ref} ({', '.join(change.fields)}) would restart every pod"
    if change.ref.kind == "RayCluster":
        return f"{change.ref} would be deleted and created again, every pod with it ({change.reason})"
    return f"with it, the replacement of {change.ref} ({change.reason})"


def _head_pod(api: KubeApi, ref: Ref) -> Manifest | None:
    heads = [pod for pod in api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name, RAY_NODE_TYPE_LABEL: "head"},
                                              ref.namespace) if not pod["metadata"].get("deletionTimestamp")]
    return heads[0] if heads else None


def _why_rlops_deletes(restarts_pods: str, digest: str | None, head_before: Manifest | None, head: Manifest | None,
                       waited: float) -> str | None:
    """Why rlops deletes pods on an older template itself, or None while KubeRay is to (see the module's docstring):
    `restarts_pods` the change's, `digest` its new template's."""
    if restarts_pods == "rlops":
        return "this KubeRay has no upgradeStrategy (before v1.6) and keeps running pods on their old template"
    if restarts_pods == "leftover":
        return "an earlier apply stopped before they were recreated"
    if head is not None and annotation(head, TEMPLATE_DIGEST) != digest:
        if not annotation(head, RECREATE_HASH):
            return (f"the head pod {head['metadata']['name']} has no {RECREATE_HASH}: a KubeRay before v1.6 made it, "
                    "and upgradeStrategy Recreate never replaces such a pod")
        before, now = annotation(head_before, KUBERAY_VERSION), annotation(head, KUBERAY_VERSION)
        if head_before is not None and before != now:
            return (f"the Ray operator was upgraded ({KUBERAY_VERSION} {before} -> {now}): its first reconcile "
                    "stamped its hash on the head pod and recreated nothing")
    if waited >= KUBERAY_GRACE_SECONDS:
        return f"KubeRay's upgradeStrategy Recreate did not start in {KUBERAY_GRACE_SECONDS:.0f}s"
    return None


def _recreate_pods(api: KubeApi, change: ObjectChange, desired: Manifest, report: Callable[[str], None],
                   timeout: float, head_before: Manifest | None) -> None:
    """Waits until a head pod and every other pod of the RayCluster carry its new template's digest (`desired`, the
    RayCluster applied), deleting those on an older one when KubeRay will not (`_why_rlops_deletes`), again if
    KubeRay makes them from the old spec (its cache behind the write). No observedGeneration: see the module's
    docstring."""
    ref, digest, started = change.ref, template_digest_of(desired), time.monotonic()
    said: set[str] = set()

    def look() -> tuple[bool, str]:
        pods = [pod for pod in api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name}, ref.namespace)
                if not pod["metadata"].get("deletionTimestamp")]
        behind = pods_behind(desired, pods)
        heads = [pod for pod in pods if pod["metadata"]["labels"].get(RAY_NODE_TYPE_LABEL) == "head"]
        current_head = any(annotation(pod, TEMPLATE_DIGEST) == digest for pod in heads)
        if not behind and (current_head or digest is None):
            return True, f"{len(pods)} pods on the new template"
        if not behind:
            return False, "no head pod on the new template yet"
        why = _why_rlops_deletes(change.restarts_pods, digest, head_before, heads[0] if heads else None,
                                 time.monotonic() - started)
        if why is None:
            return False, f"{len(behind)} of {len(pods)} pods on an older template; KubeRay recreates them"
        if why not in said:
            said.add(why)
            report(f"recreating the {len(behind)} pods of {ref} on an older template ({why}); no Ray job is "
                   "pending or running")
        for name in behind:
            api.delete(Ref("Pod", name, ref.namespace))
        return False, f"deleted {len(behind)} pods on an older template ({why}); KubeRay makes them again"

    done, seen = _wait_until(look, f"the pods of {ref} to be made from the new template", timeout, report)
    if not done:
        raise KubeError(f"gave up after {timeout:.0f}s waiting for the pods of {ref} to be made from the new "
                        f"template: {seen}; a re-run of apply continues from here")


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


def wait_ready(api: KubeApi, rendered: list[Manifest], report: Callable[[str], None], timeout: float,
               min_workers: dict[str, int] | None = None) -> None:
    """The gIB installer rolled out to every GPU node, then the RayCluster's head ready and at least
    `min_workers` (per worker group) of its workers, on its current template; progress, and a timeout that
    names what is not."""
    started = time.monotonic()
    for ref in (Ref.of(obj) for obj in rendered if obj["kind"] in ("DaemonSet", "RayCluster")):
        def look(ref: Ref = ref) -> tuple[bool, str]:
            live = api.get(ref)
            if live is None:
                return False, "not found"
            if ref.kind == "DaemonSet":
                readiness = readiness_of(live)
            else:
                pods = api.list_labelled("Pod", {RAY_CLUSTER_LABEL: ref.name}, ref.namespace)
                readiness = ray_cluster_readiness(live, pods, min_workers or {})
            return readiness.ready, readiness.what

        ready, seen = _wait_until(look, str(ref), timeout, report, started)
        if not ready:
            raise KubeError(f"{ref} not ready after {timeout:.0f}s: {seen}")
        report(f"ready: {ref} ({seen})")
