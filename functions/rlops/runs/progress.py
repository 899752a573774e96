"""A run's progress from what its job prints, and its last complete checkpoint on a mounted directory.

The local recipe prints `[rlops] step=N reward=R ...`, `[rlops] checkpoint step=N` (after the save)
and `[rlops] resuming from checkpoint-N`. NeMo RL's grpo.py (v0.4.0, v0.5.0) prints
`===== Epoch E/... =====`, then for each step `===== Step i/M =====`, with i counted within the epoch
and M = min(batches per epoch, max_num_steps), and later that step's `• Avg Reward: R` (or
`Avg Total Reward`). Its `Saving checkpoint for step N...` comes before the save starts, so it says
nothing about a checkpoint being complete: for NeMo RL that comes from the checkpoint directory.
"""

import re
from pathlib import Path

_TRL_STEP = re.compile(r"^\[rlops\] step=(\d+) reward=([-\d.eE+naif]+)", re.M)
_TRL_SAVE = re.compile(r"^\[rlops\] checkpoint step=(\d+)", re.M)
_TRL_RESUME = re.compile(r"^\[rlops\] resuming from checkpoint-(\d+)", re.M)
_NEMO_EVENTS = re.compile(r"^=+ Epoch (?P<epoch>\d+)/\d+ =+$|^=+ Step (?P<step>\d+)/(?P<of>\d+) =+$"
                          r"|Avg (?:Total )?Reward: (?P<reward>[-\d.eE+naif]+)", re.M)


def from_logs(runner: str, text: str, epoch: int = 1) -> dict:
    """{step, reward, first_step, resumed_from, reported_checkpoint}; None where the output does not say.

    For NeMo RL also `epoch`, the last epoch banner seen: a later tick that reads only the output's end,
    where there may be no banner, passes it back in.
    """
    found = {"step": None, "reward": None, "first_step": None, "resumed_from": None, "reported_checkpoint": None}
    if runner == "trl":
        steps = _TRL_STEP.findall(text)
        if steps:
            found.update(step=int(steps[-1][0]), reward=float(steps[-1][1]), first_step=int(steps[0][0]))
        saves, resumed = _TRL_SAVE.findall(text), _TRL_RESUME.search(text)
        found["reported_checkpoint"] = int(saves[-1]) if saves else None
        found["resumed_from"] = int(resumed.group(1)) if resumed else None
    else:
        found.update(_nemo_steps(text, epoch))
    return found


def _nemo_steps(text: str, epoch: int) -> dict:
    """The last step whose reward was printed, with that reward; the first step this output shows."""
    step, rewarded, found = None, None, {"epoch": epoch}
    for event in _NEMO_EVENTS.finditer(text):
        if event["epoch"]:
            epoch = found["epoch"] = int(event["epoch"])
        elif event["step"]:
            step = (epoch - 1) * int(event["of"]) + int(event["step"])
            found.setdefault("first_step", step)
        elif step is not None and step != rewarded:  # the first reward line after a step's banner is its own
            rewarded = step
            found.update(step=step, reward=float(event["reward"]))
    return found


def last_complete_checkpoint(directory: Path) -> int | None:
    """The highest step with a complete checkpoint in a run directory (either layout)."""
    from rlops.checkpoints.layout import complete

    found = complete(directory)
    return found[-1].step if found else None
