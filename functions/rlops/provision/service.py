"""plan, apply and destroy of whole environments: the spec, the state bucket and the adapters together."""

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rlops import environments
from rlops.cloud import git
from rlops.cloud.base import Connection, Target
from rlops.errors import Failure
from rlops.provision import engine, pricing, resources
from rlops.provision.plan import Action, Plan, build_plan, data_loss_refusals
from rlops.resource_shapes import Live, Resource
from rlops.spec import images
from rlops.spec.load import SpecError, load, load_text
from rlops.spec.model import GcpEnvironment
from rlops.state.lock import Lock
from rlops.state.resources import AppliedSpec, ResourceRecord


class Refused(Failure):
    """The plan may not run as it is (a data-losing change, a resource rlops does not own)."""


class Superseded(Failure):
    """A newer commit than the one this apply was asked to carry out is applied, or being applied, already."""


def target_of(name: str, env: GcpEnvironment) -> Target:
    return Target(name, env.project.id, env.project.number, env.region, env.zone, env.cluster.name)


@dataclass
class CloudEnvironment:
    """A GCP environment's spec with its name: what plan, apply and destroy work on."""

    name: str
    spec: GcpEnvironment

    @property
    def desired(self) -> list[Resource]:
        return resources.topological(resources.build(self.name, self.spec))

    @property
    def digest(self) -> str:
        """The spec's meaning, not its text: comments and key order do not change it."""
        canonical = json.dumps(self.spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def workspace(env: CloudEnvironment, connection: Connection, bucket, adapters: dict | None = None) -> engine.Workspace:
    from rlops.cloud import adapters as build_adapters

    record = ResourceRecord(bucket, env.spec.state.prefix, env.name).load()
    return engine.Workspace(env.name, env.desired,
                            adapters if adapters is not None
                            else build_adapters(target_of(env.name, env.spec), connection),
                            record)


def plan_live(envs: list[CloudEnvironment], connection: Connection, bucket_of: Callable[[CloudEnvironment], object],
              with_cluster_objects: bool = True) -> list[Plan]:
    """Plans of several environments from one round of parallel reads.

    The state records and the clusters' objects are read one environment per thread too: each is
    a round trip of its own, and ten environments should cost about what one does.
    """
    with ThreadPoolExecutor(max_workers=max(1, len(envs)), thread_name_prefix="plan") as pool:
        spaces = list(pool.map(lambda env: workspace(env, connection, bucket_of(env)), envs))
        live = engine.read_live(spaces)
        plans = [apply_plan(env, live[env.name]) for env in envs]
        for plan, env in zip(plans, envs, strict=True):
            plan.cost = pricing.plan_cost(plan, env.spec)
        if with_cluster_objects:
            changes = pool.map(lambda env: cluster_changes(env, live[env.name], connection, False), envs)
            for plan, objects in zip(plans, changes, strict=True):
                plan.cluster_objects = list(objects)
    return plans


def rendered_objects(env: CloudEnvironment, live: dict[str, Live], connection: Connection,
                     with_secrets: bool) -> list[dict]:
    """The in-cluster objects; before Lustre exists its address is a placeholder (the objects wait for it anyway)."""
    from rlops.kube import render

    lustre = live.get(f"lustre_instance/{env.spec.lustre.name}")
    mount_point = lustre.fields.get("mount_point") if lustre else None
    facts = (render.LiveFacts.from_mount_point(mount_point) if mount_point
             else render.LiveFacts(render.UNKNOWN_LUSTRE_IP))
    values = None
    if with_secrets:
        from rlops.cloud import secretmanager
        values = secretmanager.access(connection, {name: ref.secret_manager for name, ref in env.spec.secrets.items()})
    return render.objects(env.name, env.spec, facts, values)


def cluster_api(env: CloudEnvironment, live: dict[str, Live], connection: Connection):
    """The cluster's Kubernetes API, or None while the cluster does not exist."""
    from rlops.kube.cluster import connect

    cluster = live.get(f"cluster/{env.spec.cluster.name}")
    return None if cluster is None else connect(cluster.fields.get("dns_endpoint_host"), connection.endpoints)


def cluster_changes(env: CloudEnvironment, live: dict[str, Live], connection: Connection, with_secrets: bool) -> list:
    from rlops.kube import sync
    from rlops.kube.objects import ObjectChange, Ref

    rendered = rendered_objects(env, live, connection, with_secrets)
    api = cluster_api(env, live, connection)
    if api is None:
        return [ObjectChange(Ref.of(obj), "create", desired=obj) for obj in rendered]
    return sync.plan(api, env.name, rendered, secret_values_known=with_secrets)


def read_one(env: CloudEnvironment, connection: Connection, bucket) -> dict[str, Live]:
    return engine.read_live([workspace(env, connection, bucket)])[env.name]


def plan_offline(env: CloudEnvironment, base: CloudEnvironment | None) -> Plan:
    """The plan a reviewer sees without credentials: the spec against the base revision's spec, the cluster's
    objects as each renders them (what changes, and whether the Ray pods restart), and what it adds an hour."""
    from rlops.kube import render, sync

    live = {} if base is None else {r.key: Live(r.desired, True, r.depends_on) for r in base.desired}
    plan = apply_plan(env, live)
    facts = render.LiveFacts(render.UNKNOWN_LUSTRE_IP)
    plan.cluster_objects = sync.plan_between(
        [] if base is None else render.objects(base.name, base.spec, facts), render.objects(env.name, env.spec, facts))
    plan.cost = pricing.plan_cost(plan, env.spec)
    return plan


def plan_for_review(env: CloudEnvironment, connection: Connection, bucket) -> tuple[Plan, dict[str, Live]]:
    """A live plan with the live state it read: what `rlops plan --out` saves (`saved.SavedPlan`)."""
    live = read_one(env, connection, bucket)
    plan = apply_plan(env, live)
    plan.cluster_objects = cluster_changes(env, live, connection, False)
    plan.cost = pricing.plan_cost(plan, env.spec)
    return plan, live


def base_environment(path: Path, revision: str) -> CloudEnvironment | None:
    text = git.file_at(path, revision)
    if text is None:
        return None
    loaded = load_text(text, path.stem, f"{path}@{revision}")
    if loaded.problems:
        raise SpecError(loaded.problems)
    if not isinstance(loaded.environment, GcpEnvironment):
        return None
    return CloudEnvironment(path.stem, loaded.environment)


def apply_plan(env: CloudEnvironment, live: dict[str, Live]) -> Plan:
    """What an apply of the spec would change in `live`; an image cache another environment still uses stays when
    this spec stops using it (`ray.image_cache: false`)."""
    plan = build_plan(env.name, env.desired, live)
    _keep_shared_caches(env, plan)
    return plan


def destroy_plan(env: CloudEnvironment, live: dict[str, Live], delete_data: bool) -> Plan:
    """Everything rlops owns, deleted; a Lustre instance (and what it stands on) kept unless both say delete, and an
    image cache another environment uses."""
    plan = build_plan(env.name, [], live)
    for change in plan.changes:
        change.reason = "destroy"
    if env.spec.lustre.deletion_policy != "delete" or not delete_data:
        keep = _with_dependencies([c.key for c in plan.changes if c.kind == "lustre_instance"], live)
        if keep:
            plan.changes = [c for c in plan.changes if c.key not in keep]
            why = ("lustre.deletion_policy is retain" if env.spec.lustre.deletion_policy != "delete"
                   else "--delete-data was not given")
            plan.kept.append(f"kept, with its data: {', '.join(sorted(keep))} ({why})")
    _keep_shared_caches(env, plan)
    return plan


def _keep_shared_caches(env: CloudEnvironment, plan: Plan) -> None:
    deleted = [c for c in plan.changes if c.kind == "remote_repository" and c.action == Action.DELETE]
    if not deleted:  # the other specs are read only when a cache would go: most plans delete none
        return
    shared = _repositories_used_elsewhere(env)
    kept = [c for c in deleted if c.key in shared]
    plan.changes = [c for c in plan.changes if c not in kept]
    plan.kept += [f"kept: {c.key} (the image cache of {', '.join(shared[c.key])} too)" for c in kept]


def _repositories_used_elsewhere(env: CloudEnvironment) -> dict[str, list[str]]:
    """The image caches other environments' specs (environments/, as they are now) use in this environment's
    project and region: {remote_repository/NAME: [their names]}. A spec that does not load is not counted; the
    specs are what says who uses a cache, not the other environments' records."""
    used: dict[str, list[str]] = {}
    for path in environments.spec_files():
        if path.stem == env.name:
            continue
        other = load(path).environment
        if not isinstance(other, GcpEnvironment) or not other.ray.image_cache or \
                (other.project.id, other.region) != (env.spec.project.id, env.spec.region):
            continue
        cache = images.upstream(other.ray.image)
        if cache is not None:
            used.setdefault(f"remote_repository/{cache.repository}", []).append(path.stem)
    return used


def _with_dependencies(keys: list[str], live: dict[str, Live]) -> set[str]:
    found, stack = set(), list(keys)
    while stack:
        key = stack.pop()
        if key not in found:
            found.add(key)
            stack.extend(live[key].depends_on if key in live else ())
    return found


@dataclass
class Session:
    """One apply or destroy of one environment, under its lock."""

    env: CloudEnvironment
    connection: Connection
    bucket: object
    report: Callable[[str], None]
    lock_timeout: float = 600.0
    ready_timeout: float = 1800.0

    def _lock(self, operation: str) -> Lock:
        lock = Lock(self.bucket, self.env.spec.state.prefix, self.env.name, operation=operation)
        said = []

        def waiting(held: dict) -> None:
            if not said:
                self.report(f"waiting for the lock on {self.env.name}: held by {held['holder']} ({held['operation']} "
                            f"since {held['since']}); giving up after {self.lock_timeout:.0f}s")
                said.append(True)

        lock.acquire(self.lock_timeout, on_wait=waiting)
        return lock

    def apply(self, delete_data: bool = False, confirm: Callable[[Plan], bool] = lambda plan: True,
              commit: str | None = None, newer: Callable[[str], bool] = lambda other: False,
              reviewed=None) -> Plan:
        """`commit`: the git commit whose spec this is (a pipeline's); refused (`Superseded`) when the state
        records a commit `newer` says is newer: Cloud Build runs two pushes' builds in any order. `reviewed`: a
        `saved.SavedPlan`, applied only if nothing it was made from moved (then `confirm` is not asked)."""
        return self._run("apply", delete_data, confirm, commit, newer, reviewed)

    def destroy(self, delete_data: bool, confirm: Callable[[Plan], bool]) -> Plan:
        return self._run("destroy", delete_data, confirm)

    def _run(self, operation: str, delete_data: bool, confirm: Callable[[Plan], bool], commit: str | None = None,
             newer: Callable[[str], bool] = lambda other: False, reviewed=None) -> Plan:
        from rlops.kube import sync

        with self._lock(operation) as lock:
            applied = AppliedSpec(self.bucket, self.env.spec.state.prefix, self.env.name)
            if operation == "apply":
                recorded = applied.read() or {}
                later = [c for c in (recorded.get("commit"), recorded.get("attempted_commit"))
                         if commit and c and c != commit and newer(c)]
                if later:
                    raise Superseded(f"{self.env.name}: commit {later[0][:12]}, newer than {commit[:12]}, is applied "
                                     "(or being applied) already; this older spec is not applied over it")
            # Planned again under the lock: what another apply did while we waited is part of it.
            space = workspace(self.env, self.connection, self.bucket)
            live = engine.read_live([space])[self.env.name]
            runner = engine.Runner(space, self.report, on_step=lambda step: lock.ensure_held())
            if operation == "destroy":
                plan = destroy_plan(self.env, live, delete_data)
            else:
                plan = apply_plan(self.env, live)
            if not plan.has_changes:  # otherwise the plan shown for confirmation says what is kept
                for note in plan.kept:
                    self.report(note)
            refusals = plan.errors + data_loss_refusals(plan, self.env.spec.lustre.deletion_policy, delete_data)
            if refusals:
                raise Refused("; ".join(refusals))
            api = cluster_api(self.env, live, self.connection)
            if operation == "destroy" and api is not None:
                plan.cluster_objects = [sync.ObjectChange(ref, "delete") for ref in sync.owned_refs(api, self.env.name)]
            plan.cost = pricing.plan_cost(plan, self.env.spec)
            if reviewed is not None:
                moved = reviewed.moved(self.env, live, cluster_changes(self.env, live, self.connection, False))
                if moved:
                    raise Refused(f"the saved plan of {reviewed.created_at} is not what an apply would do now; "
                                  f"nothing was changed. Since it was made: {'; '.join(moved)}. Plan again "
                                  f"(rlops plan {self.env.name} --out FILE), review, and apply that")
            elif plan.has_changes and not confirm(plan):
                raise Refused(f"{operation} not confirmed; nothing was changed")
            if operation == "apply":
                applied.mark_attempt(commit)  # from here on, pushes to main retry it until an apply completes
            if operation == "destroy":
                applied.clear()  # no push builds back what is being destroyed, even if this destroy stops part way
            if plan.has_changes:
                if operation == "destroy" and api is not None:
                    sync.delete_all(api, self.env.name, self.report)
                runner.settle(live)
                runner.run(plan)
            lock.ensure_held()
            if operation == "apply":
                # What the cloud steps changed (a new cluster, Lustre's address) is read again; otherwise it stands.
                self._sync_cluster(engine.read_live([space])[self.env.name] if plan.has_changes else live)
                applied.mark(self.env.digest, commit)
            return plan

    def _active_jobs(self, live: dict[str, Live]) -> list[str]:
        """The jobs pending or running on the environment's Ray head, asked with a token fetched now; raises when
        the head does not say (`ray_jobs.JobsUnknown`), which `sync.apply` counts as a job running."""
        from rlops.cloud.ray_jobs import active_jobs
        from rlops.kube.cluster import ray_dashboard

        cluster = live[f"cluster/{self.env.spec.cluster.name}"]
        ray = self.env.spec.ray
        return active_jobs(*ray_dashboard(cluster.fields.get("dns_endpoint_host"), ray.namespace, ray.cluster_name,
                                          self.connection.endpoints))

    def _sync_cluster(self, live: dict[str, Live]) -> None:
        """After the cloud: the cluster's objects by server-side apply, pruned, and waited on until ready."""
        from rlops.kube import sync

        api = cluster_api(self.env, live, self.connection)
        rendered = rendered_objects(self.env, live, self.connection, with_secrets=True)
        changes = sync.plan(api, self.env.name, rendered, secret_values_known=True)
        if changes:
            self.report("cluster objects: " + ", ".join(c.line() for c in changes))
        sync.apply(api, changes, self.report, self.ready_timeout, lambda: self._active_jobs(live))
        sync.wait_ready(api, rendered, self.report, self.ready_timeout,
                        {pool.name: pool.autoscaling.min_nodes for pool in self.env.spec.gpu_pools})


def dry_run(env: CloudEnvironment, live: dict[str, Live] | None) -> list[str]:
    """The mutating requests an apply would send from `live` (None: from nothing), as transcript lines."""
    from rlops.cloud.recording import recording_adapters

    transcript: list[str] = []
    space = workspace(env, Connection(), None, adapters=recording_adapters(target_of(env.name, env.spec), transcript))
    plan = apply_plan(env, live or {})
    if plan.errors:
        raise Refused("; ".join(plan.errors))
    # The apply path itself, one step at a time so that the transcript's order is the plan's, not the threads'.
    engine.Runner(space, report=lambda line: None, max_parallel=1, first_poll_seconds=0.0,
                  on_step=lambda step: transcript.append(f"# {step.label()}")).run(plan)
    # Then the cluster's objects (server-side apply, `rlops render` shows them whole): named, and the image the Ray
    # pods pull, which ray.image_cache rewrites.
    from rlops.kube import render

    objects = render.objects(env.name, env.spec, render.LiveFacts(render.UNKNOWN_LUSTRE_IP))
    transcript.append("# then in the cluster, server-side applied: "
                      + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objects))
    transcript.append(f"# the Ray pods' image: {env.spec.pulled_image}")
    return transcript
