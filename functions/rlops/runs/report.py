"""A run's report: curves and tables a person reads to judge a GRPO run. Pure rendering into one directory.

A run record says where a run is; it does not say whether it learned, where it stalled, or what a lost
node cost. Those show in curves: reward per step with each attempt in its own colour (a resumed attempt
redoes the steps after its checkpoint, and the overlap is where a reader sees whether it picked up the
same curve), step time, checkpoint save time and size, and every other number the workload logs (TRL's
entropy, completion lengths, clip ratios, grad norm, ...). Each curve is drawn raw and smoothed. The markdown
carries the run's metadata and the same numbers as tables so the report reads without the images, and is
byte-for-byte the same for the same inputs, so a report committed or diffed changes only when the run did.
`compare` draws several runs into one page: a figure per metric with a line per run, and their final values.
"""

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rlops.state.run_records import TERMINAL, RunRecord, RunState

MAX_STEP_ROWS = 200
# TensorBoard's smoothing: an exponential moving average, debiased at the start; 0.6 is its default weight.
SMOOTHING = 0.6
SMOOTHED = f"smoothed: exponential moving average, weight {SMOOTHING}; raw: faint"


@dataclass(frozen=True)
class Report:
    markdown: Path
    plots: list[Path]


def write(out_dir: Path, record: dict, series: dict[int, dict], checkpoints: list[dict],
          pool: dict | None = None, cost: str | None = None, about: dict[str, str] | None = None) -> Report:
    """`about`: what the record does not hold, in the order shown (the image, the spec commit, the W&B run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    attempts = sorted(record.get("attempts") or [], key=lambda a: a["attempt"])
    by_attempt = {n: series[n] for n in sorted(series)}
    saves = _save_seconds_by_step(by_attempt)
    sizes = {c["step"]: c.get("bytes") for c in checkpoints}
    metrics = {n: _metric_points(data) for n, data in by_attempt.items()}
    plots = _draw(out_dir, record.get("run", ""), attempts, by_attempt, saves, sizes, metrics)

    lines = [f"# {record.get('run', '')}", "",
             f"- environment: {record.get('environment', '-')}",
             f"- recipe: {record.get('recipe', '-')}",
             f"- requested by: {record.get('requested_by') or '-'}",
             *(f"- {label}: {value}" for label, value in (about or {}).items()),
             f"- state: {record.get('state', '-')}",
             f"- last step: {_text(record.get('step'))}",
             f"- last reward: {_number(record.get('reward'), 4)}"]
    rewards = [reward for _, reward, _, _ in _merged_steps(by_attempt) if reward is not None]
    if len(rewards) >= 10:  # is it learning: the mean reward of the first steps against the last ones
        lines.append(f"- mean reward, first 5 steps -> last 5 steps: {_number(sum(rewards[:5]) / 5, 4)} -> "
                     f"{_number(sum(rewards[-5:]) / 5, 4)}")
    aside = set_aside_said(attempts)
    if aside:
        lines.append(f"- {aside}")
    idle = _idle_before_reaped(attempts, pool)
    if idle is not None:
        lines.append(f"- idle before reaped: {idle / 60:.1f} min")
    lines += wakes_said(attempts, pool)
    if cost:
        lines.append(f"- cost: {cost}")
    lines += ["", "## Settings", ""]
    settings = record.get("settings") or {}
    # The recipe's fixed overrides, its allowed ones' defaults and the message's: what the job ran with.
    lines += (["| key | value |", "|---|---|"] + [f"| {key} | {_cell(json.dumps(settings[key]))} |"
                                                  for key in sorted(settings)]) if settings else ["none"]
    lines.append("")
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    merged_metrics = _merged_metrics(by_attempt)
    if merged_metrics:
        lines += ["", "## Metrics", "", "| metric | last | min | max | steps |", "|---|---|---|---|---|"]
        for name in sorted(merged_metrics):
            values = [value for _, value in merged_metrics[name]]
            lines.append(f"| {_cell(name)} | {number(values[-1])} | {number(min(values))} | {number(max(values))} "
                         f"| {len(values)} |")
    lines += ["", "## Attempts", "", "| attempt | state | submitted | ended | resumed from | failure |",
              "|---|---|---|---|---|---|"]
    for a in attempts:
        lines.append(f"| {a['attempt']} | {a.get('state', '-')} | {_utc(a.get('submitted_at'))} "
                     f"| {_utc(a.get('ended_at'))} | {_text(a.get('resumed_from'))} | {_failure(a.get('failure'))} |")
    lines += ["", "## Checkpoints", "", "| step | size | save seconds | written per second | verified |",
              "|---|---|---|---|---|"]
    verified = {c["step"]: c.get("verified") for c in checkpoints}
    for step in sorted(set(sizes) | set(saves)):
        seconds = saves.get(step)
        rate = size(sizes[step] / seconds) + "/s" if sizes.get(step) is not None and seconds else "-"
        mark = {True: "yes", False: "NO", None: "-"}[verified.get(step)]
        lines.append(f"| {step} | {size(sizes.get(step))} | {_number(seconds, 2)} | {rate} | {mark} |")
    rows = _merged_steps(by_attempt)
    shown = _thin_evenly(rows, MAX_STEP_ROWS)
    lines += ["", "## Steps", ""]
    if len(shown) < len(rows):
        # A table of every step of a long run is unreadable and bloats the page; the plots have them all.
        lines += [f"Showing {len(shown)} of {len(rows)} steps, evenly spaced.", ""]
    lines += ["| step | reward | loss | seconds |", "|---|---|---|---|"]
    for step, reward, loss, seconds in shown:
        lines.append(f"| {step} | {_number(reward, 4)} | {_number(loss, 4)} | {_number(seconds, 2)} |")
    markdown = out_dir / "report.md"
    markdown.write_text("\n".join(lines) + "\n")
    return Report(markdown=markdown, plots=plots)


def set_aside_said(attempts: list[dict]) -> str | None:
    """What the run directory's set-aside/ holds, as the latest attempt's gate found it after its pruning, and what
    the gates deleted to stay within the recipe's limit; None when nothing was ever set aside."""
    points = [a.get("resume_point") or {} for a in sorted(attempts, key=lambda a: a["attempt"])]
    kept = next((point["kept"] for point in reversed(points) if "kept" in point), None)
    pruned = [name for point in points for name in point.get("pruned", [])]
    if not kept and not pruned:
        return None
    count, held = kept or (0, 0)
    return (f"set aside: {count} checkpoint(s), {size(held)}"
            + (f"; deleted to stay within the recipe's set_aside limit: {', '.join(pruned)}" if pruned else ""))


