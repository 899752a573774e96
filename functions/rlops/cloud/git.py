"""git, the command (the pipelines' checkout and `plan --base`): every call rlops makes to it."""

import os
import subprocess
from pathlib import Path

from rlops.errors import Failure


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """git's output; a Failure with git's own message when it fails. `env` is added to this process's."""
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env} if env else None)
    if done.returncode:
        raise Failure(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def top(cwd: Path) -> Path:
    return Path(run("rev-parse", "--show-toplevel", cwd=cwd).strip())


def check_revision(revision: str, cwd: Path) -> None:
    try:
        run("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", cwd=cwd)
    except Failure:
        raise Failure(f"no such git revision: {revision}") from None


def file_at(path: Path, revision: str) -> str | None:
    """The file's text at a git revision, or None when it did not exist there."""
    try:
        root = top(path.resolve().parent)
    except Failure as error:
        raise Failure(f"{path} is not in a git checkout ({error})") from None
    check_revision(revision, root)
    relative = path.resolve().relative_to(root.resolve())
    shown = subprocess.run(["git", "show", f"{revision}:{relative.as_posix()}"], capture_output=True, text=True,
                           cwd=root)
    return shown.stdout if shown.returncode == 0 else None


def descends_from(later: str, earlier: str) -> bool:
    """Whether commit `later` comes after `earlier` in this checkout's history (False when either is unknown
    here: a rewritten history proves nothing)."""
    done = subprocess.run(["git", "merge-base", "--is-ancestor", earlier, later], capture_output=True)
    return done.returncode == 0 and later != earlier
