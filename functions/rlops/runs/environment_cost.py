"""`rlops cost`: what an environment cost over a window (its GPU pools, and the system pool, GKE's fee, Lustre and the
functions beside them), what of the GPU time trained, and what the reaper saved.

Gathered from the pool's state (its transitions and measured wakes) and the run records (each attempt's
running interval, its per-step series for the steps redone after a resume), accounted by `rlops.costs`; the
rest of the environment at its spec's hourly list prices over the same window (`provision.pricing`),
and written as text, markdown or JSON, with a PNG timeline: the pool's nodes over time, each run's
attempts as bars, scale-downs and wakes marked.
"""

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlops import costs
from rlops.errors import Failure
from rlops.provision import pricing
from rlops.sites import Site
from rlops.spec import catalog
from rlops.spec.model import GcpEnvironment

KINDS = ("used", "waking", "idle", "reaped")


def gather(site: Site, since: float | None = None, until: float | None = None,
           run: str | None = None) -> dict[str, Any]:
    """The cost report's content (JSON-able)."""
    until = until or time.time()
    state, _ = site.pool.read()
    records = {name: record for name, (record, _) in site.records.all().items()}
    if run is not None and run not in records:
        raise Failure(site.records.unknown(run))
    attempts = [costs.Running(record.run, a.attempt, a.started_at or a.submitted_at, a.ended_at)
                for record in records.values() for a in record.attempts
                if a.started_at is not None or a.ended_at is not None]
    known_from = min((at for at, _ in state.transitions), default=None)
    since = since if since is not None else (known_from or until)
    measured = {wake.at: wake.phases for wake in state.wakes}
    account = costs.account(list(state.transitions), attempts, since, until, dict(state.ready), measured)
    window = until - max(since, known_from or until)
    pools, rates = [], costs.rates(site.env)
    for rate in rates:
        seconds = {"used": account.pool.used, "waking": account.pool.waking, "idle": account.pool.idle,
                   "reaped": account.pool.reaped}
        if rate.billed_when_down:  # never scaled (unless idle.scale_reserved), billed either way
            seconds["idle"] += seconds["reaped"]
            seconds["reaped"] = 0.0
        billed = window if rate.billed_when_down else seconds["used"] + seconds["waking"] + seconds["idle"]
        hours = {kind: value * rate.nodes * rate.gpus_per_node / 3600 for kind, value in seconds.items()}
        hours["billed"] = billed * rate.nodes * rate.gpus_per_node / 3600
        by_phase = {phase: value * rate.nodes * rate.gpus_per_node / 3600
                    for phase, value in account.waking_phases.items()}
        pools.append({"pool": rate.pool, "capacity": rate.capacity, "nodes": rate.nodes,
                      "gpus_per_node": rate.gpus_per_node, "usd_per_node_hour": rate.usd_per_node_hour,
                      "price_source": rate.source, "billed_when_down": rate.billed_when_down,
                      "gpu_hours": hours, "waking_gpu_hours_by_phase": by_phase, "usd": _usd(hours, rate),
                      "saved_usd": 0.0 if rate.billed_when_down else _usd({"reaped": hours["reaped"]}, rate)["reaped"]})
    runs = []
    for name, record in sorted(records.items()):
        if run is not None and name != run:
            continue  # the pool's rows count every run: another run's time is not this one's idle time
        share = account.runs.get(name, costs.Seconds())
        series = {a.attempt: site.records.metrics(name, a.attempt) for a in record.attempts} \
            if len(record.attempts) > 1 else {}
        steps, redone = costs.preemption_loss(record.to_json()["attempts"], series)
        hours = {"used": 0.0, "waking": 0.0, "redone": 0.0}
        usd = {"used": 0.0, "waking": 0.0, "redone": 0.0}
        for rate in rates:
            scale = rate.nodes * rate.gpus_per_node / 3600
            part = {"used": share.used * scale, "waking": share.waking * scale, "redone": redone * scale}
            for kind, value in part.items():
                hours[kind] += value
                usd[kind] += value / rate.gpus_per_node * (rate.usd_per_node_hour or 0.0)
        runs.append({"run": name, "state": record.state, "gpu_hours": hours, "usd": usd, "steps_redone": steps})
    others = _others(site, window)
    priced = [pool["usd"]["billed"] for pool in pools] + [row["usd"] for row in others]
    return {"environment": site.name, "since": since, "until": until, "known_from": known_from,
            "window_hours": window / 3600, "prices_as_of": catalog.PRICES_AS_OF, "pools": pools, "others": others,
            "total_usd": sum(usd for usd in priced if usd is not None),
            "unpriced": [p["pool"] for p in pools if p["usd_per_node_hour"] is None]
            + [row["resource"] for row in others if row["usd"] is None], "runs": runs,
            "wakes": [{"at": at, "seconds": seconds, "phases": [list(p) for p in measured.get(at, ())]}
                      for at, seconds in account.wakes],
            "reaps": account.reaps, "transitions": [list(t) for t in state.transitions],
            "attempts": [{"run": a.run, "attempt": a.attempt, "started": a.started, "ended": a.ended}
                         for a in attempts], "notes": _notes(pools, known_from, since)}


