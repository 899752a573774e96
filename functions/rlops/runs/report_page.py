"""A run's report page: the tables and figures a person reads to judge a GRPO run. Pure rendering into one
directory, from data `runs.report_writer` gathers.

A run record says where a run is; it does not say whether it learned, where it stalled, or what a lost node cost.
Those show in curves (`report_figures`): reward per step with each attempt in its own colour (a resumed attempt
redoes the steps after its checkpoint, and the overlap is where a reader sees whether it picked up the same curve),
step time, checkpoint save time and size, and every other number the workload logs (TRL's entropy, completion
lengths, clip ratios, grad norm, ...). The markdown carries the run's metadata and the same numbers as tables so the
report reads without the images, and is byte-for-byte the same for the same inputs, so a report committed or diffed
changes only when the run did.
`compare` draws several runs into one page: a figure per metric with a line per run, and their final values.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlops.runs import report_figures
from rlops.runs.pace import progress
from rlops.runs.readable import duration, number, size
from rlops.runs.report_figures import Points
from rlops.state.run_records import RunRecord

MAX_STEP_ROWS = 200
StepRow = tuple[int, float | None, float | None, float | None]  # step, reward, loss, seconds


@dataclass(frozen=True)
class Report:
    markdown: Path
    plots: list[Path]


def write(out_dir: Path, record: dict[str, Any], series: dict[int, dict[str, Any]], checkpoints: list[dict[str, Any]],
          pool: dict[str, Any] | None = None, cost: str | None = None, about: dict[str, str] | None = None) -> Report:
    """The page of one run: `record` its run record's JSON, `series` each attempt's (`runs.progress.series`),
    `checkpoints` {step, bytes, verified} each, `pool` the GPU pool's state's JSON, `cost` its line of `rlops cost`.
    `about`: what the record does not hold, in the order shown (the image, the spec commit, the W&B run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    attempts = sorted(record.get("attempts") or [], key=lambda a: a["attempt"])
    by_attempt = {n: series[n] for n in sorted(series)}
    saves = _save_seconds_by_step(by_attempt)
    sizes = {c["step"]: c.get("bytes") for c in checkpoints}
    metrics = {n: _metric_points(data) for n, data in by_attempt.items()}
    plots = report_figures.draw_run(out_dir, record.get("run", ""), attempts, by_attempt, saves, sizes, metrics)

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
        seconds, written = saves.get(step), sizes.get(step)
        rate = size(written / seconds) + "/s" if written is not None and seconds else "-"
        mark = {True: "yes", False: "NO", None: "-"}[verified.get(step)]
        lines.append(f"| {step} | {size(written)} | {_number(seconds, 2)} | {rate} | {mark} |")
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


def set_aside_said(attempts: list[dict[str, Any]]) -> str | None:
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


def _merged_steps(by_attempt: dict[int, dict[str, Any]]) -> list[StepRow]:
    """One row per step; a resumed attempt's redone step replaces the lost attempt's, as the run kept it."""
    merged = {}
    for data in by_attempt.values():
        for step, reward, loss, seconds in data.get("steps") or []:
            merged[step] = (step, reward, loss, seconds)
    return [merged[s] for s in sorted(merged)]


def _thin_evenly(rows: list[StepRow], limit: int) -> list[StepRow]:
    if len(rows) <= limit:
        return rows
    last = len(rows) - 1
    # Rounded even spacing hits index 0 and the last index exactly, and never repeats since last > limit - 1.
    return [rows[round(i * last / (limit - 1))] for i in range(limit)]


def _save_seconds_by_step(by_attempt: dict[int, dict[str, Any]]) -> dict[int, float | None]:
    saves = {}
    for data in by_attempt.values():
        for step, seconds in data.get("saves") or []:
            saves[step] = seconds
    return saves


def _idle_before_reaped(attempts: list[dict[str, Any]], pool: dict[str, Any] | None) -> float | None:
    """Seconds the GPUs sat idle after the last attempt ended: what the reaper's grace period cost."""
    if not pool or not pool.get("scaled_down") or not attempts:
        return None
    since, ended = pool.get("since"), attempts[-1].get("ended_at")
    if since is None or ended is None or since < ended:
        return None
    return since - ended


def wakes_said(attempts: list[dict[str, Any]], pool: dict[str, Any] | None) -> list[str]:
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


def _metric_points(data: dict[str, Any]) -> dict[str, Points]:
    """An attempt's metrics line by line ({name: [(step, value)]}), NaN and infinities left out (nothing to draw)."""
    found: dict[str, Points] = {}
    for step, numbers in data.get("metrics") or []:
        for name, value in numbers.items():
            if value is not None and abs(value) != float("inf") and value == value:
                found.setdefault(name, []).append((step, value))
    return found


def _merged_metrics(by_attempt: dict[int, dict[str, Any]]) -> dict[str, Points]:
    """Each metric over the run, a resumed attempt's redone step replacing the lost attempt's (as `_merged_steps`)."""
    merged: dict[str, dict[int, float]] = {}
    for data in by_attempt.values():
        for name, points in _metric_points(data).items():
            merged.setdefault(name, {}).update(points)
    return {name: sorted(points.items()) for name, points in merged.items()}


def compare(out_dir: Path, runs: list[tuple[RunRecord, dict[int, dict[str, Any]]]], now: float) -> Report:
    """Several runs on one page: a figure per metric (reward, step time, loss, then every logged one) with a line
    per run, raw and smoothed; a table of each run's state, steps and duration, and one of each metric's final
    value and best (or range, where a metric has no better direction) per run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves: dict[str, dict[str, Points]] = {}  # metric -> run -> [(step, value)]
    for record, series in runs:
        by_attempt = {n: series[n] for n in sorted(series)}
        rows = _merged_steps(by_attempt)
        for name, index in (("reward", 1), ("loss", 2), ("seconds per step", 3)):
            points = [(row[0], value) for row in rows if (value := row[index]) is not None]
            if points:
                curves.setdefault(name, {})[record.run] = points
        for name, points in _merged_metrics(by_attempt).items():
            curves.setdefault(name, {})[record.run] = points
    names = [name for name in report_figures.STEP_LINE_FILES if name in curves]
    names += sorted(name for name in curves if name not in names)
    plots = report_figures.draw_comparison(out_dir, curves, names, [record.run for record, _ in runs])

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


def _better(metric: str) -> Callable[[list[float]], float] | None:
    """max or min, where a metric has a better direction; None where it has none."""
    if re.search(r"reward|accuracy", metric) and not re.search(r"std|zero", metric):
        return max
    if re.search(r"loss|seconds|time", metric):
        return min
    return None


def _final_and_best(metric: str, points: Points | None) -> str:
    if not points:
        return "-"
    values = [value for _, value in points]
    best = _better(metric)
    if best:
        return f"{number(values[-1])} (best {number(best(values))})"
    return f"{number(values[-1])} ({number(min(values))} to {number(max(values))})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _utc(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _failure(failure: dict[str, Any] | None) -> str:
    if not failure:
        return "-"
    message = " ".join(str(failure.get("message") or "").split())
    # A pipe in a Ray error message would split the table cell.
    text = f"{failure.get('kind', '?')}: {message}" if message else str(failure.get("kind", "?"))
    return text.replace("|", "\\|")
