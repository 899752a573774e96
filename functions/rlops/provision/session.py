"""Apply and destroy of one environment: one plan-under-lock they share (`Session._planned`), each with its own
steps (`_Apply`, `_Destroy`). The plan is a value its caller inspects while the lock is held (`Pending`): the CLI
shows it and asks, then carries it out or leaves it, as Terraform does between its plan and "yes"."""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.cloud import storage

from rlops.cloud.base import Connection
from rlops.cloud.ray_jobs import active_jobs
from rlops.errors import Failure
from rlops.kube import sync
from rlops.kube.cluster import KubeApi, ray_dashboard
from rlops.kube.objects import ObjectChange
from rlops.provision import accounts, doctor, engine, pricing
from rlops.provision.plan import Plan, data_loss_refusals
from rlops.provision.service import (
    CloudEnvironment,
    Refused,
    apply_plan,
    cluster_api,
    cluster_changes,
    destroy_plan,
    rendered_objects,
    workspace,
)
from rlops.resource_shapes import Live
from rlops.state.lock import Lock
from rlops.state.resources import AppliedSpec

if TYPE_CHECKING:
    from rlops.provision.saved import SavedPlan


class DoctorStopped(Failure):
    """The checks before an apply found what would stop it part way; nothing was changed. `findings`: the failed
    checks, rendered."""

    def __init__(self, message: str, findings: str):
        super().__init__(message)
        self.findings = findings


class Superseded(Failure):
    """A newer commit than the one this apply was asked to carry out is applied, or being applied, already."""


class _Operation:
    """What an apply and a destroy do apart, as steps of the one plan-under-lock they share (`Session._planned`)."""

    verb = ""

    def check(self, env: CloudEnvironment, applied: AppliedSpec) -> None:
        """Under the lock, before anything is read: whether it may go ahead at all."""

    def plan(self, env: CloudEnvironment, live: dict[str, Live], delete_data: bool) -> Plan:
        raise NotImplementedError

    def in_cluster(self, env: CloudEnvironment, plan: Plan, api: "KubeApi | None") -> None:
        """The plan's in-cluster part, once the cloud part may run (the cluster's API, when there is a cluster)."""

    def started(self, env: CloudEnvironment, applied: AppliedSpec) -> None:
        """Confirmed: what the state says from here on."""

    def before_cloud(self, session: "Session", api: "KubeApi | None") -> None:
        """When the plan changes something: before the cloud steps."""

    def finished(self, session: "Session", space: engine.Workspace, plan: Plan, live: dict[str, Live],
                 applied: AppliedSpec) -> None:
        """After the cloud steps, still under the lock."""


@dataclass
class _Apply(_Operation):
    commit: str | None
    newer: Callable[[str], bool]
    verb = "apply"

    def check(self, env: CloudEnvironment, applied: AppliedSpec) -> None:
        recorded = applied.read() or {}
        commit = self.commit
        later = [c for c in (recorded.get("commit"), recorded.get("attempted_commit"))
                 if commit and c and c != commit and self.newer(c)]
        if commit and later:
            raise Superseded(f"{env.name}: commit {later[0][:12]}, newer than {commit[:12]}, is applied "
                             "(or being applied) already; this older spec is not applied over it")

    def plan(self, env: CloudEnvironment, live: dict[str, Live], delete_data: bool) -> Plan:
        return apply_plan(env, live)

    def started(self, env: CloudEnvironment, applied: AppliedSpec) -> None:
        applied.mark_attempt(self.commit)  # from here on, pushes to main retry it until an apply completes

    def finished(self, session: "Session", space: engine.Workspace, plan: Plan, live: dict[str, Live],
                 applied: AppliedSpec) -> None:
        # What the cloud steps changed (a new cluster, Lustre's address) is read again; otherwise it stands.
        session._sync_cluster(engine.read_live([space])[session.env.name] if plan.has_changes else live)
        applied.mark(session.env.digest, self.commit)


class _Destroy(_Operation):
    verb = "destroy"

    def plan(self, env: CloudEnvironment, live: dict[str, Live], delete_data: bool) -> Plan:
        return destroy_plan(env, live, delete_data)

    def in_cluster(self, env: CloudEnvironment, plan: Plan, api: "KubeApi | None") -> None:
        if api is not None:
            plan.cluster_objects = [ObjectChange(ref, "delete") for ref in sync.owned_refs(api, env.name)]

    def started(self, env: CloudEnvironment, applied: AppliedSpec) -> None:
        applied.clear()  # no push builds back what is being destroyed, even if this destroy stops part way

    def before_cloud(self, session: "Session", api: "KubeApi | None") -> None:
        if api is not None:
            sync.delete_all(api, session.env.name, session.report)


@dataclass
class Pending:
    """A plan made under the environment's lock, not carried out yet. `asks`: whether someone should be asked first
    (it changes something, and it is not a reviewed saved plan). Left without `carry_out`, nothing is changed."""

    plan: Plan
    asks: bool
    verb: str
    _steps: Callable[[], None]
    lock_released: bool = False
    carried_out: bool = False

    def carry_out(self) -> Plan:
        if self.lock_released or self.carried_out:
            raise Failure(f"this {self.verb} plan was {'carried out' if self.carried_out else 'left'} already")
        self.carried_out = True
        self._steps()
        return self.plan


