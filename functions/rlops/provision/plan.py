"""Diffing desired resources against live ones and classifying each change. No I/O.

The rules, per resource:
- not live: create (or, for a cluster's system pool, created by the cluster's own create);
- live but not rlops's: adopted when it already matches the spec, refused when it differs;
- rlops's and different: update in place when every changed field is mutable, replace when one is
  immutable (and everything that depends on it is replaced with it), refused when a grow-only field
  would shrink;
- rlops's and no longer in the spec: delete.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlops import costs
from rlops.kube.objects import ObjectChange
from rlops.provision.resources import KINDS, Mutability
from rlops.resource_shapes import Live, Resource


class Action(str, Enum):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"
    DELETE = "delete"
    ADOPT = "adopt"
    NOOP = "no-op"


@dataclass(frozen=True)
class FieldChange:
    field: str
    before: Any   # values of the flat field vocabulary (`Resource.desired`), as JSON has them
    after: Any
    mutability: Mutability


@dataclass
class Change:
    key: str
    action: Action
    resource: Resource | None             # None for a delete: the spec no longer has it
    fields: list[FieldChange] = field(default_factory=list)
    destructive: bool = False
    reason: str = ""
    depends_on: tuple[str, ...] = ()
    # What the live resource stands on, where it differs from the spec: a replaced node pool's old cluster.
    # (A delete's depends_on already is the live one.)
    live_depends_on: tuple[str, ...] = ()
    # The fields of what is there now (live, or the base revision's), where something is: what a plan's cost
    # compares with.
    live_fields: dict | None = None

    @property
    def kind(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def wanted(self) -> Resource:
        """The resource as the spec wants it, which every change has but a delete."""
        if self.resource is None:
            raise ValueError(f"{self.key}: a delete has no resource the spec wants")
        return self.resource


@dataclass(frozen=True)
class CostChange:
    """One priced resource a plan changes: its rate before and after (None: not there; one of them is)."""

    key: str
    before: costs.Rate | None
    after: costs.Rate | None

    @property
    def usd_per_hour(self) -> float | None:
        """The change in $/h; None when either side has no known price."""
        before = self.before.usd_per_hour if self.before else 0.0
        after = self.after.usd_per_hour if self.after else 0.0
        return None if before is None or after is None else after - before

    @property
    def sign(self) -> str:
        return "+" if self.before is None else "-" if self.after is None else "~"

    @property
    def rate(self) -> costs.Rate:
        """The rate after the change, or before it where the change removes the resource."""
        rate = self.after or self.before
        if rate is None:
            raise ValueError(f"{self.key}: a cost change with no rate on either side")
        return rate


@dataclass(frozen=True)
class PlanCost:
    """What a plan adds and removes an hour (`pricing.plan_cost`)."""

    changes: list[CostChange]

    @property
    def usd_per_hour(self) -> float:
        """What the known prices add up to (unpriced changes are listed apart)."""
        return sum(c.usd_per_hour for c in self.changes if c.usd_per_hour is not None)

    @property
    def always_usd_per_hour(self) -> float:
        """The part billed whether or not a GPU pool is up."""
        return sum(c.usd_per_hour for c in self.changes if c.usd_per_hour is not None and c.rate.billed == "always")

    @property
    def unpriced(self) -> list[CostChange]:
        return [c for c in self.changes if c.usd_per_hour is None]


@dataclass
class Plan:
    environment: str
    changes: list[Change]
    errors: list[str] = field(default_factory=list)
    # The in-cluster objects' changes, after the cloud's.
    cluster_objects: list[ObjectChange] = field(default_factory=list)
    # What it adds and removes an hour (set by whoever knows the spec: `pricing.plan_cost`), None until priced.
    cost: PlanCost | None = None
    # Deletions left out, each with why (data kept, an image cache another environment uses).
    kept: list[str] = field(default_factory=list)

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action == action)

    @property
    def has_changes(self) -> bool:
        return any(c.action not in (Action.NOOP,) for c in self.changes) or bool(self.cluster_objects)

    @property
    def destructive(self) -> list[Change]:
        return [c for c in self.changes if c.destructive]

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(a)} to {a.value}"
                           for a in (Action.CREATE, Action.UPDATE, Action.REPLACE, Action.DELETE))
        adopted = self.count(Action.ADOPT)
        return counts + (f", {adopted} to adopt" if adopted else "")


def field_changes(resource: Resource, live: dict) -> list[FieldChange]:
    kind = KINDS[resource.kind]
    changes = []
    for name, mutability in kind.fields.items():
        wanted = resource.desired.get(name)
        if wanted is None:
            continue  # left to the API's default (e.g. the release channel's version)
        if live.get(name) != wanted:
            changes.append(FieldChange(name, live.get(name), wanted, mutability))
    return changes


def build_plan(environment: str, desired: list[Resource], live: dict[str, Live]) -> Plan:
    """`desired` in dependency order; `live` holds every live resource rlops knows of, by key."""
    plan = Plan(environment, [])
    by_key: dict[str, Change] = {}
    for resource in desired:
        change = _classify(resource, live.get(resource.key), by_key, plan.errors)
        if resource.key in live:
            change.live_depends_on = live[resource.key].depends_on
            change.live_fields = live[resource.key].fields
        by_key[resource.key] = change
        plan.changes.append(change)
    _replace_dependents(plan.changes, by_key, plan.errors)
    wanted = {r.key for r in desired}
    for key, state in live.items():
        if key not in wanted and state.owned:
            plan.changes.append(Change(key, Action.DELETE, None, destructive=KINDS[key.split("/", 1)[0]].destructive,
                                       reason="no longer in the spec", depends_on=state.depends_on,
                                       live_fields=state.fields))
    for change in plan.changes:
        if change.action == Action.REPLACE:
            change.destructive = KINDS[change.kind].destructive
        if change.kind == "lustre_instance" and change.action in (Action.CREATE, Action.REPLACE) \
                and change.wanted.desired.get("gke_support_enabled"):
            # rlops sends no deprecated gkeSupportEnabled: the instance would be made without it, and the next plan
            # would replace it. The spec's flag describes an instance that exists.
            plan.errors.append(f"{change.key}: lustre.gke_support: true describes an existing instance made with "
                               "the deprecated gke-support-enabled, and rlops makes none; for a new instance set "
                               "lustre.gke_support and cluster.addons.lustre_legacy_port to false")
    return plan


def _classify(resource: Resource, live: Live | None, by_key: dict[str, Change], errors: list[str]) -> Change:
    key = resource.key
    if live is None:
        parent = by_key.get(resource.created_with) if resource.created_with else None
        if parent is not None and parent.action in (Action.CREATE, Action.REPLACE):
            return Change(key, Action.NOOP, resource, reason=f"created by the {resource.created_with} create",
                          depends_on=resource.depends_on)
        return Change(key, Action.CREATE, resource, depends_on=resource.depends_on)
    changes = field_changes(resource, live.fields)
    if not live.owned:
        if changes:
            differences = "; ".join(f"{c.field} is {c.before!r}, the spec says {c.after!r}" for c in changes)
            errors.append(f"{key} exists but is not managed by rlops, and differs from the spec: {differences}. "
                          "Change the spec to match it, or remove it yourself.")
            return Change(key, Action.NOOP, resource, reason="refused: not managed by rlops")
        return Change(key, Action.ADOPT, resource, reason="exists as specified; rlops takes it over",
                      depends_on=resource.depends_on)
    shrinking = [c for c in changes
                 if c.mutability == Mutability.GROW_ONLY and c.before is not None and c.after < c.before]
    for c in shrinking:
        errors.append(f"{key}: {c.field} can only grow ({c.before} -> {c.after} refused); "
                      "keep it, or create a new resource and move the data")
    changes = [c for c in changes if c not in shrinking]
    if not changes:
        return Change(key, Action.NOOP, resource, depends_on=resource.depends_on)
    immutable = [c.field for c in changes if c.mutability == Mutability.IMMUTABLE]
    if immutable:
        return Change(key, Action.REPLACE, resource, changes, reason=f"{', '.join(immutable)} cannot change in place",
                      depends_on=resource.depends_on)
    return Change(key, Action.UPDATE, resource, changes, depends_on=resource.depends_on)


def _replace_dependents(changes: list[Change], by_key: dict[str, Change], errors: list[str]) -> None:
    # A resource built on a replaced one goes with it: a subnet cannot outlive its network.
    for change in changes:  # dependency order, so a chain propagates in one pass
        if change.action in (Action.NOOP, Action.UPDATE, Action.ADOPT) and change.resource is not None:
            replaced = [d for d in change.depends_on if d in by_key and by_key[d].action == Action.REPLACE]
            if not replaced or change.reason.startswith("refused"):
                continue
            if change.action == Action.ADOPT:
                # Not rlops's to delete: the replacement underneath it cannot go ahead.
                errors.append(f"{change.key} is not managed by rlops and stands on {', '.join(replaced)}, which this "
                              "plan replaces; remove it yourself, or undo the change that replaces it")
                change.action, change.reason = Action.NOOP, "refused: not managed by rlops"
                continue
            change.action = Action.REPLACE
            change.reason = f"replaced with {', '.join(replaced)}"


def data_loss_refusals(plan: Plan, deletion_policy: str, delete_data: bool) -> list[str]:
    """Why this plan may not run: a Lustre instance would be deleted without both permissions."""
    refusals = []
    for change in plan.changes:
        if change.kind == "lustre_instance" and change.action in (Action.DELETE, Action.REPLACE):
            if deletion_policy != "delete" or not delete_data:
                refusals.append(
                    f"{change.key} would be {'deleted' if change.action == Action.DELETE else 'replaced'}, "
                    "losing its data; "
                    "this needs lustre.deletion_policy: delete in the spec AND --delete-data on the command line")
    return refusals