def _merged_steps(by_attempt: dict[int, dict]) -> list[tuple]:
    """One row per step; a resumed attempt's redone step replaces the lost attempt's, as the run kept it."""
    merged = {}
    for data in by_attempt.values():
        for step, reward, loss, seconds in data.get("steps") or []:
            merged[step] = (step, reward, loss, seconds)
    return [merged[s] for s in sorted(merged)]


def _thin_evenly(rows: list, limit: int) -> list:
    if len(rows) <= limit:
        return rows
    last = len(rows) - 1
    # Rounded even spacing hits index 0 and the last index exactly, and never repeats since last > limit - 1.
    return [rows[round(i * last / (limit - 1))] for i in range(limit)]


def _save_seconds_by_step(by_attempt: dict[int, dict]) -> dict[int, float | None]:
    saves = {}
    for data in by_attempt.values():
        for step, seconds in data.get("saves") or []:
            saves[step] = seconds
    return saves


def _idle_before_reaped(attempts: list[dict], pool: dict | None) -> float | None:
    """Seconds the GPUs sat idle after the last attempt ended: what the reaper's grace period cost."""
    if not pool or not pool.get("scaled_down") or not attempts:
        return None
    since, ended = pool.get("since"), attempts[-1].get("ended_at")
    if since is None or ended is None or since < ended:
        return None
    return since - ended


