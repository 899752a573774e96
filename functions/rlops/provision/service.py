"""The plans of whole environments (apply, destroy, offline, for review) and the dry run: the spec, the state
bucket and the adapters together. `session.py` carries a plan out under the environment's lock."""

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from google.cloud import storage

from rlops import environments
from rlops.cloud import adapters as build_adapters
from rlops.cloud import git
from rlops.cloud.base import Connection, ResourceAdapter, Target
from rlops.cloud.recording import recording_adapters
from rlops.errors import Failure
from rlops.kube import render
from rlops.kube.objects import Manifest, ObjectChange, Ref
from rlops.provision import engine, pricing, resources
from rlops.provision.plan import Action, Plan, build_plan
from rlops.resource_shapes import Live, Resource
from rlops.spec import images
from rlops.spec.load import SpecError, load, load_text
from rlops.spec.model import GcpEnvironment
from rlops.state.resources import ResourceRecord

if TYPE_CHECKING:
    from rlops.kube.cluster import KubeApi

# Cold start: the Kubernetes client (`rlops.kube.cluster`, `rlops.kube.sync`, `rlops.provision.saved`) and Secret
# Manager's load where a step reaches a cluster or a secret, not with this module: `rlops changed` and `rlops lock`
# use CloudEnvironment, and the functions `target_of`, without them.


class Refused(Failure):
    """The plan may not run as it is (a data-losing change, a resource rlops does not own)."""


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


def secret_versions(spec: GcpEnvironment) -> dict[str, str]:
    """{NAME: projects/P/secrets/S/versions/V} of the spec's secrets: a GCP spec names each in Secret Manager
    (`spec.rules` refuses one that does not)."""
    return {name: ref.secret_manager for name, ref in spec.secrets.items() if ref.secret_manager is not None}


def workspace(env: CloudEnvironment, connection: Connection, bucket: storage.Bucket | None,
              adapters: dict[str, ResourceAdapter] | None = None) -> engine.Workspace:
    """`bucket` None: the resource record is kept in memory only (a dry run's)."""
    record = ResourceRecord(bucket, env.spec.state.prefix, env.name).load()
    return engine.Workspace(env.name, env.desired,
                            adapters if adapters is not None
                            else build_adapters(target_of(env.name, env.spec), connection),
                            record)


def plan_live(envs: list[CloudEnvironment], connection: Connection,
              bucket_of: Callable[[CloudEnvironment], storage.Bucket],
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
                     with_secrets: bool) -> list[Manifest]:
    """The in-cluster objects; before Lustre exists its address is a placeholder (the objects wait for it anyway)."""
    lustre = live.get(f"lustre_instance/{env.spec.lustre.name}")
    mount_point = lustre.fields.get("mount_point") if lustre else None
    facts = (render.LiveFacts.from_mount_point(mount_point) if mount_point
             else render.LiveFacts(render.UNKNOWN_LUSTRE_IP))
    values = None
    if with_secrets:
        from rlops.cloud import secretmanager  # noqa: PLC0415 cold start (above)
        values = secretmanager.access(connection, secret_versions(env.spec))
    return render.objects(env.name, env.spec, facts, values)


def cluster_api(env: CloudEnvironment, live: dict[str, Live], connection: Connection) -> "KubeApi | None":
    """The cluster's Kubernetes API, or None while the cluster does not exist."""
    from rlops.kube.cluster import connect  # noqa: PLC0415 cold start (above)

    cluster = live.get(f"cluster/{env.spec.cluster.name}")
    return None if cluster is None else connect(cluster.fields.get("dns_endpoint_host"), connection.endpoints)


def cluster_changes(env: CloudEnvironment, live: dict[str, Live], connection: Connection,
                    with_secrets: bool) -> list[ObjectChange]:
    from rlops.kube import sync  # noqa: PLC0415 cold start (above)

    rendered = rendered_objects(env, live, connection, with_secrets)
    api = cluster_api(env, live, connection)
    if api is None:
        return [ObjectChange(Ref.of(obj), "create", desired=obj) for obj in rendered]
    return sync.plan(api, env.name, rendered, secret_values_known=with_secrets)


def read_one(env: CloudEnvironment, connection: Connection, bucket: storage.Bucket) -> dict[str, Live]:
    return engine.read_live([workspace(env, connection, bucket)])[env.name]


def plan_offline(env: CloudEnvironment, base: CloudEnvironment | None) -> Plan:
    """The plan a reviewer sees without credentials: the spec against the base revision's spec, the cluster's
    objects as each renders them (what changes, and whether the Ray pods restart), and what it adds an hour."""
    from rlops.kube import sync  # noqa: PLC0415 cold start (above)

    live = {} if base is None else {r.key: Live(r.desired, True, r.depends_on) for r in base.desired}
    plan = apply_plan(env, live)
    facts = render.LiveFacts(render.UNKNOWN_LUSTRE_IP)
    plan.cluster_objects = sync.plan_between(
        [] if base is None else render.objects(base.name, base.spec, facts), render.objects(env.name, env.spec, facts))
    plan.cost = pricing.plan_cost(plan, env.spec)
    return plan


def plan_for_review(env: CloudEnvironment, connection: Connection,
                    bucket: storage.Bucket) -> tuple[Plan, dict[str, Live]]:
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


def dry_run(env: CloudEnvironment, live: dict[str, Live] | None) -> list[str]:
    """The mutating requests an apply would send from `live` (None: from nothing), as transcript lines."""
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
    objects = render.objects(env.name, env.spec, render.LiveFacts(render.UNKNOWN_LUSTRE_IP))
    transcript.append("# then in the cluster, server-side applied: "
                      + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objects))
    transcript.append(f"# the Ray pods' image: {env.spec.pulled_image}")
    return transcript
