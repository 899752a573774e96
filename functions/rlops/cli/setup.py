"""Setting a project up for rlops: `bootstrap`, the gcloud commands from an empty project to push-to-provision, and
`iam`, the roles each rlops service account needs."""

import argparse
import subprocess
import sys

from rlops.cli.common import Commands, Exit, cloud_environment, say
from rlops.errors import Failure


def _iam(args: argparse.Namespace) -> int:
    from rlops.provision import accounts

    spec = cloud_environment(args.environment, "iam").spec if args.environment else None
    sys.stdout.write(accounts.render(args.format, spec))
    return Exit.OK


def _bootstrap(args: argparse.Namespace) -> int:
    from rlops.provision import bootstrap

    found = bootstrap.steps(args.project, args.region, args.bucket, args.repository)
    if not args.apply:
        sys.stdout.write(bootstrap.script(found))
        if not args.repository:
            say("# the triggers: connect the repository to Cloud Build (2nd gen) and run again with --repository "
                "projects/PROJECT/locations/REGION/connections/CONNECTION/repositories/NAME")
        return Exit.OK
    for number, step in enumerate(found, 1):
        say(f"[{number}/{len(found)}] {step.why}")
        ran = subprocess.run(["sh", "-c", step.said()] if step.shell else list(step.argv), capture_output=True,
                             text=True)
        if ran.returncode and "already exists" not in ran.stderr.lower():
            raise Failure(f"bootstrap stopped at step {number} ({step.why}): {step.said()}\n{ran.stderr.strip()}")
        if ran.returncode:
            say("  already there")
    return Exit.OK


def add_commands(commands: Commands) -> None:
    boot = commands.add_parser("bootstrap", help="the gcloud commands from an empty project to push-to-provision: "
                                                 "APIs, state bucket, secrets, service accounts with the roles "
                                                 "`rlops iam` derives, deploy, triggers",
                               description="Prints the commands (the default, --dry-run); --apply runs them with "
                                           "your gcloud credentials, one after another, taking 'already exists' as "
                                           "done. Example: rlops bootstrap my-project --region us-central1")
    boot.add_argument("project", metavar="PROJECT")
    boot.add_argument("--region", default="us-central1", help="where the bucket, functions and triggers go")
    boot.add_argument("--bucket", help="the state bucket's name (default PROJECT-rlops-state; the specs' "
                                       "state.bucket must say the same)")
    boot.add_argument("--repository", metavar="REPOSITORY", help="the Cloud Build 2nd-gen repository: "
                      "projects/P/locations/R/connections/C/repositories/N (then the triggers are made too)")
    mode = boot.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the commands, run none (the default)")
    mode.add_argument("--apply", action="store_true", help="run them")
    boot.set_defaults(run=_bootstrap)

    iam = commands.add_parser("iam", help="each rlops service account's roles: the smallest predefined roles "
                                          "granting what its code calls")
    iam.add_argument("environment", nargs="?", metavar="ENV",
                     help="name each place a role is granted for this environment (its secrets, its state bucket)")
    iam.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    iam.set_defaults(run=_iam)