def _others(site: Site, window: float) -> list[dict[str, Any]]:
    """The rest of a GCP environment over the window at its spec's hourly rates: the system pool, GKE's fee and
    Lustre (billed whether the GPU pools are up or not) and the project's functions (an estimate). The GPU pools
    are the `pools` rows, counted from their history."""
    if not isinstance(site.env, GcpEnvironment):
        return []
    gpu_pools = {f"node_pool/{pool.name}" for pool in site.env.gpu_pools}
    return [{"resource": rate.key, "what": rate.what, "billed": rate.billed, "usd_per_hour": rate.usd_per_hour,
             "usd": None if rate.usd_per_hour is None else rate.usd_per_hour * window / 3600, "source": rate.source}
            for rate in pricing.environment_rates(site.name, site.env) if rate.key not in gpu_pools]


def _usd(hours: dict[str, float], rate: costs.PoolRate) -> dict[str, float | None]:
    if rate.usd_per_node_hour is None:
        return {kind: None for kind in hours}
    return {kind: value / rate.gpus_per_node * rate.usd_per_node_hour for kind, value in hours.items()}


def _notes(pools: list[dict[str, Any]], known_from: float | None, since: float) -> list[str]:
    notes = []
    if known_from is None:
        notes.append("the pool has no transitions yet (the reaper's first look writes the first): nothing to count")
    elif since < known_from:
        notes.append(f"the pool's history starts {_utc(known_from)}: nothing before is counted")
    for pool in pools:
        if pool["billed_when_down"]:
            notes.append(f"{pool['pool']} consumes a {pool['capacity']}: billed for the whole window whether its VMs "
                         f"run or not (taken as {pool['nodes']} nodes, its max_nodes); scaling it down saves nothing")
        if pool["usd_per_node_hour"] is None:
            notes.append(f"{pool['pool']}: {pool['price_source']}; set gpu_pools[].cost.usd_per_node_hour")
    if len(pools) > 1:
        notes.append("every pool is counted up and used together: rlops scales them together and does not yet "
                     "split a run's time between pools")
    return notes


