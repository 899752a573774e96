"""What an environment's GPU pools cost, and what of it trained: the accounting behind `rlops cost`; and the hourly
list price of each priced resource (`resource_rate`: GPU and CPU node pools, Lustre capacity, GKE's fee, the
functions' estimate), behind `rlops cost` and the cost a plan adds. Pure.

The facts are what rlops writes anyway, each once and at the time it happened, so the totals do not
depend on how many ticks ran: the pool's transitions (`pool.json`: the reaper's first look and
scale-downs, the wakes) and each attempt's running interval (from its gate's clock, `started_at`, to
Ray's end time). Over a window:

- up: the pool has its nodes (billed); reaped: scaled down (not billed, unless a reservation);
- used: some attempt is running (shared evenly between the runs running at once);
- waking: from a wake until its last GPU node joined Ray (node start, image pull, Ray join: billed,
  nothing runs; charged to the run that asked), or until the first attempt after it started where
  the join was not seen; split by the wake's measured phases where known (each phase's span up to its end,
  the rest "unmeasured");
- idle: up, and neither used nor waking.

Prices (the GPU catalog, `spec/gpus/catalog.yaml`) are dated list prices per VM-hour by machine type, region and
capacity; a pool's `cost.usd_per_node_hour` (or a local pool's `counts_as`) overrides them. A pool that consumes
a specific reservation is billed for the whole window whether its VMs run or not, at the on-demand
price (a reservation without a commitment bills at on-demand rates); scaling it down saves nothing.
"""

from dataclasses import dataclass, field

from rlops.spec import catalog
from rlops.spec.model import GcpEnvironment, LocalEnvironment


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
    if row is None or price is None:
        return None, f"no {kind} list price for {machine_type} in {region} (prices as of {catalog.PRICES_AS_OF})"
    return float(price), f"list price as of {catalog.PRICES_AS_OF} ({kind}, {region}; {row.source})"


def rates(env: GcpEnvironment | LocalEnvironment) -> list[PoolRate]:
    """Each GPU pool's size while up, GPUs and price per node-hour, with where the price comes from."""
    if isinstance(env, LocalEnvironment):
        local = env.local
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
    waking_phases: dict[str, float] = field(default_factory=dict)  # the pool's waking seconds by wake phase
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
            ready: dict[float, float] | None = None,
            phases: dict[float, tuple[tuple[str, float, float], ...]] | None = None) -> Account:
    """Up, used, waking, idle and reaped seconds of the pool over [since, until], and each run's share. A wake lasts
    until its last GPU node joined Ray (`ready`, by wake time) where that is known, else until the first attempt
    after it started; its time is split by its measured `phases` (by wake time: (phase, start, end))."""
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
    ends = {at: [(end, phase) for phase, _, end in (phases or {}).get(at, ())] for at, _ in waking}
    edges = sorted({since, until, *(p for span in up for p in span), *(p for span in waking for p in span),
                    *(end for found in ends.values() for end, _ in found),
                    *(p for a in attempts for p in (a.started, a.ended or until))})
    for left, right in zip(edges, edges[1:], strict=False):
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
            phase = next((name for end, name in sorted(ends[waking_now[0]]) if end >= right), "unmeasured")
            result.waking_phases[phase] = result.waking_phases.get(phase, 0.0) + width
            asker = next((a.run for a in sorted(attempts, key=lambda a: a.started) if a.started >= waking_now[1]),
                         None)
            if asker is not None:
                result.runs.setdefault(asker, Seconds()).waking += width
        else:
            result.pool.idle += width
    return result


# Google's monthly prices are per 730 hours (its pricing pages' and the Billing Catalog's convention).
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Rate:
    """What one part of an environment costs an hour at list prices, and when it is billed."""

    key: str                    # the resource it prices (node_pool/NAME, lustre_instance/NAME, cluster/NAME), or
                                # "functions" (the project's, shared by its environments)
    what: str                   # "2 x a3-ultragpu-8g, reservation r"
    usd_per_hour: float | None  # None: no price known (`source` says why)
    billed: str                 # always, while up (a GPU pool scaled to zero costs nothing), estimate
    source: str


@dataclass(frozen=True)
class PoolHint:
    """What a node pool's fields leave out, from its spec: how many nodes it has while up (Ray's worker replicas,
    where it scales from zero; the system pool's fixed size) and a negotiated price."""

    replicas: int | None = None
    initial_nodes: int | None = None
    usd_per_node_hour: float | None = None


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def cpu_price(machine_type: str, region: str) -> tuple[float | None, str]:
    """The on-demand list price of a CPU machine type per hour: its vCPUs and memory at its family's rates."""
    family, _, shape = machine_type.partition("-")
    size = catalog.CPU_MACHINES.get(machine_type)
    kind, _, count = shape.rpartition("-")
    if size is None and count.isdigit() and kind in ("standard", "highmem", "highcpu"):
        # Compute Engine's predefined shapes: 4, 8 and 1 GiB per vCPU (general-purpose machine family pages).
        size = catalog.CpuMachine(int(count), int(count) * {"standard": 4, "highmem": 8, "highcpu": 1}[kind])
    row = catalog.PLATFORM_PRICES["cpu_machines"].get(family, {}).get(region)
    if size is None or row is None:
        return None, f"no list price for {machine_type} in {region} (spec/gpus/platform_prices.yaml)"
    price = size.vcpus * row["vcpu_hour"] + size.memory_gib * row["gib_hour"]
    return price, f"{size.vcpus} vCPU, {size.memory_gib:g} GiB at {region}'s {family.upper()} rates ({row['source']})"


