"""A run's report: curves and tables a person reads to judge a GRPO run. Pure rendering into one directory.

A run record says where a run is; it does not say whether it learned, where it stalled, or what a lost
node cost. Those show in curves: reward per step with each attempt in its own colour (a resumed attempt
redoes the steps after its checkpoint, and the overlap is where a reader sees whether it picked up the
same curve), step time, and checkpoint save time and size. The markdown carries the same numbers as
tables so the report reads without the images, and is byte-for-byte the same for the same inputs, so a
report committed or diffed changes only when the run did.
"""

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rlops.state.run_records import TERMINAL, RunRecord

MAX_STEP_ROWS = 200
BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class Report:
    markdown: Path
    plots: list[Path]


def write(out_dir: Path, record: dict, series: dict[int, dict], checkpoints: list[dict],
          pool: dict | None = None, cost: str | None = None) -> Report:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    attempts = sorted(record.get("attempts") or [], key=lambda a: a["attempt"])
    by_attempt = {n: series[n] for n in sorted(series)}
    saves = _save_seconds_by_step(by_attempt)
    sizes = {c["step"]: c.get("bytes") for c in checkpoints}
    plots = _draw(out_dir, record.get("run", ""), attempts, by_attempt, saves, sizes)

    lines = [f"# {record.get('run', '')}", "",
             f"- environment: {record.get('environment', '-')}",
             f"- recipe: {record.get('recipe', '-')}",
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
    if cost:
        lines.append(f"- cost: {cost}")
    lines.append("")
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", "## Attempts", "", "| attempt | state | submitted | ended | resumed from | failure |",
              "|---|---|---|---|---|---|"]
    for a in attempts:
        lines.append(f"| {a['attempt']} | {a.get('state', '-')} | {_utc(a.get('submitted_at'))} "
                     f"| {_utc(a.get('ended_at'))} | {_text(a.get('resumed_from'))} | {_failure(a.get('failure'))} |")
    lines += ["", "## Checkpoints", "", "| step | size (GB) | save seconds | GB/s | verified |",
              "|---|---|---|---|---|"]
    verified = {c["step"]: c.get("verified") for c in checkpoints}
    for step in sorted(set(sizes) | set(saves)):
        gb = sizes[step] / BYTES_PER_GB if sizes.get(step) is not None else None
        seconds = saves.get(step)
        rate = gb / seconds if gb is not None and seconds else None
        mark = {True: "yes", False: "NO", None: "-"}[verified.get(step)]
        lines.append(f"| {step} | {_number(gb, 2)} | {_number(seconds, 2)} | {_number(rate, 2)} | {mark} |")
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
    count, size = kept or (0, 0)
    return (f"set aside: {count} checkpoint(s), {size / 2**30:.2f} GiB"
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


def _boundary(attempt: dict, previous: dict | None) -> tuple[int, str] | None:
    """Where attempt N>1 begins on the step axis and why, from the attempt before it."""
    start = attempt.get("first_step") if attempt.get("first_step") is not None else attempt.get("resumed_from")
    if start is None:
        return None
    where = (f"resumed from step {attempt['resumed_from']}" if attempt.get("resumed_from") is not None
             else "started over")
    kind = ((previous or {}).get("failure") or {}).get("kind")
    return start, f"attempt {attempt['attempt']} {where}" + (f" ({kind})" if kind else "")


def _draw(out_dir: Path, run: str, attempts: list[dict], by_attempt: dict[int, dict],
          saves: dict, sizes: dict) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")  # reports are rendered on servers and in CI, where there is no display
    import matplotlib.pyplot as plt

    # One colour per attempt number, the same in every plot, so attempt 2 is the same colour throughout.
    colour = {n: f"C{i % 10}" for i, n in enumerate(sorted(set(by_attempt) | {a["attempt"] for a in attempts}))}
    plots = []

    def per_attempt(column: int, path: Path, ylabel: str, title: str, with_boundaries: bool):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for n, data in by_attempt.items():
            points = [(row[0], row[column]) for row in data.get("steps") or [] if row[column] is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, color=colour[n], marker="o" if len(xs) <= 200 else None, markersize=3,
                        linewidth=1, label=f"attempt {n}")
        if with_boundaries:
            previous = None
            for a in attempts:
                found = _boundary(a, previous) if a["attempt"] > 1 else None
                if found:
                    ax.axvline(found[0], linestyle="--", color=colour[a["attempt"]], linewidth=1, label=found[1])
                previous = a
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        plots.append(path)

    def any_value(column: int) -> bool:
        return any(row[column] is not None for data in by_attempt.values() for row in data.get("steps") or [])

    if any_value(1):
        per_attempt(1, out_dir / "reward.png", "mean reward", f"{run}: mean reward per step", True)
    if any_value(3):
        per_attempt(3, out_dir / "step-time.png", "seconds", f"{run}: seconds per step", False)
    if saves or sizes:
        known_sizes = {s: sizes[s] / BYTES_PER_GB for s in sorted(sizes) if sizes[s] is not None}
        fig, axes = plt.subplots(2 if known_sizes else 1, 1, figsize=(9, 6 if known_sizes else 3.5),
                                 sharex=True, squeeze=False)
        timed = {s: saves[s] for s in sorted(saves) if saves[s] is not None}
        # Markers, not bars: checkpoints are hundreds of steps apart, and a bar one step wide would not show.
        axes[0][0].plot(list(timed), list(timed.values()), "o-", color="C0")
        axes[0][0].set_ylabel("save seconds")
        axes[0][0].set_title(f"{run}: checkpoints")
        if known_sizes:
            axes[1][0].plot(list(known_sizes), list(known_sizes.values()), "s-", color="C1")
            axes[1][0].set_ylabel("GB")
        axes[-1][0].set_xlabel("step")
        for ax in axes[:, 0]:
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "checkpoints.png", dpi=100)
        plt.close(fig)
        plots.append(out_dir / "checkpoints.png")
    return plots


def _utc(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


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
    if record.state == "RUNNING" and total and record.step and current.started_at is not None:
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