def _utc(at: float | None) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float) -> str:
    """A span as a person says it: 45 s, 12 min, 3 h 05 min, 2 d 4 h."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def window(since: float, until: float, known_from: float | None) -> str:
    """The window counted: from the later of `since` and the pool's first recorded transition to `until`, the
    second date left out when it is the first's, with its length."""
    if known_from is None:
        return "no history yet: the reaper's first look at the pool starts it (nothing is counted before)"
    start = max(since, known_from)
    first, last = (datetime.fromtimestamp(at, UTC) for at in (start, until))
    end = last.strftime("%H:%M UTC") if first.date() == last.date() else last.strftime("%Y-%m-%d %H:%M UTC")
    return f"{first.strftime('%Y-%m-%d %H:%M')} to {end} ({duration(until - start)})"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def text(report: dict[str, Any], markdown: bool = False) -> str:
    rows = [("pool", "capacity", "nodes x GPUs", *(f"{k} GPU-h" for k in KINDS), "billed GPU-h", "billed", "saved")]
    for pool in report["pools"]:
        hours = pool["gpu_hours"]
        rows.append((pool["pool"], pool["capacity"], f"{pool['nodes']} x {pool['gpus_per_node']}",
                     *(f"{hours[k]:.2f}" for k in KINDS), f"{hours['billed']:.2f}", _money(pool["usd"]["billed"]),
                     _money(pool["saved_usd"])))
    run_rows = [("run", "state", "used GPU-h", "waking GPU-h", "cost", "steps redone", "redone GPU-h")]
    for run in report["runs"]:
        hours, usd = run["gpu_hours"], run["usd"]
        run_rows.append((run["run"], run["state"], f"{hours['used']:.2f}", f"{hours['waking']:.2f}",
                         _money(usd["used"] + usd["waking"]), str(run["steps_redone"]), f"{hours['redone']:.2f}"))
    wakes = [w["seconds"] for w in report["wakes"] if w["seconds"] is not None]
    head = [f"{report['environment']}: {window(report['since'], report['until'], report['known_from'])}; list "
            f"prices as of {report['prices_as_of']}",
            f"{len(report['reaps'])} scale-downs, {len(report['wakes'])} wakes"
            + (f" (median {sorted(wakes)[len(wakes) // 2]:.0f}s until the GPU nodes joined)" if wakes else "")]
    rest = [f"{pool['pool']} waking GPU-h by phase: "
            + ", ".join(f"{phase} {hours:.2f}" for phase, hours in pool["waking_gpu_hours_by_phase"].items())
            for pool in report["pools"] if pool["waking_gpu_hours_by_phase"]]
    rest = ["", *rest] if rest else []
    if report["others"]:
        other_rows = [("resource", "what", "billed", "$/h", "over the window")]
        other_rows += [(row["resource"], row["what"], row["billed"], _money(row["usd_per_hour"]), _money(row["usd"]))
                       for row in report["others"]]
        gpu = sum(p["usd"]["billed"] or 0.0 for p in report["pools"])
        rest += ["", _table(other_rows, markdown), "",
                f"total over the window: {_money(report['total_usd'])} (GPU pools {_money(gpu)}, the rest "
                f"{_money(report['total_usd'] - gpu)})"
                + (f"; not counted, no price known: {', '.join(report['unpriced'])}" if report["unpriced"] else "")]
    notes = report["notes"] + [f"{row['resource']}: {row['source']}" for row in report["others"]
                               if row["usd"] is None or row["billed"] == "estimate"]
    return "\n".join([*head, "", _table(rows, markdown), *rest, "", _table(run_rows, markdown),
                      *([""] + [f"note: {note}" for note in notes] if notes else [])]) + "\n"


def _table(rows: list[tuple[str, ...]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows[1:]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def as_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1, sort_keys=True)


def timeline(report: dict[str, Any], path: Path) -> Path:
    """The PNG: the pool's nodes over time, attempts as bars (one row per run), scale-downs and wakes marked."""
    import matplotlib  # noqa: PLC0415 cold start: the watch function imports this (a run's report), never draws

    matplotlib.use("Agg")  # drawn on servers and in CI, where there is no display
    from matplotlib import pyplot  # noqa: PLC0415 after matplotlib.use, which must come first

    when = lambda at: datetime.fromtimestamp(at, UTC)  # noqa: E731
    since, until = report["since"], report["until"]
    runs = sorted({a["run"] for a in report["attempts"] if a["started"] < until and (a["ended"] or until) > since})
    figure, (size, bars) = pyplot.subplots(2, 1, sharex=True, figsize=(10, 2.5 + 0.3 * len(runs)),
                                           gridspec_kw={"height_ratios": [1, max(1, len(runs) * 0.4)]})
    nodes = sum(p["nodes"] for p in report["pools"])
    xs, ys = [when(since)], [0]  # before the first transition kept, nothing is known: drawn as 0
    for at, what in sorted(report["transitions"]):
        level = nodes if what == "up" else 0
        if at <= since:
            ys[0] = level
        elif at < until:
            xs.append(when(at))
            ys.append(level)
    size.step(xs + [when(until)], ys + [ys[-1]], where="post", color="tab:blue")
    size.set_ylabel("GPU nodes up")
    for at in report["reaps"]:
        size.axvline(when(at), color="tab:red", linestyle=":", linewidth=1)
    for wake in report["wakes"]:
        size.axvline(when(wake["at"]), color="tab:green", linestyle="--", linewidth=1)
        if wake["seconds"]:
            size.axvspan(when(wake["at"]), when(wake["at"] + wake["seconds"]), color="tab:orange", alpha=0.3)
    for row, run in enumerate(runs):
        for attempt in (a for a in report["attempts"] if a["run"] == run):
            start, end = max(attempt["started"], since), min(attempt["ended"] or until, until)
            if end > start:
                bars.barh(row, (end - start) / 86400, left=when(start), height=0.6, color="tab:purple")
    bars.set_yticks(range(len(runs)), runs)
    bars.set_xlabel("UTC (red: scale-down, green: wake, orange: waking)")
    figure.suptitle(f"{report['environment']}: GPU pool and runs")
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
