"""What an environment, and what a plan adds or removes, costs an hour at list prices (Infracost's idea: a line per
priced resource and a total). The prices are `rlops.costs`'s; this module knows which resources a spec makes and
which of them a plan changes. No I/O."""

from dataclasses import dataclass

from rlops import costs
from rlops.provision import resources
from rlops.provision.plan import Action, Plan
from rlops.spec.model import GcpEnvironment


def hints(spec: GcpEnvironment | None) -> dict[str, costs.PoolHint]:
    """By node pool name, what its fields leave out (`costs.PoolHint`)."""
    if spec is None:
        return {}
    found = {spec.cluster.system_pool.name: costs.PoolHint(initial_nodes=spec.cluster.system_pool.initial_nodes)}
    for pool in spec.gpu_pools:
        found[pool.name] = costs.PoolHint(replicas=pool.awake_nodes,
                                          usd_per_node_hour=pool.cost.usd_per_node_hour if pool.cost else None)
    return found


def _hint(key: str, by_pool: dict[str, costs.PoolHint]) -> costs.PoolHint | None:
    kind, name = key.split("/", 1)
    return by_pool.get(name) if kind == "node_pool" else None


def environment_rates(name: str, spec: GcpEnvironment) -> list[costs.Rate]:
    """Every priced part of the environment as its spec says, then the project's functions (an estimate)."""
    by_pool = hints(spec)
    found = [costs.resource_rate(r.key, r.desired, _hint(r.key, by_pool)) for r in resources.build(name, spec)]
    return [rate for rate in found if rate is not None] + [costs.functions_rate()]


@dataclass(frozen=True)
class CostChange:
    """One priced resource a plan changes: its rate before and after (None: not there)."""

    key: str
    before: costs.Rate | None
    after: costs.Rate | None

    @property
    def usd_per_hour(self) -> float | None:
        """The change in $/h; None when either side has no known price."""
        sides = [rate for rate in (self.before, self.after) if rate is not None]
        if any(rate.usd_per_hour is None for rate in sides):
            return None
        return (self.after.usd_per_hour if self.after else 0.0) - (self.before.usd_per_hour if self.before else 0.0)

    @property
    def sign(self) -> str:
        return "+" if self.before is None else "-" if self.after is None else "~"


@dataclass(frozen=True)
class PlanCost:
    changes: list[CostChange]

    @property
    def usd_per_hour(self) -> float:
        """What the known prices add up to (unpriced changes are listed apart)."""
        return sum(c.usd_per_hour for c in self.changes if c.usd_per_hour is not None)

    @property
    def always_usd_per_hour(self) -> float:
        """The part billed whether or not a GPU pool is up."""
        return sum(c.usd_per_hour for c in self.changes if c.usd_per_hour is not None
                   and (c.after or c.before).billed == "always")

    @property
    def unpriced(self) -> list[CostChange]:
        return [c for c in self.changes if c.usd_per_hour is None]


def plan_cost(plan: Plan, spec: GcpEnvironment | None) -> PlanCost:
    """The $/h each priced resource of `plan` adds, changes or removes: its rate from the spec's fields against its
    rate from what is there now (the live fields, or the base revision's)."""
    by_pool = hints(spec)
    found = []
    for change in plan.changes:
        if change.action in (Action.ADOPT, Action.NOOP) and change.live_fields is not None:
            continue  # there already, billed already
        hint = _hint(change.key, by_pool)
        after = costs.resource_rate(change.key, change.resource.desired, hint) \
            if change.action != Action.DELETE and change.resource is not None else None
        before = costs.resource_rate(change.key, change.live_fields, hint) \
            if change.action in (Action.UPDATE, Action.REPLACE, Action.DELETE) and change.live_fields else None
        if after is None and before is None:
            continue
        if after is not None and before is not None and after.usd_per_hour == before.usd_per_hour:
            continue
        found.append(CostChange(change.key, before, after))
    return PlanCost(found)
