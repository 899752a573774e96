"""The CLI the Cloud Build pipelines run: which environments a push changed, and the pull request's plan comment."""

import argparse
import sys
from pathlib import Path

from rlops.cli.common import Commands, Exit
from rlops.cloud import git
from rlops.errors import Failure


def _fetch(args: argparse.Namespace) -> int:
    """The history a trigger's checkout lacks: Cloud Build clones one commit (depth 1) and leaves `origin`
    without credentials, so a private repository is fetched with the build's GitHub token, sent as an HTTP
    header from git's environment (never in a URL, an argument or the output)."""
    from rlops.cloud.github import git_credentials

    root = git.top(Path.cwd())
    shallow = git.run("rev-parse", "--is-shallow-repository", cwd=root).strip() == "true"
    origin = git.run("remote", "get-url", "origin", cwd=root).strip()
    git.run("fetch", "--quiet", "--no-recurse-submodules", *(["--unshallow"] if shallow else []), "origin", *args.refs,
            cwd=root, env=git_credentials(origin))
    print(f"fetched origin {' '.join(args.refs) or '(all branches)'}" + (", whole history" if shallow else ""))
    return Exit.OK


def _changed(args: argparse.Namespace) -> int:
    from rlops.provision.pushes import changes

    found = changes(args.since, args.until, args.unapplied, args.gcp_only, args.endpoints)
    for name in found.left_alone:
        print(f"rlops changed: {name} was never applied (or was destroyed) and this push did not touch "
              f"environments/{name}.yaml; left alone", file=sys.stderr)
    for name in found.names:
        print(name)
    for name in found.deleted:
        print(f"rlops changed: environments/{name}.yaml was deleted between {args.since} and {args.until}. "
              f"rlops never destroys an environment because its file went away. To destroy it on purpose: "
              f"restore the file, run `rlops destroy {name}` (it asks, and keeps Lustre data unless "
              f"`lustre.deletion_policy: delete` and `--delete-data`), then delete the file again.",
              file=sys.stderr)
    return Exit.DELETED if found.deleted else Exit.OK


def _comment(args: argparse.Namespace) -> int:
    from rlops.cloud.github import GitHub
    from rlops.provision.output import MARKDOWN_SPLIT

    texts = [Path(name).read_text() if name != "-" else sys.stdin.read() for name in args.file]
    parts = [part.strip("\n") + "\n" for text in texts for part in text.split(MARKDOWN_SPLIT) if part.strip()]
    if not parts:
        raise Failure(f"{', '.join(args.file)}: empty; nothing to post")
    for line in GitHub(args.repo, args.endpoints.github).post_plan(args.pr, parts):
        print(line)
    return Exit.OK


def _has_label(args: argparse.Namespace) -> int:
    from rlops.cloud.github import GitHub

    present = args.label in GitHub(args.repo, args.endpoints.github).labels(args.pr)
    print(f"pull request #{args.pr} {'has' if present else 'does not have'} the label {args.label!r}")
    return Exit.OK if present else Exit.ERROR


def add_commands(commands: Commands) -> None:
    changed = commands.add_parser(
        "changed",
        help="the environments whose spec files changed between two commits (or are not applied yet), one per line",
        description=f"Exit 0; {Exit.DELETED} when a spec file was deleted (never destroyed automatically).")
    changed.add_argument("--since", required=True, metavar="GIT_REV")
    changed.add_argument("--until", default="HEAD", metavar="GIT_REV")
    changed.add_argument("--gcp-only", action="store_true", help="leave out local environments (nothing to apply)")
    changed.add_argument("--unapplied", action="store_true",
                         help="the GCP environments to apply: those changed since --since, and those applied "
                              "before whose spec differs from their last complete apply (reads the state buckets)")
    changed.set_defaults(run=_changed)

    github = commands.add_parser("github", help="the pull request's plan comment and approval label")
    verbs = github.add_subparsers(dest="verb", required=True, metavar="VERB")
    comment = verbs.add_parser("comment", help="post or update the plan comment(s) of a pull request")
    comment.add_argument("--repo", required=True, metavar="OWNER/NAME")
    comment.add_argument("--pr", required=True, type=int)
    comment.add_argument("--file", required=True, action="append",
                         help="`rlops plan --format markdown` output, or - for stdin; again for more (each file "
                              "starts a new part: parts are split to fit GitHub's comment size)")
    comment.set_defaults(run=_comment)
    fetch = verbs.add_parser("fetch", help="git fetch from origin with GITHUB_TOKEN, unshallowing a trigger's clone")
    fetch.add_argument("refs", nargs="*", metavar="REF", help="what to fetch (FETCH_HEAD names the first)")
    fetch.set_defaults(run=_fetch)
    label = verbs.add_parser("has-label", help="exit 0 if the pull request carries the label, 1 if not")
    label.add_argument("--repo", required=True, metavar="OWNER/NAME")
    label.add_argument("--pr", required=True, type=int)
    label.add_argument("--label", required=True)
    label.set_defaults(run=_has_label)
