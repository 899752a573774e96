"""What an environment's GPU pools cost, and what of it trained: the accounting behind `rlops cost`. Pure.

The facts are what rlops writes anyway, each once and at the time it happened, so the totals do not
depend on how many ticks ran: the pool's transitions (`pool.json`: the reaper's first look and
scale-downs, the wakes) and each attempt's running interval (from its gate's clock, `started_at`, to
Ray's end time). Over a window:

- up: the pool has its nodes (billed); reaped: scaled down (not billed, unless a reservation);
- used: some attempt is running (shared evenly between the runs running at once);
- waking: from a wake until its first GPU node joined Ray (node start, image pull, Ray join: billed,
  nothing runs; charged to the run that asked), or until the first attempt after it started where
  the join was not seen;
- idle: up, and neither used nor waking.

Prices (the GPU catalog, `spec/gpus/catalog.yaml`) are dated list prices per VM-hour by machine type, region and capacity; a
pool's `cost.usd_per_node_hour` (or a local pool's `counts_as`) overrides them. A pool that consumes
a specific reservation is billed for the whole window whether its VMs run or not, at the on-demand
price (a reservation without a commitment bills at on-demand rates); scaling it down saves nothing.
"""

from dataclasses import dataclass, field

from rlops.spec import catalog


@dataclass(frozen=True)
class PoolRate:
    pool: str
    nodes: int                      # while up
    gpus_per_node: int
    usd_per_node_hour: float | None  # None: no price known for it
    capacity: str                   # on-demand, spot or "reservation NAME"
    source: str                     # where the price comes from
    billed_when_down: bool = False  # a reservation


def _listed(machine_type: str, region: str, spot: bool) -> tuple[float | None, str]:
    kind = "spot" if spot else "on-demand"
    row = catalog.GPU_MACHINES[machine_type].prices.get(region)
    price = None if row is None else row.spot if spot else row.on_demand
    if price is None:
        return None, f"no {kind} list price for {machine_type} in {region} (prices as of {catalog.PRICES_AS_OF})"
    return float(price), f"list price as of {catalog.PRICES_AS_OF} ({kind}, {region}; {row.source})"


def rates(env) -> list[PoolRate]:
    """Each GPU pool's size while up, GPUs and price per node-hour, with where the price comes from."""
    local = getattr(env, "local", None)
    if local is not None:
        counts = local.gpu_pool.counts_as
        price, source = (counts.usd_per_node_hour, "the spec's local.gpu_pool.counts_as") \
            if counts.usd_per_node_hour else _listed(counts.machine_type, counts.region, counts.spot)
        return [PoolRate(local.gpu_pool.name, local.gpu_pool.workers,
                         catalog.GPU_MACHINES[counts.machine_type].accelerators_per_node,
                         price, "spot" if counts.spot else "on-demand",
                         f"each local worker counted as one {counts.machine_type}: {source}")]
    found = []
    for pool in env.gpu_pools:
        capacity = f"reservation {pool.reservation}" if pool.reservation else "spot" if pool.spot else "on-demand"
        price, source = (pool.cost.usd_per_node_hour, "the spec's negotiated rate") if pool.cost \
            else _listed(pool.machine_type, env.region, pool.spot)
        # A reservation's size is not in the spec; rlops takes max_nodes, the most the pool can consume.
        nodes = pool.autoscaling.max_nodes if pool.reservation else pool.awake_nodes
        found.append(PoolRate(pool.name, nodes, pool.accelerator.count, price, capacity, source,
                              billed_when_down=bool(pool.reservation)))
    return found


@dataclass(frozen=True)
class Running:
    """One attempt's running interval; `ended` None while it runs."""

    run: str
    attempt: int
    started: float
    ended: float | None


@dataclass
class Seconds:
    up: float = 0.0
    used: float = 0.0
    waking: float = 0.0
    idle: float = 0.0
    reaped: float = 0.0


