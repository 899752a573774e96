"""The infrastructure commands: validate, schema, environments, plan, apply, destroy, render, unlock."""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rlops import environments
from rlops.cli.common import (
    Commands,
    Exit,
    bucket,
    cloud_environment,
    environment_command,
    format_option,
    load_gcp,
    print_json,
    say,
)
from rlops.errors import Failure

if TYPE_CHECKING:
    from rlops.provision.plan import Plan
    from rlops.provision.session import Pending


def _validate(args: argparse.Namespace) -> int:
    from rlops.spec import nemo_rl
    from rlops.spec.describe import describe
    from rlops.spec.load import load, preview_upgrade

    files = [Path(f) for f in args.files] or environments.spec_files()
    if not files:
        print(f"rlops validate: no *.yaml files in {environments.directory()}", file=sys.stderr)
        return Exit.ERROR
    if args.tag is not None and args.tag not in nemo_rl.tags():
        raise Failure(f"--tag {args.tag}: rlops has the configs of NeMo RL {', '.join(nemo_rl.tags())}")
    problems, changed, documents = 0, [], []
    for path in files:
        if args.tag is None:
            loaded = load(path)
        else:
            loaded, preview, changes = preview_upgrade(path, args.tag)
            if changes:
                changed.append(loaded.file)
        problems += len(loaded.problems)
        if args.format == "json":
            documents.append({"file": loaded.file, "environment": loaded.name, "ok": loaded.environment is not None,
                              "problems": [asdict(problem) for problem in loaded.problems],
                              "notices": [asdict(notice) for notice in loaded.notices],
                              **({"upgrade": preview} if args.tag is not None else {})})
            continue
        for problem in loaded.problems + loaded.notices:
            print(problem)
        if loaded.environment is not None:
            print(f"{loaded.file}: ok")
            if args.describe:
                print("\n".join(describe(loaded.name, loaded.environment)))
            if args.tag is not None:
                print("\n".join(preview))
    if args.format == "json":
        print_json({"files": documents, "problems": problems})
    if problems:
        print(f"{problems} problem(s) in {len(files)} file(s)", file=sys.stderr)
        return Exit.INVALID
    if changed:
        print(f"at NeMo RL {args.tag} the recipes of {', '.join(changed)} change meaning (above)", file=sys.stderr)
        return Exit.INVALID
    return Exit.OK


