"""What every command shares: the exit codes, the one way to load an environment's spec, printing."""

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from rlops import environments
from rlops.endpoints import Endpoints
from rlops.errors import Failure

if TYPE_CHECKING:  # each command imports these when it runs: `rlops validate` and `--help` go without them
    from google.cloud import storage

    from rlops.provision.service import CloudEnvironment
    from rlops.sites import Site
    from rlops.spec.model import GcpEnvironment, LocalEnvironment


class Exit(IntEnum):
    """The exit codes of every command (Terraform's for `plan --detailed-exitcode`)."""

    OK = 0
    ERROR = 1          # a failure, a bad flag, a spec that does not load
    INVALID = 2        # `validate` found problems
    CHANGES = 2        # `plan --detailed-exitcode` found changes
    UNEARNED = 2       # `train --check-data`: the recipe's gold answers do not earn its reward
    DESTRUCTIVE = 3    # `plan --refuse-destructive`: a change replaces or deletes something
    DELETED = 3        # `changed`: a spec file was deleted (never destroyed automatically)


class Parser(argparse.ArgumentParser):
    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace if namespace is not None else argparse.Namespace())
        if extras and " " in self.prog:  # a subcommand's unknown flag: its own usage, not the top level's
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:  # argparse exits 2, which `validate` and `plan` mean otherwise
        self.print_usage(sys.stderr)
        self.exit(Exit.ERROR, f"{self.prog}: error: {message}\n")


# What `add_subparsers` returns, which each module's `add_commands` adds its commands to (argparse names no public
# type for it).
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


def run_name(text: str) -> str:
    """A RUN argument: a name a train message may carry (a DNS label of at most 40 characters); any other text
    could name a path (`../x`) where rlops keeps a run's checkpoints, reports and records."""
    from rlops.spec.field_types import DNS_LABEL

    if len(text) > 40 or not re.fullmatch(DNS_LABEL, text):
        raise argparse.ArgumentTypeError(f"{text!r}: a run name is 1-40 lowercase letters, digits or hyphens, "
                                         "starting and ending with a letter or digit")
    return text


def environment_command(commands: Commands, name: str, run: Callable[[argparse.Namespace], int], help: str,
                        **options: Any) -> argparse.ArgumentParser:
    """A command whose first argument is the environment (ENV), carried out by `run(args)`."""
    command = commands.add_parser(name, help=help, **options)
    command.add_argument("environment", metavar="ENV")
    command.set_defaults(run=run)
    return command


def load_spec(name: str) -> "tuple[Path, str, GcpEnvironment | LocalEnvironment]":
    """The spec of environment NAME (or at a path): (path, name, environment); a Failure when it does not load."""
    from rlops.spec.load import load

    path = environments.path_for(name)
    if not path.is_file():
        raise Failure(f"no spec for environment {name!r}: {path} does not exist"
                      + environments.did_you_mean(name, environments.known_names()))
    loaded = load(path)
    if loaded.environment is None:  # set exactly when there is no problem
        raise Failure("\n".join(map(str, loaded.problems)) + f"\n{path}: fix the spec first (rlops validate)")
    return path, loaded.name, loaded.environment


def open_site(name: str, endpoints: Endpoints) -> "Site":
    """The environment's runs (a local one's with its stack's emulators)."""
    from rlops import sites

    _, env_name, env = load_spec(name)
    return sites.open_site(env_name, env, endpoints)


def load_gcp(name: str) -> "tuple[Path, CloudEnvironment | None]":
    """(path, provision.service.CloudEnvironment), or (path, None) for a local environment."""
    from rlops.provision.service import CloudEnvironment
    from rlops.spec.model import GcpEnvironment

    path, env_name, env = load_spec(name)
    return path, CloudEnvironment(env_name, env) if isinstance(env, GcpEnvironment) else None


def cloud_environment(name: str, verb: str) -> "CloudEnvironment":
    """The GCP environment NAME; a local one is a usage error: it has no cloud resources to `verb`."""
    _, env = load_gcp(name)
    if env is None:
        raise Failure(f"{name} is a local environment; it has no cloud resources to {verb}")
    return env


def bucket(env: "CloudEnvironment", endpoints: Endpoints) -> "storage.Bucket":
    from rlops.state.bucket import of_environment

    return of_environment(env.spec, endpoints)


def format_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--format", choices=("text", "json"), default="text",
                         help="text for a person; json: one document for a program")


def print_json(document: object) -> None:
    print(json.dumps(document, default=str), flush=True)


def say(text: str) -> None:
    print(text, flush=True)