@dataclass
class Account:
    since: float
    until: float
    known_from: float | None                      # the first transition kept: nothing is known before it
    pool: Seconds = field(default_factory=Seconds)
    runs: dict[str, Seconds] = field(default_factory=dict)
    wakes: list[tuple[float, float | None]] = field(default_factory=list)  # (at, seconds to the first start)
    reaps: list[float] = field(default_factory=list)


def _clip(start: float, end: float, since: float, until: float) -> tuple[float, float] | None:
    start, end = max(start, since), min(end, until)
    return (start, end) if end > start else None


def up_intervals(transitions: list[tuple[float, str]], until: float) -> list[tuple[float, float]]:
    """When the pool was up, from its transitions (the state before the first is not known)."""
    spans, since = [], None
    for at, what in sorted(transitions):
        if what == "up" and since is None:
            since = at
        elif what == "down" and since is not None:
            spans.append((since, at))
            since = None
    if since is not None:
        spans.append((since, until))
    return spans


def account(transitions: list[tuple[float, str]], attempts: list[Running], since: float, until: float,
            ready: dict[float, float] | None = None) -> Account:
    """Up, used, waking, idle and reaped seconds of the pool over [since, until], and each run's share. A wake lasts
    until its first GPU node joined Ray (`ready`, by wake time) where that is known, else until the first attempt
    after it started."""
    result = Account(since, until, min((at for at, _ in transitions), default=None))
    up = [span for a, b in up_intervals(transitions, until) if (span := _clip(a, b, since, until))]
    if result.known_from is not None:
        known = _clip(result.known_from, until, since, until)
        result.pool.reaped = (known[1] - known[0] if known else 0.0) - sum(b - a for a, b in up)
    starts = sorted(a.started for a in attempts)
    for at, what in sorted(transitions):
        if what == "down":
            if since <= at <= until:
                result.reaps.append(at)
            continue
        if at == result.known_from:
            continue  # the first look: the pool was there already, not woken
        first = (ready or {}).get(at) or next((start for start in starts if start >= at), None)
        if since <= at <= until:
            result.wakes.append((at, None if first is None else first - at))
    waking = [(at, at + seconds) for at, seconds in result.wakes if seconds is not None]
    # Elementary intervals between every boundary: who runs, whether the pool is up or waking.
    edges = sorted({since, until, *(p for span in up for p in span), *(p for span in waking for p in span),
                    *(p for a in attempts for p in (a.started, a.ended or until))})
    for left, right in zip(edges, edges[1:]):
        if not since <= left < right <= until or not any(a <= left and right <= b for a, b in up):
            continue
        width = right - left
        result.pool.up += width
        running = sorted({a.run for a in attempts if a.started <= left and right <= (a.ended or until)})
        waking_now = next((span for span in waking if span[0] <= left and right <= span[1]), None)
        if running:
            result.pool.used += width
            for run in running:
                result.runs.setdefault(run, Seconds()).used += width / len(running)
        elif waking_now is not None:
            result.pool.waking += width
            asker = next((a.run for a in sorted(attempts, key=lambda a: a.started) if a.started >= waking_now[1]),
                         None)
            if asker is not None:
                result.runs.setdefault(asker, Seconds()).waking += width
        else:
            result.pool.idle += width
    return result


def preemption_loss(attempts: list[dict], series: dict[int, dict | None]) -> tuple[int, float]:
    """Steps done again after resumes, and their seconds: for each attempt that resumed, the steps its predecessor
    had reached past the resume point, at the predecessor's mean step time (`series`: each attempt's metrics)."""
    steps, seconds = 0, 0.0
    for before, after in zip(attempts, attempts[1:]):
        points = (series.get(before["attempt"]) or {}).get("steps", [])
        if not points or not after.get("resume_point"):
            continue
        reached, resumed = max(p[0] for p in points), after["resume_point"].get("step") or 0
        timed = [p[3] for p in points if p[3] is not None]
        redone = max(reached - resumed, 0)
        steps += redone
        seconds += redone * (sum(timed) / len(timed) if timed else 0.0)
    return steps, seconds
