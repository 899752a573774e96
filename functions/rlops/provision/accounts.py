"""Who needs what: each rlops service account, the code it runs, and the smallest predefined roles that let it.

An account's permissions are what that code declares (`rlops.permissions.calls` on the adapters' functions);
its roles are the generally available predefined roles that grant them with the fewest permissions in all,
per place they are granted (the project, the token secrets, the state bucket, a service account). `rlops iam`
prints this table and the README's is its markdown output; the doctor tests the caller against `apply`'s.
"""

import json
from dataclasses import dataclass

from rlops.checkpoints import export
from rlops.cloud import artifactregistry, compute, container, lustre, pubsub, secretmanager, servicenetworking
from rlops.kube.cluster import KubeApi, ray_dashboard
from rlops.permissions import Need, Scope, declared, needs_of_methods, roles, smallest_roles
from rlops.provision import doctor
from rlops.provision.service import secret_versions
from rlops.spec.model import GcpEnvironment
from rlops.state.lock import Lock
from rlops.state.pool import PoolState
from rlops.state.resources import AppliedSpec, ResourceRecord
from rlops.state.run_records import RunRecords

# A pipeline's own log lines (Cloud Build writes them as the build's service account).
BUILD_LOGS = (Need("logging.logEntries.create"),)
# The plan pipeline's GitHub token, which Cloud Build reads for it (availableSecrets in cloudbuild/plan.yaml).
PLAN_TOKEN = (Need("secretmanager.versions.access", Scope.GITHUB_TOKEN),)
# The functions' path to their cluster: its DNS endpoint, then the Ray head through the API server.
CLUSTER_AND_RAY = (container.Clusters.read, ray_dashboard)
RUN_STATE = (RunRecords, PoolState, Lock, pubsub.publish)


@dataclass(frozen=True)
class Grant:
    role: str
    scope: Scope
    permissions: tuple[str, ...]   # of what the account needs, those this role is there for


@dataclass(frozen=True)
class Account:
    key: str           # what `rlops doctor --as` and `rlops iam --account` call it
    name: str
    runs: str          # where it runs
    does: str          # what its code does, for the table
    code: tuple = ()   # functions and classes whose declarations count
    extra: tuple[Need, ...] = ()

    def needs(self) -> tuple[Need, ...]:
        return tuple(sorted(set(declared(*self.code)) | set(self.extra)))

    def grants(self) -> list[Grant]:
        found = []
        for scope in Scope:
            wanted = {n.permission for n in self.needs() if n.scope == scope}
            for role in smallest_roles(wanted) if wanted else ():
                found.append(Grant(role, scope, tuple(sorted(wanted & roles()[role].permissions))))
        return found


# What `gcloud` (528) calls for cloudbuild/deploy.yaml, as tests/cloudbuild/test_deploy_pipeline.py sees it run: topics,
# subscriptions and their IAM, the functions (the runtimes offered, their source upload, their Cloud Run service's
# invoker binding, which `functions deploy` of an existing function rewrites too), the tick schedule, and what
# `functions deploy` reads on the side: the project's number, and whether run, cloudbuild and artifactregistry are
# enabled (it goes on when refused that). Deploying a function to run as an account, or to build as one, and a
# push subscription's token account, is acting as that account.
DEPLOY_METHODS = (
    "pubsub.projects.topics.get", "pubsub.projects.topics.create", "pubsub.projects.topics.getIamPolicy",
    "pubsub.projects.topics.setIamPolicy", "pubsub.projects.subscriptions.get",
    "pubsub.projects.subscriptions.create", "pubsub.projects.subscriptions.patch",
    "pubsub.projects.subscriptions.getIamPolicy", "pubsub.projects.subscriptions.setIamPolicy",
    "cloudfunctions.projects.locations.functions.get", "cloudfunctions.projects.locations.functions.create",
    "cloudfunctions.projects.locations.functions.patch",
    "cloudfunctions.projects.locations.functions.generateUploadUrl",
    "cloudfunctions.projects.locations.runtimes.list", "cloudfunctions.projects.locations.operations.get",
    "run.projects.locations.services.getIamPolicy", "run.projects.locations.services.setIamPolicy",
    "cloudscheduler.projects.locations.jobs.get", "cloudscheduler.projects.locations.jobs.create",
    "cloudscheduler.projects.locations.jobs.patch", "cloudresourcemanager.projects.get", "serviceusage.services.get")

