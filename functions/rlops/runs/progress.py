"""A run's progress from what its job prints, and its last complete checkpoint on a mounted directory.

The local recipe prints `[rlops] step=N reward=R loss=L seconds=S`, then `[rlops] metrics step=N {JSON}` (every
other number TRL logged for the step: entropy, completion lengths, clip ratios, grad norm, reward std, ...),
`[rlops] checkpoint step=N seconds=S` (after the save) and `[rlops] resuming from checkpoint-N`, behind Ray's
actor prefix when it trains in an actor. NeMo RL's grpo.py (v0.4.0,
v0.5.0) prints `===== Epoch E/... =====`, then for each step `===== Step i/M =====`, with i counted
within the epoch and M = min(batches per epoch, max_num_steps), and later that step's `• Loss: L`,
`• Avg Reward: R` (or `Avg Total Reward`), and under `Timing:` `• Total step time: Ss` and, when it
saved, `• checkpointing: Ss (P%)`. Its `Saving checkpoint for step N...` comes before the save
starts, so it says nothing about a checkpoint being complete: for NeMo RL that comes from the
checkpoint directory. Between a step's banner and its results come its actors' lines (NeMo RL sends
them to the driver), any number of them: a tick that reads only the output's end passes in the last
banner an earlier tick saw.
"""

import json
import re
from pathlib import Path
from typing import Any

from rlops.checkpoints import gate
from rlops.checkpoints.layout import complete

# A line of a Ray actor, as Ray's log_to_driver prints it in the driver's output: `(Name pid=N[, ip=A]) `, the
# parentheses colored unless RAY_COLOR_PREFIX=0 (ray/_private/worker.py print_worker_logs). The local recipe prints
# from one when it plays NeMo RL's driver (`driver: head`).
_RAY = r"(?:(?:\x1b\[[0-9;]*m)?\([^()\n]*pid=\d+[^()\n]*\)(?:\x1b\[[0-9;]*m)? )?"
_TRL_STEP = re.compile(rf"^{_RAY}\[rlops\] step=(\d+) reward=([-\d.eE+naif]+)", re.M)
_TRL_SAVE = re.compile(rf"^{_RAY}\[rlops\] checkpoint step=(\d+)", re.M)
_TRL_RESUME = re.compile(rf"^{_RAY}\[rlops\] resuming from checkpoint-(\d+)", re.M)
# The driver's own last line. Driving an actor, the actor's last step lines may never reach the driver's output:
# Ray forwards an actor's lines asynchronously, and the driver exits as soon as the actor returns.
_TRL_DONE = re.compile(r"^\[rlops\] done step=(\d+)", re.M)
_NUMBER = r"([-\d.eE+naif]+)"
_TRL_POINT = re.compile(rf"^{_RAY}\[rlops\] step=(\d+) reward={_NUMBER}(?: loss={_NUMBER})?(?: seconds={_NUMBER})?",
                        re.M)
# Its own line, not more fields on the step line: a reader of the step line (an older watcher) is unchanged.
_TRL_METRICS = re.compile(rf"^{_RAY}\[rlops\] metrics step=(\d+) (\{{.*\}})\s*$", re.M)
_TRL_SAVED = re.compile(rf"^{_RAY}\[rlops\] checkpoint step=(\d+)(?: seconds={_NUMBER})?", re.M)
_NEMO_SERIES = re.compile(rf"^=+ Epoch (?P<epoch>\d+)/\d+ =+$|^=+ Step (?P<step>\d+)/(?P<of>\d+) =+$"
                          rf"|• Loss: (?P<loss>{_NUMBER[1:-1]})|Avg (?:Total )?Reward: (?P<reward>{_NUMBER[1:-1]})"
                          rf"|• Total step time: (?P<seconds>{_NUMBER[1:-1]})s"
                          rf"|• checkpointing: (?P<save>{_NUMBER[1:-1]})s",
                          re.M)


def resume_point(text: str) -> dict[str, Any] | None:
    """What the attempt's checkpoint gate printed (`rlops.checkpoints.gate`): its step, what it set aside."""
    for line in text.splitlines():
        if line.startswith(gate.PREFIX):
            return json.loads(line[len(gate.PREFIX):])
    return None


def from_logs(runner: str, text: str, epoch: int = 1, banner: dict[str, Any] | None = None) -> dict[str, Any]:
    """{step, reward, first_step, resumed_from, reported_checkpoint}; None where the output does not say.

    For NeMo RL also `epoch`, the last epoch banner seen, and `banner`, the last step banner seen
    ({"step": N counted across epochs, "rewarded": whether N's reward was printed since}): a later tick
    that reads only the output's end, where there may be neither, passes them back in.
    """
    found: dict[str, Any] = {"step": None, "reward": None, "first_step": None, "resumed_from": None,
                             "reported_checkpoint": None}
    if runner == "trl":
        steps = _TRL_STEP.findall(text)
        if steps:
            found.update(step=int(steps[-1][0]), reward=float(steps[-1][1]), first_step=int(steps[0][0]))
        done = _TRL_DONE.findall(text)
        if done and int(done[-1]) > (found["step"] or 0):
            found["step"] = int(done[-1])
        saves, resumed = _TRL_SAVE.findall(text), _TRL_RESUME.search(text)
        found["reported_checkpoint"] = int(saves[-1]) if saves else None
        found["resumed_from"] = int(resumed.group(1)) if resumed else None
    else:
        found.update(_nemo_steps(text, epoch, banner))
    return found