def lustre_price(tier: int | None, region: str) -> tuple[float | None, str]:
    """Managed Lustre's list price per GiB-month of capacity in `tier` (MB/s per TiB)."""
    row = catalog.PLATFORM_PRICES["lustre"].get(tier, {}).get(region)
    if row is None:
        return None, (f"no list price for the {tier} MB/s/TiB tier in {region} in spec/gpus/platform_prices.yaml "
                      "(https://cloud.google.com/products/managed-lustre/pricing has it)")
    return row["usd_per_gib_month"], f"${row['usd_per_gib_month']}/GiB-month ({row['source']})"


def resource_rate(key: str, fields: dict, hint: PoolHint | None = None) -> Rate | None:
    """The hourly list price of one cloud resource, from its fields (desired or live, in rlops's vocabulary);
    None for a kind that costs nothing by itself (networks, subnets, firewalls, peering)."""
    kind, name = key.split("/", 1)
    hint = hint or PoolHint()
    if kind == "cluster":
        gke = catalog.PLATFORM_PRICES["gke"]
        return Rate(key, "GKE cluster management fee", gke["cluster_usd_per_hour"], "always", gke["source"])
    if kind == "lustre_instance":
        tier, capacity = fields.get("per_unit_storage_throughput"), fields.get("capacity_gib") or 0
        per_gib, source = lustre_price(tier, _region_of(fields["zone"]))
        return Rate(key, f"{capacity:,} GiB at {tier} MB/s/TiB",
                    None if per_gib is None else capacity * per_gib / HOURS_PER_MONTH, "always", source)
    if kind != "node_pool":
        return None
    machine = fields["machine_type"]
    region = _region_of((fields.get("node_locations") or ["?-?"])[0])
    zones = len(fields.get("node_locations") or [None])
    if machine in catalog.GPU_MACHINES:
        reservation, spot = fields.get("reservation"), bool(fields.get("spot"))
        if hint.usd_per_node_hour:
            price, source = float(hint.usd_per_node_hour), "the spec's negotiated rate"
        else:
            price, source = _listed(machine, region, spot)
        if reservation:
            # A reservation bills whether its VMs run or not; its size is not in the spec: max_nodes, the most the
            # pool can consume.
            nodes, billed, how = fields.get("max_nodes") or 0, "always", f"reservation {reservation}"
        else:
            nodes = fields.get("min_nodes") or hint.replicas or fields.get("max_nodes") or 0
            billed, how = "while up", "spot" if spot else "on-demand"
    else:
        price, source = cpu_price(machine, region)
        nodes = fields.get("min_nodes") if fields.get("autoscaling") else \
            fields.get("initial_node_count", hint.initial_nodes)
        nodes, billed, how = (nodes or 0) * zones, "always", "on-demand"
    return Rate(key, f"{nodes} x {machine}, {how}", None if price is None else nodes * price, billed, source)


def functions_rate() -> Rate:
    """The project's functions, an estimate (platform_prices.yaml says what it counts and assumes)."""
    f = catalog.PLATFORM_PRICES["functions"]
    seconds = f["calls_per_hour"] * f["seconds_per_call"]
    usd = seconds * (f["vcpus"] * f["vcpu_second"] + f["gib"] * f["gib_second"]) + \
        f["calls_per_hour"] * f["per_million_requests"] / 1e6
    return Rate("functions", "rlops's functions (the project's: shared by its environments)", usd, "estimate",
                f["source"])


def preemption_loss(attempts: list[dict], series: dict[int, dict | None]) -> tuple[int, float]:
    """Steps done again after resumes, and their seconds: for each attempt that resumed, the steps its predecessor
    had reached past the resume point, at the predecessor's mean step time (`series`: each attempt's metrics)."""
    steps, seconds = 0, 0.0
    for before, after in zip(attempts, attempts[1:], strict=False):
        points = (series.get(before["attempt"]) or {}).get("steps", [])
        if not points or not after.get("resume_point"):
            continue
        reached, resumed = max(p[0] for p in points), after["resume_point"].get("step") or 0
        timed = [p[3] for p in points if p[3] is not None]
        redone = max(reached - resumed, 0)
        steps += redone
        seconds += redone * (sum(timed) / len(timed) if timed else 0.0)
    return steps, seconds