ACCOUNTS = (
    Account("apply", "rlops-apply", "cloudbuild/apply.yaml",
            "creates the networks, firewall rules, peering, cluster, pools, Lustre and the image cache; writes the "
            "Kubernetes objects and fills the token Secret; keeps the resource record, the applied commit and the "
            "lock; the doctor's reads before the first change",
            code=(*compute.HANDLERS, *container.HANDLERS, lustre.LustreAdapter,
                  servicenetworking.ServiceNetworkingAdapter, artifactregistry.RemoteRepositories,
                  secretmanager.access, KubeApi.apply,
                  KubeApi.get, KubeApi.list_labelled, KubeApi.delete, Lock, ResourceRecord, AppliedSpec,
                  *doctor.CHECKS),
            extra=BUILD_LOGS),
    Account("plan", "rlops-plan", "cloudbuild/plan.yaml",
            "reads the GitHub token to post the plan comment; changes nothing",
            extra=(*PLAN_TOKEN, *BUILD_LOGS)),
    Account("plan-live", "rlops-plan (with _LIVE_PLAN=true)", "cloudbuild/plan.yaml",
            "also reads what a live plan compares against, and the doctor's table",
            extra=(*PLAN_TOKEN, *BUILD_LOGS),
            code=(*((kind, "_list") for kind in compute.HANDLERS), container.Clusters._clusters,
                  lustre.LustreAdapter._instances,
                  servicenetworking.ServiceNetworkingAdapter.read, artifactregistry.RemoteRepositories.read,
                  ResourceRecord.load, KubeApi.get,
                  KubeApi.list_labelled, *doctor.CHECKS)),
    Account("train", "rlops-train", "the train function",
            "checks a message, wakes the GPU pool, submits the run's Ray job; run records, events",
            code=(*RUN_STATE, *CLUSTER_AND_RAY, container.NodePools.resize, KubeApi.set_worker_replicas)),
    Account("watch", "rlops-watch", "the watch function",
            "follows the runs' Ray jobs, resumes preempted ones, says why workers wait; run records, events",
            code=(*RUN_STATE, *CLUSTER_AND_RAY, container.NodePools.resize, KubeApi.set_worker_replicas,
                  container.NodePools.problems, compute.reservation, KubeApi.list_labelled)),
    Account("snapshot", "rlops-snapshot", "the snapshot function",
            "submits the hashing job, stores manifests, exports checkpoints with Lustre's exportData",
            code=(*RUN_STATE, *CLUSTER_AND_RAY, lustre.Transfers.export, lustre.Transfers.state, export.verify,
                  export.upload_manifest)),
    Account("reap", "rlops-reap", "the reap function",
            "scales an idle GPU pool's RayCluster workers and node pool to zero; measures each wake",
            code=(*RUN_STATE, *CLUSTER_AND_RAY, container.NodePools.resize, KubeApi.set_worker_replicas,
                  container.NodePools.resizes, KubeApi.list_labelled)),
    Account("deploy", "rlops-deploy", "cloudbuild/deploy.yaml",
            "deploys the functions to run as their accounts, the topics, subscriptions and schedule",
            extra=(*needs_of_methods(DEPLOY_METHODS), Need("iam.serviceAccounts.actAs", Scope.FUNCTION_ACCOUNTS),
                   *BUILD_LOGS)),
)


def account(key: str) -> Account:
    found = {a.key: a for a in ACCOUNTS}
    if key not in found:
        raise KeyError(f"no rlops account {key!r}; the accounts: {', '.join(found)}")
    return found[key]


_WHERE = {Scope.PROJECT: "", Scope.SECRET: "on the token secrets and rlops-github-token",
          Scope.GITHUB_TOKEN: "on rlops-github-token",
          Scope.BUCKET: "on the state bucket", Scope.NODE_SERVICE_ACCOUNT: "on the node service account",
          Scope.EVENTS_TOPIC: "on the rlops-events topic", Scope.FUNCTION_ACCOUNTS: "on the functions' accounts"}


def places(spec: GcpEnvironment) -> dict[Scope, str]:
    """Where each scope's roles are granted, named for one environment's spec."""
    project = spec.project.id
    secrets = sorted({version.split("/versions/")[0] for version in secret_versions(spec).values()}
                     | {f"projects/{project}/secrets/rlops-github-token"})
    accounts = ", ".join(f"rlops-{name}@{project}.iam.gserviceaccount.com"
                         for name in ("train", "watch", "snapshot", "reap", "push", "function-build"))
    return {Scope.PROJECT: "", Scope.SECRET: f"on {', '.join(secrets)}", Scope.BUCKET: f"on gs://{spec.state.bucket}",
            Scope.GITHUB_TOKEN: f"on projects/{project}/secrets/rlops-github-token",
            Scope.NODE_SERVICE_ACCOUNT: "on PROJECT_NUMBER-compute@developer.gserviceaccount.com (the Compute "
                                        f"Engine default account of {project}, as the spec names no node account)",
            Scope.EVENTS_TOPIC: f"on projects/{project}/topics/rlops-events", Scope.FUNCTION_ACCOUNTS: f"on {accounts}"}


def _roles_said(grants: list[Grant], where: dict[Scope, str], code: bool) -> str:
    quote = (lambda text: f"`{text}`") if code else (lambda text: text)
    said = []
    for scope in Scope:
        here = [quote(g.role) for g in grants if g.scope == scope]
        if here:
            said.append(", ".join(here) + (f" {where[scope]}" if where[scope] else ""))
    return "; ".join(said)


def render(fmt: str, spec: GcpEnvironment | None = None) -> str:
    """The accounts table: `text`, `markdown` (the README's) or `json` (with every permission and why); with an
    environment's `spec`, each place named (its secrets, its bucket)."""
    where = places(spec) if spec is not None else _WHERE
    if fmt == "json":
        return json.dumps([{"account": a.name, "key": a.key, "runs": a.runs, "does": a.does,
                            "grants": [{"role": g.role, "on": g.scope.value, "where": where[g.scope] or "project",
                                        "for": list(g.permissions)} for g in a.grants()],
                            "permissions": [{"permission": n.permission, "on": n.scope.value} for n in a.needs()]}
                           for a in ACCOUNTS], indent=2) + "\n"
    if fmt == "markdown":
        rows = ["| account | runs | roles (on the project unless said) | why |", "| --- | --- | --- | --- |"]
        rows += [f"| `{a.name}` | {a.runs} | {_roles_said(a.grants(), where, True)} | {a.does} |" for a in ACCOUNTS]
        return "\n".join(rows) + "\n"
    lines = []
    for a in ACCOUNTS:
        lines.append(f"{a.name} ({a.runs}): {a.does}")
        for g in a.grants():
            lines.append(f"  {g.role}{' ' + where[g.scope] if where[g.scope] else ''}: {', '.join(g.permissions)}")
    return "\n".join(lines) + "\n"