def wakes_said(attempts: list[dict], pool: dict | None) -> list[str]:
    """A line for each wake of the pool an attempt of this run waited for (the train message that woke it
    submitted the attempt next): how long, phase by phase."""
    lines = []
    for wake in (pool or {}).get("wakes") or []:
        if not wake["phases"]:
            continue
        end = max(end for _, _, end in wake["phases"])
        waited = next((a for a in attempts if wake["at"] <= a["submitted_at"] <= end), None)
        if waited is None:
            continue
        lines.append(f"- the GPU pool woke for attempt {waited['attempt']} in {duration(end - wake['at'])}"
                     f"{'' if wake.get('done') else ' so far'}: "
                     + ", ".join(f"{phase} {duration(stop - start)}" for phase, start, stop in wake["phases"]))
    return lines


def _boundary(attempt: dict, previous: dict | None) -> tuple[int, str] | None:
    """Where attempt N>1 begins on the step axis and why, from the attempt before it."""
    start = attempt.get("first_step") if attempt.get("first_step") is not None else attempt.get("resumed_from")
    if start is None:
        return None
    where = (f"resumed from step {attempt['resumed_from']}" if attempt.get("resumed_from") is not None
             else "started over")
    kind = ((previous or {}).get("failure") or {}).get("kind")
    return start, f"attempt {attempt['attempt']} {where}" + (f" ({kind})" if kind else "")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # reports are rendered on servers and in CI, where there is no display
    import matplotlib.pyplot as plt

    return plt


def smoothed(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's smoothing: each point the running average weighted `weight` towards the past, divided by the
    weights' sum so far (its debiasing), so the first points are not pulled towards zero."""
    out, average, total = [], 0.0, 0.0
    for value in values:
        average = average * weight + (1 - weight) * value
        total = total * weight + (1 - weight)
        out.append(average / total)
    return out


def _curve(ax, points: list[tuple[int, float]], colour: str, label: str) -> None:
    """The raw line faint, the smoothed one over it and labelled."""
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, color=colour, marker="o" if len(xs) <= 200 else None, markersize=2, linewidth=0.8, alpha=0.35)
    ax.plot(xs, smoothed(list(ys)), color=colour, linewidth=1.6, label=label)