def _nemo_events(text: str, epoch: int) -> tuple[list[tuple[str, float]], int]:
    """NeMo RL's lines in order, as (kind, value): ("step", the step counted across epochs, a whole number), or
    ("loss" | "reward" | "seconds" | "save", its number); and the last epoch."""
    events: list[tuple[str, float]] = []
    for match in _NEMO_SERIES.finditer(text):
        if match["epoch"]:
            epoch = int(match["epoch"])
        elif match["step"]:
            events.append(("step", (epoch - 1) * int(match["of"]) + int(match["step"])))
        else:
            kind = next(kind for kind in ("loss", "reward", "seconds", "save") if match[kind] is not None)
            events.append((kind, float(match[kind])))
    return events, epoch


def _carried(events: list[tuple[str, float]], banner: dict[str, Any] | None) -> int | None:
    """The step the lines before the output's first banner belong to: the banner an earlier tick saw, if this
    output begins after it (its first banner, if any, is a later step's) and its reward is still to come. Once it
    was printed, the lines up to the next banner are given to no step: that banner may be one no tick saw."""
    if banner is None or banner["rewarded"]:
        return None
    first = next((value for kind, value in events if kind == "step"), None)
    return None if first is not None and first <= banner["step"] else banner["step"]


def _nemo_steps(text: str, epoch: int, banner: dict[str, Any] | None) -> dict[str, Any]:
    """The last step whose reward was printed, with that reward; the first step this output shows; the epoch and
    the step banner to carry to the next tick."""
    events, epoch = _nemo_events(text, epoch)
    step, rewarded = _carried(events, banner), False
    found: dict[str, Any] = {"epoch": epoch}
    for kind, value in events:
        if kind == "step":
            step, rewarded = int(value), False
            found.setdefault("first_step", step)
        elif kind == "reward" and step is not None and not rewarded:  # the first after a step's banner is its own
            rewarded = True
            found.update(step=step, reward=value)
    if step is not None:
        found["banner"] = {"step": step, "rewarded": rewarded}
    return found


_FIELDS = {"reward": 1, "loss": 2, "seconds": 3}


def series(runner: str, text: str, epoch: int = 1, banner: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """Every step the output shows, as {"steps": [[step, reward, loss, seconds], ...], "saves": [[step,
    seconds], ...], "metrics": [[step, {name: value}], ...]} (None where it does not say; metrics: the local
    recipe's other numbers, none for NeMo RL yet); for NeMo RL steps are counted across epochs and the lines
    before the first banner belong to the carried `banner`'s step, as in `from_logs`, and a reward is the first
    one after its step's banner."""
    steps: dict[int, list[Any]] = {}
    saves: dict[int, list[Any]] = {}
    metrics: dict[int, list[Any]] = {}
    if runner == "trl":
        for step, reward, loss, seconds in _TRL_POINT.findall(text):
            steps[int(step)] = [int(step), _float(reward), _float(loss), _float(seconds)]
        for step, seconds in _TRL_SAVED.findall(text):
            saves[int(step)] = [int(step), _float(seconds)]
        for step, document in _TRL_METRICS.findall(text):
            numbers = _numbers(document)
            if numbers:
                metrics[int(step)] = [int(step), numbers]
    else:
        events, _ = _nemo_events(text, epoch)
        step, rewarded = _carried(events, banner), False
        for kind, value in events:
            if kind == "step":
                step, rewarded = int(value), False
                steps[step] = [step, None, None, None]
            elif step is None or (kind == "reward" and rewarded):
                continue
            elif kind == "save":
                saves[step] = [step, value]
            else:
                rewarded = rewarded or kind == "reward"
                steps.setdefault(step, [step, None, None, None])[_FIELDS[kind]] = value
    return {"steps": [steps[k] for k in sorted(steps)], "saves": [saves[k] for k in sorted(saves)],
            "metrics": [metrics[k] for k in sorted(metrics)]}


def _numbers(document: str) -> dict[str, float] | None:
    """The numbers of a metrics line; None for a line cut short (a tail that begins or ends inside it)."""
    try:
        found = json.loads(document)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(name): float(value) for name, value in found.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


SERIES_LIMIT = 4000   # points kept per attempt: a 10,000-step run's series stays ~150 KB of JSON
RECENT = 200          # the newest points are always kept whole
# A metrics point holds some twenty named numbers (TRL's), so fewer of them are kept: 500 are ~280 KB of JSON,
# and the series is read and written whole on every tick of a running attempt.
LIMITS = {"steps": 1.0, "saves": 1.0, "metrics": 0.125}


def merged(old: dict[str, list[Any]] | None, new: dict[str, list[Any]],
           limit: int = SERIES_LIMIT) -> dict[str, list[Any]]:
    """`new` points over `old` ones (a tick reads only the output's end), value by value: a step one tick saw
    in part (its banner and loss, say) is completed by the next (its reward and time). Thinned to at most about
    `limit` steps: beyond the newest RECENT, only steps divisible by the smallest power of two that fits, so a
    step kept once stays kept and the curve keeps its shape."""
    result: dict[str, list[Any]] = {}
    for kind, share in LIMITS.items():
        kept = int(limit * share)
        points = {point[0]: point for point in (old or {}).get(kind, [])}
        for point in new.get(kind, []):
            known = points.get(point[0], point)
            points[point[0]] = [value if value is not None else was for value, was in zip(point, known, strict=False)]
        ordered = [points[step] for step in sorted(points)]
        stride = 1
        while len(ordered) - RECENT > 0 and sum(1 for p in ordered[:-RECENT] if p[0] % stride == 0) + RECENT > kept:
            stride *= 2
        older = [p for p in ordered[:-RECENT] if p[0] % stride == 0] if len(ordered) > RECENT else []
        result[kind] = older + ordered[-RECENT:]
    return result


def _float(text: str) -> float | None:
    return float(text) if text else None


def last_complete_checkpoint(directory: Path) -> int | None:
    """The highest step with a complete checkpoint in a run directory (either layout)."""
    found = complete(directory)
    return found[-1].step if found else None
