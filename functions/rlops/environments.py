"""Where environment specs live: `environments/NAME.yaml` in the working tree."""

import os
from pathlib import Path


def directory() -> Path:
    """RLOPS_ENVIRONMENTS if set, else ./environments."""
    return Path(os.environ.get("RLOPS_ENVIRONMENTS", "environments"))


def spec_files(folder: Path | None = None) -> list[Path]:
    folder = folder or directory()
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def path_for(name: str) -> Path:
    """The spec file of environment NAME (a path to a file is taken as it is)."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or os.sep in name:
        return candidate
    return directory() / f"{name}.yaml"