@dataclass
class Session:
    """One apply or destroy of one environment, under its lock."""

    env: CloudEnvironment
    connection: Connection
    bucket: storage.Bucket
    report: Callable[[str], None]
    lock_timeout: float = 600.0
    ready_timeout: float = 1800.0

    def checked(self) -> int:
        """The doctor's checks an apply runs first, for what the apply account needs: how many passed. Raises
        `DoctorStopped` when any failed."""
        findings = doctor.examine(self.env, self.connection, self.bucket, accounts.account("apply").needs())
        stopping = doctor.failed(findings)
        if stopping:
            raise DoctorStopped(f"doctor: {len(stopping)} check(s) failed; nothing was changed (`rlops doctor "
                                f"{self.env.name}` for all of them, `--skip-doctor` to apply anyway)",
                                doctor.render(stopping))
        return len(findings)

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

    def planned_apply(self, delete_data: bool = False, commit: str | None = None,
                      newer: Callable[[str], bool] = lambda other: False,
                      reviewed: "SavedPlan | None" = None) -> AbstractContextManager["Pending"]:
        """The apply's plan under the lock, to inspect and carry out (`Pending`). `commit`: the git commit whose
        spec this is (a pipeline's); refused (`Superseded`) when the state records a commit `newer` says is newer:
        Cloud Build runs two pushes' builds in any order. `reviewed`: a `saved.SavedPlan`, refused unless nothing
        it was made from moved (then nobody need be asked)."""
        return self._planned(_Apply(commit, newer), delete_data, reviewed)

    def planned_destroy(self, delete_data: bool) -> AbstractContextManager["Pending"]:
        return self._planned(_Destroy(), delete_data)

    @contextmanager
    def _planned(self, operation: _Operation, delete_data: bool,
                 reviewed: "SavedPlan | None" = None) -> Iterator["Pending"]:
        with self._lock(operation.verb) as lock:
            applied = AppliedSpec(self.bucket, self.env.spec.state.prefix, self.env.name)
            operation.check(self.env, applied)
            # Planned again under the lock: what another apply did while we waited is part of it.
            space = workspace(self.env, self.connection, self.bucket)
            live = engine.read_live([space])[self.env.name]
            plan = operation.plan(self.env, live, delete_data)
            if not plan.has_changes:  # otherwise the plan shown for confirmation says what is kept
                for note in plan.kept:
                    self.report(note)
            refusals = plan.errors + data_loss_refusals(plan, self.env.spec.lustre.deletion_policy, delete_data)
            if refusals:
                raise Refused("; ".join(refusals))
            api = cluster_api(self.env, live, self.connection)
            operation.in_cluster(self.env, plan, api)
            plan.cost = pricing.plan_cost(plan, self.env.spec)
            if reviewed is not None:
                moved = reviewed.moved(self.env, live, cluster_changes(self.env, live, self.connection, False))
                if moved:
                    raise Refused(f"the saved plan of {reviewed.created_at} is not what an apply would do now; "
                                  f"nothing was changed. Since it was made: {'; '.join(moved)}. Plan again "
                                  f"(rlops plan {self.env.name} --out FILE), review, and apply that")

            def carry_out() -> None:
                operation.started(self.env, applied)
                if plan.has_changes:
                    operation.before_cloud(self, api)
                    runner = engine.Runner(space, self.report, on_step=lambda step: lock.ensure_held())
                    runner.settle(live)
                    runner.run(plan)
                lock.ensure_held()
                operation.finished(self, space, plan, live, applied)

            pending = Pending(plan, plan.has_changes and reviewed is None, operation.verb, carry_out)
            try:
                yield pending
            finally:
                pending.lock_released = True

    def _active_jobs(self, live: dict[str, Live]) -> list[str]:
        """The jobs pending or running on the environment's Ray head, asked with a token fetched now; raises when
        the head does not say (`ray_jobs.JobsUnknown`), which `sync.apply` counts as a job running."""
        cluster = live[f"cluster/{self.env.spec.cluster.name}"]
        ray = self.env.spec.ray
        return active_jobs(*ray_dashboard(cluster.fields.get("dns_endpoint_host"), ray.namespace, ray.cluster_name,
                                          self.connection.endpoints))

    def _sync_cluster(self, live: dict[str, Live]) -> None:
        """After the cloud: the cluster's objects by server-side apply, pruned, and waited on until ready."""
        api = cluster_api(self.env, live, self.connection)
        if api is None:  # not after an apply, which made the cluster or found it there
            raise Failure(f"{self.env.name}: cluster {self.env.spec.cluster.name} is not there after the apply")
        rendered = rendered_objects(self.env, live, self.connection, with_secrets=True)
        changes = sync.plan(api, self.env.name, rendered, secret_values_known=True)
        if changes:
            self.report("cluster objects: " + ", ".join(c.line() for c in changes))
        sync.apply(api, changes, self.report, self.ready_timeout, lambda: self._active_jobs(live))
        sync.wait_ready(api, rendered, self.report, self.ready_timeout,
                        {pool.name: pool.autoscaling.min_nodes for pool in self.env.spec.gpu_pools})
