"""Where a resubmitted attempt resumes from: the newest checkpoint that verifies against its manifest.

A resume from an unverified checkpoint is how a torn or corrupted save turns into a hang or a silent
restart from step 0 (NVIDIA-NeMo/Automodel#3254, NVIDIA-NeMo/RL#415). Before a run is resubmitted,
its checkpoints are looked at newest first: one that is torn (its save never finished), has no
manifest yet, or differs from its manifest is moved aside, never deleted, into `SET_ASIDE/` inside
the run directory, where neither NeMo RL nor the Trainer looks; the first one that verifies is where
the run resumes, and older ones are left as they are.
"""

import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rlops.checkpoints import layout, manifest

SET_ASIDE = "set-aside"
_STEP_DIR = re.compile(r"(?:step_|checkpoint-)(\d+)")


@dataclass(frozen=True)
class Candidate:
    step: int
    path: Path
    complete: bool


@dataclass(frozen=True)
class Aside:
    step: int
    reason: str
    moved_to: str = ""


@dataclass(frozen=True)
class ResumePoint:
    step: int | None                 # None: no checkpoint verifies; the run starts again from its beginning
    set_aside: tuple[Aside, ...] = ()
    pruned: tuple[str, ...] = ()     # older set-asides deleted to stay within the recipe's limit
    kept: tuple[int, int] = (0, 0)   # what set-aside/ holds now: (checkpoints, bytes)

    def to_json(self) -> dict:
        return {"step": self.step, "set_aside": [asdict(aside) for aside in self.set_aside],
                **({"pruned": list(self.pruned), "kept": list(self.kept)} if self.pruned or self.kept[0] else {})}


def choose(candidates: list[Candidate], manifests: dict[int, dict],
           differences: Callable[[Path, dict], dict[str, list[str]]] | None) -> ResumePoint:
    """Newest first: the first complete candidate whose files match its manifest, and what goes aside before it.
    `differences(path, manifest)` is `manifest.verify` (it hashes the files); None takes the first complete one
    unverified (a recipe's `resume_from: newest`)."""
    aside = []
    for candidate in sorted(candidates, key=lambda c: c.step, reverse=True):
        if not candidate.complete:
            aside.append(Aside(candidate.step, "torn: its save never finished"))
            continue
        if differences is None:
            return ResumePoint(candidate.step, tuple(aside))
        wanted = manifests.get(candidate.step)
        if wanted is None:
            aside.append(Aside(candidate.step, "no manifest yet: it cannot be verified"))
            continue
        found = differences(candidate.path, wanted)
        if any(found.values()):
            said = ", ".join(f"{len(v)} {k} ({', '.join(v[:3])})" for k, v in found.items() if v)
            aside.append(Aside(candidate.step, f"does not match its manifest: {said}"))
            continue
        return ResumePoint(candidate.step, tuple(aside))
    return ResumePoint(None, tuple(aside))


def candidates(run_dir: Path) -> list[Candidate]:
    """Every checkpoint directory of the run, complete or not (NeMo RL's tmp_/old_ directories are not)."""
    if not run_dir.is_dir():
        return []
    found = []
    for entry in run_dir.iterdir():
        match = _STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append(Candidate(int(match.group(1)), entry, layout.identify(entry) is not None))
    return found


def prune(run_dir: Path, count: int, max_bytes: int | None) -> tuple[tuple[str, ...], tuple[int, int]]:
    """Delete the oldest set-aside checkpoints beyond `count` or `max_bytes` in all (the newest always stays);
    (the names deleted, (checkpoints, bytes) kept)."""
    folder = run_dir / SET_ASIDE
    if not folder.is_dir():
        return (), (0, 0)
    entries = [entry for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink()]
    newest_first = sorted(entries, key=lambda entry: (entry.stat().st_mtime, entry.name), reverse=True)
    kept, pruned, total = [], [], 0
    for entry in newest_first:
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file() and not f.is_symlink())
        if kept and (len(kept) >= count or (max_bytes is not None and total + size > max_bytes)):
            shutil.rmtree(entry)
            pruned.append(entry.name)
            continue
        kept.append(entry.name)
        total += size
    return tuple(sorted(pruned)), (len(kept), total)


def prepare(run_dir: Path, manifests: dict[int, dict], verify: bool = True) -> ResumePoint:
    """Choose the resume point of the checkpoints on this machine and move aside what comes after it."""
    point = choose(candidates(run_dir), manifests, manifest.verify if verify else None)
    by_step = {c.step: c for c in candidates(run_dir)}
    moved = []
    for aside in point.set_aside:
        source = by_step[aside.step].path
        # The time, and a suffix: one step set aside twice within a second (a save cut twice) keeps both.
        target = run_dir / SET_ASIDE / f"{source.name}-{int(time.time())}-{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(exist_ok=True)
        source.rename(target)
        moved.append(Aside(aside.step, aside.reason, str(target.relative_to(run_dir))))
    return ResumePoint(point.step, tuple(moved))