def _environments(args: argparse.Namespace) -> int:
    from rlops.spec.describe import pool_line, summary
    from rlops.spec.load import load

    files = environments.spec_files()
    if not files:
        print(f"rlops environments: no *.yaml files in {environments.directory()}", file=sys.stderr)
        return Exit.ERROR
    listed = []
    for path in files:
        loaded = load(path)
        if loaded.environment is None:  # listed all the same: a spec being written is still one of them
            listed.append({"name": loaded.name, "file": str(path), "problems": [str(p) for p in loaded.problems]})
        else:
            listed.append({**summary(loaded.name, loaded.environment), "file": str(path)})
    if args.format == "json":
        print(json.dumps(listed, indent=1))
        return Exit.OK
    rows = [("ENVIRONMENT", "WHERE", "GPU POOLS")]
    for entry in listed:
        if "problems" in entry:
            rows.append((entry["name"], "-", f"invalid ({len(entry['problems'])} problem(s)): rlops validate "
                                             f"{entry['file']}"))
        else:
            rows.append((entry["name"], entry["where"], "; ".join(map(pool_line, entry["gpu_pools"]))))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    print("\n".join(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}" for row in rows))
    return Exit.OK


def _schema(args: argparse.Namespace) -> int:
    from rlops.spec.load import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return Exit.OK


def _plan(args: argparse.Namespace) -> int:
    from rlops.cloud.base import Connection
    from rlops.provision import output, service

    plans = []
    loaded = [load_gcp(name) for name in args.environments]
    for (_, env), name in zip(loaded, args.environments, strict=True):
        if env is None:
            print(f"{name}: a local environment; it has no cloud resources to plan", file=sys.stderr)
    targets = [(path, env) for path, env in loaded if env is not None]
    if args.out:
        if args.offline or len(targets) != 1:
            raise Failure("--out saves one environment's plan against the live cloud: give one GCP environment, "
                          "without --offline")
        from rlops.provision.saved import SavedPlan

        (_, env), = targets
        plan, live = service.plan_for_review(env, Connection.to(args.endpoints), bucket(env, args.endpoints))
        plans = [plan]
        saved = SavedPlan.of(env, json.loads(output.as_json(plans))[0], live, plan.cluster_objects, output.text(plan))
        Path(args.out).write_text(saved.to_json())
        print(f"rlops plan: saved to {args.out}; `rlops apply {env.name} --plan {args.out}` applies exactly this plan, "
              "and refuses if the spec or the cloud moved meanwhile", file=sys.stderr)
    elif args.offline:
        plans = [service.plan_offline(env, service.base_environment(path, args.base) if args.base else None)
                 for path, env in targets]
    elif targets:
        plans = service.plan_live([env for _, env in targets], Connection.to(args.endpoints),
                                  lambda env: bucket(env, args.endpoints))
    if args.format == "json":
        sys.stdout.write(output.as_json(plans))
    elif args.format == "markdown":
        sys.stdout.write(f"\n{output.MARKDOWN_SPLIT}\n".join(output.markdown(plans)))
    else:
        sys.stdout.write("\n".join(output.text(plan) for plan in plans))
    if any(plan.errors for plan in plans):
        return Exit.ERROR
    destructive = [f"{plan.environment}: {change.key}" for plan in plans for change in plan.destructive]
    if args.refuse_destructive and destructive:
        print(f"rlops plan: {len(destructive)} destructive change(s): {', '.join(destructive[:20])}; "
              "refused (the pipeline's approval label lets them through)", file=sys.stderr)
        return Exit.DESTRUCTIVE
    if args.detailed_exitcode and any(plan.has_changes for plan in plans):
        return Exit.CHANGES
    return Exit.OK


def _doctor(args: argparse.Namespace) -> int:
    from rlops.cloud.base import Connection
    from rlops.provision import accounts, doctor

    env = cloud_environment(args.environment, "doctor")
    needs = () if args.as_account == "none" else accounts.account(args.as_account).needs()
    findings = doctor.examine(env, Connection.to(args.endpoints), bucket(env, args.endpoints), needs)
    sys.stdout.write(doctor.render(findings, args.format))
    return Exit.ERROR if doctor.failed(findings) else Exit.OK


def _needs_terminal(args: argparse.Namespace, verb: str) -> None:
    """`verb` asks before it changes anything; off a terminal (CI, a pipe) nobody can answer, so it is refused
    before anything is read or locked, unless --yes (what the apply pipeline passes)."""
    if not args.yes and not sys.stdin.isatty():
        reviewed = ", or apply a reviewed plan with --plan FILE (rlops plan ENV --out FILE)" if verb == "apply" else ""
        raise Failure(f"{verb} shows its plan and asks before changing anything, and this is not a terminal: pass "
                      f"--yes to {verb} without asking (the apply pipeline does){reviewed}; nothing was changed")


def _carried_out(args: argparse.Namespace, pending: "Pending", name: str) -> "Plan":
    """A plan that asks is shown first, then, unless --yes, carried out only once the environment's name is typed,
    as Terraform asks for `yes`."""
    from rlops.provision import output
    from rlops.provision.service import Refused

    if pending.asks:
        sys.stdout.write(output.text(pending.plan))
        sys.stdout.flush()
        if not args.yes and input(f"Type the environment name ({name}) to {pending.verb} it: ").strip() != name:
            raise Refused(f"{pending.verb} not confirmed; nothing was changed")
    return pending.carry_out()


def _apply(args: argparse.Namespace) -> int:
    from rlops.cloud.base import Connection
    from rlops.provision import service

    env = cloud_environment(args.environment, "apply")
    if args.plan and args.dry_run:
        raise Failure("--plan applies a saved plan; --dry-run prints what an apply would send: give one of them")
    reviewed = None
    if args.plan:
        from rlops.provision.saved import SavedPlan

        try:
            reviewed = SavedPlan.from_json(Path(args.plan).read_text(), args.plan)
        except OSError as error:
            raise Failure(f"--plan {args.plan}: {error.strerror}") from None
    elif not args.dry_run:
        _needs_terminal(args, "apply")
    if args.dry_run:
        live = None
        if not args.offline:
            live = service.read_one(env, Connection.to(args.endpoints), bucket(env, args.endpoints))
        print("\n".join(service.dry_run(env, live)))
        return Exit.OK
    from rlops.provision.session import DoctorStopped, Session, Superseded

    session = Session(env, Connection.to(args.endpoints), bucket(env, args.endpoints), say, args.lock_timeout,
                      args.ready_timeout)
    if args.skip_doctor:
        say("doctor: skipped (--skip-doctor): apply may fail part way on what it would have found")
    else:
        try:
            say(f"doctor: {session.checked()} checks, none failed")
        except DoctorStopped as stopped:
            sys.stderr.write(stopped.findings)
            raise

    def newer(other: str) -> bool:
        from rlops.cloud.git import descends_from

        return descends_from(other, args.commit)

    if reviewed is not None:
        say(f"applying the plan saved in {args.plan} ({reviewed.created_at}), if nothing moved since")
    try:
        with session.planned_apply(args.delete_data, args.commit, newer, reviewed) as pending:
            plan = _carried_out(args, pending, env.name)
    except Superseded as skipped:
        say(f"skipped: {skipped}")
        return Exit.OK
    say(f"Apply complete for {env.name}: {plan.summary()}." if plan.has_changes else f"{env.name}: no changes.")
    return Exit.OK


def _destroy(args: argparse.Namespace) -> int:
    from rlops.cloud.base import Connection
    from rlops.provision.session import Session

    env = cloud_environment(args.environment, "destroy")
    _needs_terminal(args, "destroy")
    session = Session(env, Connection.to(args.endpoints), bucket(env, args.endpoints), say, args.lock_timeout)
    with session.planned_destroy(args.delete_data) as pending:
        plan = _carried_out(args, pending, env.name)
    say(f"Destroy complete for {env.name}: {plan.summary()}." if plan.has_changes
        else f"{env.name}: nothing to destroy.")
    return Exit.OK


def _render(args: argparse.Namespace) -> int:
    from rlops.cloud.base import Connection
    from rlops.kube import render
    from rlops.provision import service

    env = cloud_environment(args.environment, "render")
    if args.offline:
        rendered = render.objects(env.name, env.spec, render.LiveFacts(render.UNKNOWN_LUSTRE_IP))
    else:
        connection = Connection.to(args.endpoints)
        live = service.read_one(env, connection, bucket(env, args.endpoints))
        if f"lustre_instance/{env.spec.lustre.name}" not in live:
            raise Failure(f"the Lustre instance {env.spec.lustre.name} does not exist (yet): rlops apply "
                         f"{env.name} first, or render --offline")
        rendered = service.rendered_objects(env, live, connection, with_secrets=False)
    sys.stdout.write(render.as_yaml(rendered))
    return Exit.OK


def _unlock(args: argparse.Namespace) -> int:
    from rlops.state.lock import force_unlock

    env = cloud_environment(args.environment, "lock")
    if not args.force:
        raise Failure("unlock removes another process's lock; make sure it is dead, then pass --force")
    held = force_unlock(bucket(env, args.endpoints), env.spec.state.prefix, env.name)
    say(f"removed the lock of {held['holder']} ({held['operation']} since {held['since']})" if held
         else f"{env.name} was not locked")
    return Exit.OK


def _lock_timeout_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--lock-timeout", type=float, default=600.0, metavar="SECONDS",
                         help="how long to wait for another apply of this environment (default 600)")


