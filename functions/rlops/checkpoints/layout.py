"""Which checkpoints of a run directory are complete, for the two layouts rlops runs.

- NeMo RL: `step_N/` with `training_info.json`, `config.yaml`, `train_dataloader.pt` and `policy/`.
  It saves into `tmp_step_N/` and renames it to `step_N/` when done (an existing `step_N/` is first
  renamed `old_step_N/`), so only `step_N` with those files counts; `tmp_step_*`/`old_step_*` never do.
- TRL / the HF Trainer: `checkpoint-N/`; complete once `trainer_state.json` is there (the Trainer
  writes it after the weights, optimizer and RNG state). The local recipe moves a torn one aside.
"""

import re
from dataclasses import dataclass
from pathlib import Path

NEMO_RL, TRL = "nemo-rl", "trl"
_NAMES = {NEMO_RL: re.compile(r"step_(\d+)"), TRL: re.compile(r"checkpoint-(\d+)")}
_REQUIRED = {NEMO_RL: ("training_info.json", "config.yaml", "train_dataloader.pt", "policy"),
             TRL: ("trainer_state.json",)}
METRICS_FILE = {NEMO_RL: "training_info.json", TRL: "trainer_state.json"}


@dataclass(frozen=True)
class Checkpoint:
    layout: str
    step: int
    path: Path


def directory(layout: str, step: int) -> str:
    """The name a checkpoint of `layout` at `step` has in its run directory."""
    return {NEMO_RL: f"step_{step}", TRL: f"checkpoint-{step}"}[layout]


def identify(path: Path) -> Checkpoint | None:
    """The checkpoint at `path` if it is a complete one of either layout; None otherwise (a symlink never is: its
    files are somewhere else, which a manifest, an export or a resume would then read or move)."""
    for layout, pattern in _NAMES.items():
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not path.is_symlink() and all((path / name).exists()
                                                                      for name in _REQUIRED[layout]):
            return Checkpoint(layout, int(match.group(1)), path)
    return None


def incomplete_reason(path: Path) -> str:
    """Why `path` is not a complete checkpoint (for error messages)."""
    if path.is_symlink():
        return f"a symlink to {path.resolve()}: rlops reads no checkpoint through a link"
    for layout, pattern in _NAMES.items():
        if pattern.fullmatch(path.name):
            missing = [name for name in _REQUIRED[layout] if not (path / name).exists()]
            return f"a {layout} checkpoint still being written or torn: no {', '.join(missing)}"
    return "not a checkpoint directory (step_N/ of NeMo RL or checkpoint-N/ of TRL)"


def complete(run_dir: Path) -> list[Checkpoint]:
    """The complete checkpoints of a run directory, oldest step first."""
    if not run_dir.is_dir():
        return []
    found = (identify(entry) for entry in run_dir.iterdir())
    return sorted((c for c in found if c is not None), key=lambda c: c.step)
