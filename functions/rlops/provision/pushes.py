"""What a push to the environments folder asks of the apply pipeline (`rlops changed`): which spec files changed
between two commits, which were deleted (never destroyed for it), and, with the state buckets read, which GCP
environments to apply."""

from dataclasses import dataclass, field
from pathlib import Path

from google.api_core.exceptions import GoogleAPICallError

from rlops import environments
from rlops.cloud import git
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.provision.service import CloudEnvironment
from rlops.spec.load import load
from rlops.spec.model import LocalEnvironment
from rlops.state.bucket import of_environment
from rlops.state.resources import AppliedSpec


@dataclass
class Changes:
    names: list[str]                                        # the environments to list, sorted
    deleted: list[str] = field(default_factory=list)        # spec files deleted between the two commits
    left_alone: list[str] = field(default_factory=list)     # never applied (or destroyed), and not touched


def changes(since: str, until: str, unapplied: bool, gcp_only: bool, endpoints: Endpoints) -> Changes:
    """The environments whose spec files changed between `since` and `until`; with `unapplied`, the GCP ones to
    apply (those touched, and those applied before whose spec differs from their last complete apply); with
    `gcp_only`, without the local ones."""
    folder = environments.directory().resolve()
    root = git.top(folder)
    git.check_revision(since, root)
    relative = folder.relative_to(root.resolve()).as_posix()
    listing = git.run("diff", "--name-status", "--no-renames", since, until, "--", relative, cwd=root)
    changed, deleted = [], []
    for line in listing.splitlines():
        status, path = line.split("\t", 1)
        name = Path(path)
        if name.suffix != ".yaml" or name.parent.as_posix() != relative:
            continue
        (deleted if status == "D" else changed).append(name.stem)
    left_alone: list[str] = []
    if unapplied:
        changed, left_alone = _to_apply(folder, set(changed), endpoints)
    elif gcp_only:
        changed = [name for name in changed if not isinstance(load(folder / f"{name}.yaml").environment,
                                                              LocalEnvironment)]  # an invalid spec counts
    return Changes(sorted(changed), sorted(deleted), left_alone)


def _to_apply(folder: Path, touched: set[str], endpoints: Endpoints) -> tuple[list[str], list[str]]:
    """(GCP environments to apply, those left alone): to apply, those `touched` and those applied before whose
    spec has changed since; left alone, those never applied (or destroyed) that were not touched. An invalid spec
    that was touched is listed too: `rlops validate`, which runs next, reports it."""
    names, left_alone = [], []
    for path in environments.spec_files(folder):
        loaded = load(path)
        if loaded.environment is None:  # set exactly when there is no problem
            names += [path.stem] if path.stem in touched else []
            continue
        if isinstance(loaded.environment, LocalEnvironment):
            continue
        env = CloudEnvironment(loaded.name, loaded.environment)
        record = AppliedSpec(of_environment(env.spec, endpoints), env.spec.state.prefix, env.name)
        try:
            applied = record.read()
        except GoogleAPICallError as error:
            where = f"gs://{env.spec.state.bucket}/{record.blob.name}"
            raise Failure(f"{path}: cannot read {where}: {error.message}") from error
        if applied is None and env.name not in touched:
            left_alone.append(env.name)
        elif applied is None or applied.get("spec_sha256") != env.digest:
            names.append(env.name)
    return names, left_alone