def add_commands(commands: Commands) -> None:
    validate = commands.add_parser("validate", help="check environment specs; exit 2 when any has a problem")
    validate.add_argument("files", nargs="*", help="spec files (default: every environments/*.yaml)")
    validate.add_argument("--describe", action="store_true", help="also say what each valid spec describes")
    format_option(validate)
    validate.add_argument("--tag", metavar="TAG", help="preview moving each nemo-rl recipe to NeMo RL TAG "
                          "(e.g. v0.6.0): what it refuses or no longer reads, the rewrite where one is known, "
                          "the final config's diff; exit 2 when anything changes meaning")
    validate.set_defaults(run=_validate)

    schema = commands.add_parser("schema", help="print the JSON Schema of an environment spec")
    schema.set_defaults(run=_schema)

    listing = commands.add_parser("environments", help="the environment specs found: where each runs, its GPU pools")
    listing.add_argument("--format", choices=("text", "json"), default="text")
    listing.set_defaults(run=_environments)

    plan = commands.add_parser("plan", help="what apply would change, resource by resource")
    plan.add_argument("environments", nargs="+", metavar="ENV", help="environment names (or spec paths)")
    plan.add_argument("--offline", action="store_true", help="plan from the spec alone, without reading the cloud")
    plan.add_argument("--base", metavar="GIT_REV", help="with --offline: plan against the spec at this git revision")
    plan.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    plan.add_argument("--detailed-exitcode", action="store_true", help="exit 0 no changes, 2 changes, 1 error")
    plan.add_argument("--refuse-destructive", action="store_true",
                      help=f"exit {Exit.DESTRUCTIVE} when a change replaces or deletes something "
                      "(after printing the plan)")
    plan.add_argument("--out", metavar="FILE", help="also save the plan, with fingerprints of the spec and of the "
                      "live state it read, for `rlops apply ENV --plan FILE` (one environment, not --offline)")
    plan.set_defaults(run=_plan)

    apply = environment_command(commands, "apply", _apply, "make the cloud match the spec")
    apply.add_argument("--dry-run", action="store_true", help="print every request apply would send, send none")
    apply.add_argument("--offline", action="store_true", help="with --dry-run: as if nothing existed yet")
    _lock_timeout_option(apply)
    apply.add_argument("--ready-timeout", type=float, default=1800.0, metavar="SECONDS",
                       help="how long to wait for the NCCL installer and the RayCluster to be ready (default 1800)")
    apply.add_argument("--delete-data", action="store_true",
                       help="allow replacing the Lustre instance (also needs lustre.deletion_policy: delete)")
    apply.add_argument("--skip-doctor", action="store_true",
                       help="apply without the doctor's checks first (said in the output)")
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation (required off a terminal)")
    apply.add_argument("--plan", metavar="FILE", help="apply exactly the plan `rlops plan ENV --out FILE` saved, "
                       "without asking; refused, changing nothing, if the spec or the live state moved since")
    apply.add_argument("--commit", metavar="GIT_SHA",
                       help="the commit whose spec this is (the apply pipeline's): recorded, and an apply of an "
                            "older commit than the one recorded is skipped (exit 0)")

    doctor = environment_command(commands, "doctor", _doctor, "check, before apply, what would make it fail part way: "
                                 "APIs, reservations, network profile, bucket, secrets")
    doctor.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    doctor.add_argument("--as", dest="as_account", default="apply", metavar="ACCOUNT",
                        choices=("apply", "plan", "plan-live", "train", "watch", "snapshot", "reap", "none"),
                        help="test the caller for this rlops account's permissions (`rlops iam`; default apply; "
                             "none: test no permissions, as the plan pipeline's table does)")

    destroy = environment_command(
        commands, "destroy", _destroy, "delete what rlops created, in reverse order (Lustre is kept)")
    destroy.add_argument("--delete-data", action="store_true",
                         help="also delete the Lustre instance (also needs lustre.deletion_policy: delete)")
    destroy.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _lock_timeout_option(destroy)

    render = environment_command(
        commands, "render", _render, "print the in-cluster objects as one YAML stream (Secret values redacted)")
    render.add_argument("--offline", action="store_true", help="without reading the cloud (the Lustre IP is left out)")

    unlock = environment_command(commands, "unlock", _unlock, "remove an environment's lock left by a dead apply")
    unlock.add_argument("--force", action="store_true", help="required: the holder must be dead")
