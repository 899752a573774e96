"""A run's progress from what its job prints, and its last complete checkpoint on a mounted directory.

The local recipe prints `[rlops] step=N reward=R ...`, `[rlops] checkpoint step=N` and
`[rlops] resuming from checkpoint-N`; NeMo RL prints `Saving checkpoint for step N...` and
`• Avg Reward: R` (its `Step i/M` counter is per epoch, so the global step comes from the saves).
"""

import re
from pathlib import Path

_TRL_STEP = re.compile(r"^\[rlops\] step=(\d+) reward=([-\d.eE+naif]+)", re.M)
_TRL_SAVE = re.compile(r"^\[rlops\] checkpoint step=(\d+)", re.M)
_TRL_RESUME = re.compile(r"^\[rlops\] resuming from checkpoint-(\d+)", re.M)
_NEMO_SAVE = re.compile(r"Saving checkpoint for step (\d+)")
_NEMO_REWARD = re.compile(r"Avg (?:Total )?Reward: ([-\d.eE+naif]+)")


def from_logs(runner: str, text: str) -> dict:
    """{step, reward, first_step, resumed_from, reported_checkpoint}; None where the output does not say."""
    found = {"step": None, "reward": None, "first_step": None, "resumed_from": None, "reported_checkpoint": None}
    if runner == "trl":
        steps = _TRL_STEP.findall(text)
        if steps:
            found.update(step=int(steps[-1][0]), reward=float(steps[-1][1]), first_step=int(steps[0][0]))
        saves, resumed = _TRL_SAVE.findall(text), _TRL_RESUME.search(text)
        found["reported_checkpoint"] = int(saves[-1]) if saves else None
        found["resumed_from"] = int(resumed.group(1)) if resumed else None
    else:
        saves, rewards = _NEMO_SAVE.findall(text), _NEMO_REWARD.findall(text)
        if saves:
            found.update(step=int(saves[-1]), reported_checkpoint=int(saves[-1]))
        if rewards:
            found["reward"] = float(rewards[-1])
    return found


def last_complete_checkpoint(directory: Path) -> int | None:
    """The highest step with a complete checkpoint in a run directory (either layout)."""
    from rlops.checkpoints.layout import complete

    found = complete(directory)
    return found[-1].step if found else None
