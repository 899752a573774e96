"""The `rlops` command line: the infrastructure (`infra.py`), the local stack and its ticks by hand (`stack.py`),
sending a run (`train.py`), the runs once sent (`runs.py`), checkpoints (`checkpoints.py`), the pipelines' steps
(`pipelines.py`), setting a project up (`setup.py`). Exit codes: `common.Exit`.

A `Failure` (what the user can fix: a spec, a flag, a cloud error said with its hint) prints one line
and exits 1; anything else is a bug in rlops or a library and keeps its traceback.
"""

import sys

from google.auth.exceptions import GoogleAuthError

from rlops import __version__, logs
from rlops.cli import checkpoints, helptext, infra, pipelines, runs, setup, stack, train
from rlops.cli.common import Exit, Parser
from rlops.endpoints import Endpoints
from rlops.errors import Failure


def build_parser() -> Parser:
    parser = Parser(prog="rlops", description="GitOps for GRPO post-training on GKE.")
    parser.add_argument("--version", action="version", version=f"rlops {__version__}")
    parser.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                        help="log lines on stderr: text for a person, JSON (Cloud Logging's) for a program; auto: "
                             "text on a terminal, else JSON")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    infra.add_commands(commands)
    setup.add_commands(commands)
    stack.add_commands(commands)
    train.add_commands(commands)
    runs.add_commands(commands)
    checkpoints.add_commands(commands)
    pipelines.add_commands(commands)
    helptext.document(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    logs.to_stderr()  # before the arguments are read: a bad one is said on stderr, never on stdout
    args = build_parser().parse_args(argv)
    logs.to_stderr(args.log_format)
    if getattr(args, "base", None) and not args.offline:
        build_parser().error("--base goes with --offline")
    if getattr(args, "offline", False) and hasattr(args, "dry_run") and not args.dry_run:
        build_parser().error("apply --offline goes with --dry-run")
    args.endpoints = Endpoints.from_environment()  # read once; passed to every client from here
    try:
        return int(args.run(args))
    except Failure as error:
        print(f"rlops {args.command}: {error}", file=sys.stderr)
        return Exit.ERROR
    except GoogleAuthError as error:
        print(f"rlops {args.command}: no usable Google credentials ({str(error).splitlines()[0][:200]}); run `gcloud "
              "auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file",
              file=sys.stderr)
        return Exit.ERROR