def _figure(plt, title: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.set_title(f"{title}\n{SMOOTHED}", fontsize="medium")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(plt, fig, ax, path: Path, plots: list[Path]) -> None:
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plots.append(path)


def _metric_points(data: dict) -> dict[str, list[tuple[int, float]]]:
    """An attempt's metrics line by line ({name: [(step, value)]}), NaN and infinities left out (nothing to draw)."""
    found: dict[str, list] = {}
    for step, numbers in data.get("metrics") or []:
        for name, value in numbers.items():
            if value is not None and abs(value) != float("inf") and value == value:
                found.setdefault(name, []).append((step, value))
    return found


def _merged_metrics(by_attempt: dict[int, dict]) -> dict[str, list[tuple[int, float]]]:
    """Each metric over the run, a resumed attempt's redone step replacing the lost attempt's (as `_merged_steps`)."""
    merged: dict[str, dict] = {}
    for data in by_attempt.values():
        for name, points in _metric_points(data).items():
            merged.setdefault(name, {}).update(points)
    return {name: sorted(points.items()) for name, points in merged.items()}


def _file_name(metric: str) -> str:
    """metric-completions-mean_length.png for `completions/mean_length`: one file per metric, named after it."""
    return "metric-" + re.sub(r"[^A-Za-z0-9_.]+", "-", metric).strip("-") + ".png"


def _draw(out_dir: Path, run: str, attempts: list[dict], by_attempt: dict[int, dict],
          saves: dict, sizes: dict, metrics: dict[int, dict[str, list]]) -> list[Path]:
    plt = _pyplot()
    # One colour per attempt number, the same in every plot, so attempt 2 is the same colour throughout.
    colour = {n: f"C{i % 10}" for i, n in enumerate(sorted(set(by_attempt) | {a["attempt"] for a in attempts}))}
    plots = []

    def per_attempt(lines: dict[int, list], path: Path, ylabel: str, title: str, with_boundaries: bool):
        fig, ax = _figure(plt, title, ylabel)
        for n, points in lines.items():
            if points:
                _curve(ax, points, colour[n], f"attempt {n}")
        if with_boundaries:
            previous = None
            for a in attempts:
                found = _boundary(a, previous) if a["attempt"] > 1 else None
                if found:
                    ax.axvline(found[0], linestyle="--", color=colour[a["attempt"]], linewidth=1, label=found[1])
                previous = a
        _save(plt, fig, ax, path, plots)

    def column(index: int) -> dict[int, list]:
        return {n: [(row[0], row[index]) for row in data.get("steps") or [] if row[index] is not None]
                for n, data in by_attempt.items()}

    rewards, seconds = column(1), column(3)
    if any(rewards.values()):
        per_attempt(rewards, out_dir / "reward.png", "mean reward", f"{run}: mean reward per step", True)
    if any(seconds.values()):
        per_attempt(seconds, out_dir / "step-time.png", "seconds", f"{run}: seconds per step", False)
    if saves or sizes:
        known = {s: sizes[s] for s in sorted(sizes) if sizes[s] is not None}
        unit, scale = _unit(max(known.values(), default=0))
        fig, axes = plt.subplots(2 if known else 1, 1, figsize=(9, 6 if known else 3.5), sharex=True, squeeze=False)
        timed = {s: saves[s] for s in sorted(saves) if saves[s] is not None}
        # Markers, not bars: checkpoints are hundreds of steps apart, and a bar one step wide would not show.
        axes[0][0].plot(list(timed), list(timed.values()), "o-", color="C0")
        axes[0][0].set_ylabel("save seconds")
        axes[0][0].set_title(f"{run}: checkpoints")
        if known:
            axes[1][0].plot(list(known), [b / scale for b in known.values()], "s-", color="C1")
            axes[1][0].set_ylabel(unit)
        axes[-1][0].set_xlabel("step")
        for ax in axes[:, 0]:
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "checkpoints.png", dpi=100)
        plt.close(fig)
        plots.append(out_dir / "checkpoints.png")
    if any(column(2).values()):
        per_attempt(column(2), out_dir / "loss.png", "loss", f"{run}: loss per step", False)
    for name in sorted({name for found in metrics.values() for name in found}):
        per_attempt({n: found.get(name, []) for n, found in metrics.items()}, out_dir / _file_name(name), name,
                    f"{run}: {name}", False)
    return plots


# The step line's numbers keep the single run's file names.
_OWN_FILES = {"reward": "reward.png", "seconds per step": "step-time.png", "loss": "loss.png"}


