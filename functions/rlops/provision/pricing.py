"""What an environment, and what a plan adds or removes, costs an hour at list prices (Infracost's idea: a line per
priced resource and a total). The prices are `rlops.costs`'s; this module knows which resources a spec makes and
which of them a plan changes. No I/O."""

from rlops import costs
from rlops.provision import resources
from rlops.provision.plan import Action, CostChange, Plan, PlanCost
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
