"""Names that come from data (a manifest's file paths, a bucket's object names, a run or an environment name) are
joined onto a directory only when the result stays inside it.

Cloud Storage keeps an object name such as `step-5/../../x` or `step-5//tmp/x` literally, and an export's manifest
is only as trustworthy as whoever wrote the bucket: a name is refused when it is empty, absolute, holds a NUL, or has
an empty, `.` or `..` part, and the joined path is refused when, symlinks resolved, it leaves the directory.
"""

from pathlib import Path, PurePosixPath

from rlops.errors import Failure


class OutsideDirectory(Failure, ValueError):
    """A name from data that would reach outside the directory it is meant for."""


def refusal(name: object) -> str | None:
    """Why `name` cannot be a relative path inside a directory; None when it can."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if "\0" in name:
        return "holds a NUL byte"
    if PurePosixPath(name).is_absolute():
        return "is absolute"
    bad = [part for part in name.split("/") if part in ("", ".", "..")]
    if bad:
        return f"has a {bad[0]!r} part" if bad[0] else "has an empty part (//, or a leading or trailing /)"
    return None


def within(root: Path, name: object, what: str) -> Path:
    """`root / name`, refused (OutsideDirectory, naming `what` and the name) unless it stays inside `root`."""
    why = refusal(name)
    if why is None:
        joined = root / str(name)
        if not joined.resolve().is_relative_to(root.resolve()):
            why = f"leads to {joined.resolve()} through a symlink"
        else:
            return joined
    raise OutsideDirectory(f"{what} {name!r} {why}: refused, it would leave {root}")
