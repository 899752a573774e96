"""Where environment specs live: `environments/NAME.yaml` of the repository the command runs in.

As git finds its work tree from any subdirectory, rlops finds the repository's root: the nearest of the current
directory and its parents that holds an `environments/` directory. What rlops keeps beside the specs (the local
stack's `.rlops/`, `reports/`) is placed from the same root, so a command run from `docs/` or `functions/` acts
on the same environment as one run from the top.
"""

import difflib
import os
from pathlib import Path

SPECS = "environments"


def root() -> Path:
    """The nearest of the current directory and its parents with an `environments/` directory, else the current
    directory (as `.`: relative while it is where the command runs, so messages stay short)."""
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / SPECS).is_dir():
            return Path(".") if folder == here else folder
    return Path(".")


def directory() -> Path:
    """RLOPS_ENVIRONMENTS if set, else the repository's `environments/`."""
    return Path(os.environ["RLOPS_ENVIRONMENTS"]) if os.environ.get("RLOPS_ENVIRONMENTS") else root() / SPECS


def spec_files(folder: Path | None = None) -> list[Path]:
    folder = folder or directory()
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def path_for(name: str) -> Path:
    """The spec file of environment NAME (a path to a file is taken as it is)."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or os.sep in name:
        return candidate
    return directory() / f"{name}.yaml"


def did_you_mean(word: str, known: list[str]) -> str:
    """' (did you mean X?)' when one of `known` is close to `word` (difflib's ratio, as argparse's own
    suggestions for choices do from Python 3.14), else ''."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def known_names() -> list[str]:
    return [path.stem for path in spec_files()]