def compare(out_dir: Path, runs: list[tuple[RunRecord, dict[int, dict]]], now: float) -> Report:
    """Several runs on one page: a figure per metric (reward, step time, loss, then every logged one) with a line
    per run, raw and smoothed; a table of each run's state, steps and duration, and one of each metric's final
    value and best (or range, where a metric has no better direction) per run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves: dict[str, dict[str, list]] = {}  # metric -> run -> [(step, value)]
    for record, series in runs:
        by_attempt = {n: series[n] for n in sorted(series)}
        rows = _merged_steps(by_attempt)
        for name, index in (("reward", 1), ("loss", 2), ("seconds per step", 3)):
            points = [(row[0], row[index]) for row in rows if row[index] is not None]
            if points:
                curves.setdefault(name, {})[record.run] = points
        for name, points in _merged_metrics(by_attempt).items():
            curves.setdefault(name, {})[record.run] = points
    names = [name for name in _OWN_FILES if name in curves]
    names += sorted(name for name in curves if name not in names)
    colour = {record.run: f"C{i % 10}" for i, (record, _) in enumerate(runs)}
    plt, plots = _pyplot(), []
    for name in names:
        fig, ax = _figure(plt, f"{name}, by run", name)
        for run, points in curves[name].items():
            _curve(ax, points, colour[run], run)
        _save(plt, fig, ax, out_dir / (_OWN_FILES.get(name) or _file_name(name)), plots)

    lines = [f"# Comparing {', '.join(record.run for record, _ in runs)}", "",
             "| run | recipe | state | steps | started | duration | requested by |", "|---|---|---|---|---|---|---|"]
    for record, _ in runs:
        said = progress(record, now)
        lines.append(f"| {record.run} | {record.recipe} | {record.state} | {_text(record.step)}"
                     f"{f'/{said.total}' if said.total else ''} | {_utc(said.started_at)} | {duration(said.seconds)} "
                     f"| {record.requested_by} |")
    lines += [""] + [f"![{p.stem}]({p.name})" for p in plots]
    if names:
        lines += ["", "## Final values", "",
                  "Each cell: the last value, then the best (the highest reward or accuracy, the lowest loss or step "
                  "time), or the range where a metric has no better direction.", "",
                  "| metric | " + " | ".join(record.run for record, _ in runs) + " |",
                  "|---|" + "---|" * len(runs)]
        for name in names:
            cells = [_final_and_best(name, curves[name].get(record.run)) for record, _ in runs]
            lines.append(f"| {_cell(name)} | " + " | ".join(cells) + " |")
    markdown = out_dir / "report.md"
    markdown.write_text("\n".join(lines) + "\n")
    return Report(markdown=markdown, plots=plots)


def _better(metric: str):
    """max or min, where a metric has a better direction; None where it has none."""
    if re.search(r"reward|accuracy", metric) and not re.search(r"std|zero", metric):
        return max
    if re.search(r"loss|seconds|time", metric):
        return min
    return None


def _final_and_best(metric: str, points: list | None) -> str:
    if not points:
        return "-"
    values = [value for _, value in points]
    best = _better(metric)
    if best:
        return f"{number(values[-1])} (best {number(best(values))})"
    return f"{number(values[-1])} ({number(min(values))} to {number(max(values))})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def number(value: float | None) -> str:
    """A logged number as a person reads it: four significant digits (0.1235, 1.235e-05, 1235), never seventeen."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _unit(count: float) -> tuple[str, int]:
    """The binary unit a byte count reads best in, and its size."""
    power = 0
    while power < len(UNITS) - 1 and count >= 1024 ** (power + 1):
        power += 1
    return UNITS[power], 1024 ** power


def size(count: float | None) -> str:
    """Bytes as a person reads them: 812 B, 812 KiB, 9.5 MiB, 1.25 GiB (three significant digits); - when unknown."""
    if count is None:
        return "-"
    unit, scale = _unit(count)
    value = count / scale
    if unit == "B":
        return f"{count:.0f} B"
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"


def _utc(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _text(value) -> str:
    return "-" if value is None else str(value)


def _failure(failure: dict | None) -> str:
    if not failure:
        return "-"
    message = " ".join(str(failure.get("message") or "").split())
    # A pipe in a Ray error message would split the table cell.
    text = f"{failure.get('kind', '?')}: {message}" if message else str(failure.get("kind", "?"))
    return text.replace("|", "\\|")


# Where a recipe's settings say how many steps a run takes: the local recipe's (TRL) and NeMo RL's key.
TOTAL_STEP_SETTINGS = ("max_steps", "grpo.max_num_steps")


@dataclass(frozen=True)
class Progress:
    total: int | None          # the steps the run takes, when its settings say
    started_at: float | None   # when its first attempt began on a node
    seconds: float | None      # how long it has run since, to its end once it ended
    eta_seconds: float | None  # while running: the steps left at the current attempt's pace so far


def progress(record: RunRecord, now: float) -> Progress:
    total = next((int(record.settings[key]) for key in TOTAL_STEP_SETTINGS if key in record.settings), None)
    started = next((a.started_at for a in record.attempts if a.started_at is not None), None)
    ended = max((a.ended_at for a in record.attempts if a.ended_at), default=None)
    seconds = None if started is None else (ended if record.state in TERMINAL and ended else now) - started
    current, eta = record.current, None
    if record.state == RunState.RUNNING and total and record.step and current.started_at is not None:
        done = record.step - (current.first_step or 1) + 1  # steps this attempt made: a resumed one starts later
        if done > 0:
            eta = max(total - record.step, 0) * (now - current.started_at) / done
    return Progress(total, started, seconds, eta)


def duration(seconds: float | None) -> str:
    """1h02m, 4m10s, 12s; - when unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
