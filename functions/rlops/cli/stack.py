"""The CLI for the local stack and the ticks its scheduler runs, by hand: up, down, watch, snapshot, reap."""

import argparse
from typing import TYPE_CHECKING

from rlops.cli.common import Commands, Exit, environment_command, format_option, load_spec, open_site, print_json
from rlops.errors import Failure

if TYPE_CHECKING:
    from rlops.local.stack import Stack


def local_stack(name: str, verb: str) -> "Stack":
    from rlops.local.stack import Stack
    from rlops.spec.model import LocalEnvironment

    _, env_name, env = load_spec(name)
    if not isinstance(env, LocalEnvironment):
        instead = "rlops destroy" if verb == "down" else "rlops apply"
        raise Failure(f"{env_name} is a GCP environment; `rlops {verb}` is for local ones (use `{instead} {env_name}`)")
    return Stack(env_name, env, lambda text: print(text, flush=True))


def _up(args: argparse.Namespace) -> int:
    local_stack(args.environment, "up").up()
    return Exit.OK


def _down(args: argparse.Namespace) -> int:
    local_stack(args.environment, "down").down()
    return Exit.OK


def _watch(args: argparse.Namespace) -> int:
    from rlops.runs.watch import tick

    events = tick(open_site(args.environment, args.endpoints))
    if args.format == "json":
        print_json({"environment": args.environment, "changes": events})
        return Exit.OK
    for event in events:
        print(f"{event['run']}: attempt {event['attempt']} {event['state']}"
              + (f" ({event['reason']})" if event.get("reason") else ""))
    if not events:
        print("no changes")
    return Exit.OK


def _snapshot(args: argparse.Namespace) -> int:
    from rlops.runs import snapshot

    events = snapshot.tick(open_site(args.environment, args.endpoints))
    if args.format == "json":
        print_json({"environment": args.environment, "manifests": events})
        return Exit.OK
    for event in events:
        print(f"{event['run']}: manifest of step {event['step']} written ({event['manifest']})")
    if not events:
        print("no new complete checkpoints")
    return Exit.OK


def _reap(args: argparse.Namespace) -> int:
    from rlops.reaper.reap import reap

    decision, actions = reap(open_site(args.environment, args.endpoints), dry_run=args.dry_run)
    if args.format == "json":
        print_json({"environment": args.environment, "scale_down": decision.scale_down, "dry_run": args.dry_run,
                    "reason": decision.reason, "actions": actions})
        return Exit.OK
    if decision.scale_down:
        print(f"{'would scale down' if args.dry_run else 'scaled down'}: {decision.reason}")
        for action in actions:
            print(f"  {action}")
    else:
        print(f"keeping the GPU pool: {decision.reason}")
    return Exit.OK


def add_commands(commands: Commands) -> None:
    environment_command(commands, "up", _up, "start a local environment: Ray, the state bucket, Pub/Sub, the functions")
    environment_command(commands, "down", _down, "stop exactly the processes `up` started, by their PIDs")

    watch = environment_command(commands, "watch", _watch,
                                "one watch tick now: record run states, resubmit preempted runs")

    snapshot = environment_command(commands, "snapshot", _snapshot,
                                   "one snapshot tick now: manifests of new complete checkpoints")

    reap = environment_command(commands, "reap", _reap, "one reaper tick now: scale an idle GPU pool to zero")
    reap.add_argument("--dry-run", action="store_true", help="say what it would do and why; change nothing")
    for tick in (watch, snapshot, reap):
        format_option(tick)
