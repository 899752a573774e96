"""The figures of a run's report (`report_page`), as PNG files beside its page: reward per step with each attempt in
its own colour and where each resumed attempt began, step time, loss, checkpoint save time and size, and every other
number the workload logs; for several runs, a figure per metric with a line per run. Each curve is drawn raw and
smoothed.
"""

import re
from pathlib import Path
from typing import Any

from rlops.runs.readable import binary_unit

# TensorBoard's smoothing: an exponential moving average, debiased at the start; 0.6 is its default weight.
SMOOTHING = 0.6
SMOOTHED = f"smoothed: exponential moving average, weight {SMOOTHING}; raw: faint"
# The step line's numbers, by the name a comparison gives them, and the single run's file of each.
STEP_LINE_FILES = {"reward": "reward.png", "seconds per step": "step-time.png", "loss": "loss.png"}

Points = list[tuple[int, float]]  # (step, value), in step order


def smoothed(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's smoothing: each point the running average weighted `weight` towards the past, divided by the
    weights' sum so far (its debiasing), so the first points are not pulled towards zero."""
    out, average, total = [], 0.0, 0.0
    for value in values:
        average = average * weight + (1 - weight) * value
        total = total * weight + (1 - weight)
        out.append(average / total)
    return out


def _boundary(attempt: dict[str, Any], previous: dict[str, Any] | None) -> tuple[int, str] | None:
    """Where attempt N>1 begins on the step axis and why, from the attempt before it."""
    start = attempt.get("first_step") if attempt.get("first_step") is not None else attempt.get("resumed_from")
    if start is None:
        return None
    where = (f"resumed from step {attempt['resumed_from']}" if attempt.get("resumed_from") is not None
             else "started over")
    kind = ((previous or {}).get("failure") or {}).get("kind")
    return start, f"attempt {attempt['attempt']} {where}" + (f" ({kind})" if kind else "")


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415 cold start: the watch function imports this, and draws only as a run ends

    matplotlib.use("Agg")  # reports are rendered on servers and in CI, where there is no display
    import matplotlib.pyplot as plt  # noqa: PLC0415 after matplotlib.use, which must come first

    return plt


def _curve(ax: Any, points: Points, colour: str, label: str) -> None:
    """The raw line faint, the smoothed one over it and labelled."""
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, color=colour, marker="o" if len(xs) <= 200 else None, markersize=2, linewidth=0.8, alpha=0.35)
    ax.plot(xs, smoothed(list(ys)), color=colour, linewidth=1.6, label=label)


def _figure(plt: Any, title: str, ylabel: str) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.set_title(f"{title}\n{SMOOTHED}", fontsize="medium")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(plt: Any, fig: Any, ax: Any, path: Path, plots: list[Path]) -> None:
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plots.append(path)


def file_name(metric: str) -> str:
    """metric-completions-mean_length.png for `completions/mean_length`: one file per metric, named after it."""
    return "metric-" + re.sub(r"[^A-Za-z0-9_.]+", "-", metric).strip("-") + ".png"


def draw_run(out_dir: Path, run: str, attempts: list[dict[str, Any]], by_attempt: dict[int, dict[str, Any]],
             saves: dict[int, float | None], sizes: dict[int, int | None],
             metrics: dict[int, dict[str, Points]]) -> list[Path]:
    """One run's figures: `by_attempt` each attempt's series (`runs.progress.series`), `saves` and `sizes` each
    checkpoint's save seconds and bytes by step, `metrics` each attempt's logged numbers line by line."""
    plt = _pyplot()
    # One colour per attempt number, the same in every plot, so attempt 2 is the same colour throughout.
    colour = {n: f"C{i % 10}" for i, n in enumerate(sorted(set(by_attempt) | {a["attempt"] for a in attempts}))}
    plots: list[Path] = []

    def per_attempt(lines: dict[int, Points], path: Path, ylabel: str, title: str, with_boundaries: bool) -> None:
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

    def column(index: int) -> dict[int, Points]:
        return {n: [(row[0], row[index]) for row in data.get("steps") or [] if row[index] is not None]
                for n, data in by_attempt.items()}

    rewards, seconds = column(1), column(3)
    if any(rewards.values()):
        per_attempt(rewards, out_dir / "reward.png", "mean reward", f"{run}: mean reward per step", True)
    if any(seconds.values()):
        per_attempt(seconds, out_dir / "step-time.png", "seconds", f"{run}: seconds per step", False)
    if saves or sizes:
        known = {s: count for s, count in sorted(sizes.items()) if count is not None}
        unit, scale = binary_unit(max(known.values(), default=0))
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
        per_attempt({n: found.get(name, []) for n, found in metrics.items()}, out_dir / file_name(name), name,
                    f"{run}: {name}", False)
    return plots


def draw_comparison(out_dir: Path, curves: dict[str, dict[str, Points]], names: list[str],
                    runs: list[str]) -> list[Path]:
    """A figure per metric in `names` ({metric: {run: points}} in `curves`) with a line per run, each run in the
    same colour throughout (its place in `runs`)."""
    colour = {run: f"C{i % 10}" for i, run in enumerate(runs)}
    plt, plots = _pyplot(), []
    for name in names:
        fig, ax = _figure(plt, f"{name}, by run", name)
        for run, points in curves[name].items():
            _curve(ax, points, colour[run], run)
        _save(plt, fig, ax, out_dir / (STEP_LINE_FILES.get(name) or file_name(name)), plots)
    return plots
