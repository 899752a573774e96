"""The CLI for training runs once sent: cost, status, logs, cancel, report."""

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rlops import environments
from rlops.cli.common import Commands, Exit, environment_command, load_spec, open_site, run_name
from rlops.errors import Failure

if TYPE_CHECKING:
    from rlops.sites import Site
    from rlops.state.run_records import Attempt, Refusal, RunRecord


def _status(args: argparse.Namespace) -> int:
    from rlops import sites
    from rlops.runs.policy import TERMINAL
    from rlops.runs.report_page import set_aside_said
    from rlops.runs.status import views
    from rlops.state.run_records import RunState

    _, env_name, env = load_spec(args.environment)
    records = sites.run_records(env_name, env, args.endpoints)
    # JSON carries no wake line: its pool state is not read
    for view in views(records, env_name, env, args.run_name, args.follow, args.interval, args.format == "text"):
        if not view.changed:
            continue
        if args.format == "json":
            print(json.dumps(_status_json(args.environment, view.rows, view.refusals, view.now)), flush=True)
            continue
        if view.rows:
            print(_table(view.rows, view.now), flush=True)
            if view.waking:
                print(view.waking, flush=True)
            for record in view.rows:
                if record.waiting and record.state not in TERMINAL:
                    print(f"{record.run}: waiting: {record.waiting}", flush=True)
                aside = set_aside_said([asdict(attempt) for attempt in record.attempts])
                if aside:
                    print(f"{record.run}: {aside}", flush=True)
        elif not view.refusals:
            print(f"waiting for run {args.run_name}" if args.run_name else f"no runs in {args.environment}",
                  flush=True)
        for refusal in view.refusals:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(refusal.at))
            print(f"{refusal.run}: train message {refusal.message} refused at {at}: {refusal.reason}", flush=True)
    if view.never_started:
        return Exit.ERROR
    if args.run_name and not view.rows:
        print(records.unknown(args.run_name), file=sys.stderr)
        return Exit.ERROR
    # Following one run to its end: the exit code says how it ended (0 succeeded, 1 not).
    return Exit.ERROR if args.follow and args.run_name and view.rows[0].state != RunState.SUCCEEDED else Exit.OK


def _report(args: argparse.Namespace) -> int:
    from rlops.runs import report_writer

    site = open_site(args.environment, args.endpoints)
    records = []
    for run in dict.fromkeys(args.run_names):  # a run named twice is compared once
        record, _ = site.records.get(run)
        if record is None:
            raise Failure(site.records.unknown(run))
        records.append(record)
    folder = records[0].run if len(records) == 1 else "compare-" + "-".join(r.run for r in records)
    out = Path(args.output or environments.root() / "reports" / args.environment / folder)
    drawn = (report_writer.write(site, records[0], out) if len(records) == 1
             else report_writer.compare(site, records, out))
    print(f"report: {drawn.markdown}")
    for plot in drawn.plots:
        print(f"plot: {plot}")
    return Exit.OK


def _cost(args: argparse.Namespace) -> int:
    from rlops.runs import environment_cost

    since = None
    if args.since:
        try:
            parsed = datetime.fromisoformat(args.since)
        except ValueError:
            raise Failure(f"--since {args.since}: expected a date or time such as 2026-12-01 or 2026-12-01T08:00") \
                from None
        since = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    site = open_site(args.environment, args.endpoints)
    report = environment_cost.gather(site, since=since, run=args.run_name)
    if args.format == "json":
        print(environment_cost.as_json(report))
        return Exit.OK
    out = Path(args.output or Path("reports") / args.environment)
    out.mkdir(parents=True, exist_ok=True)
    plot = environment_cost.timeline(report, out / "cost-timeline.png")
    print(environment_cost.text(report, markdown=args.format == "markdown"), end="")
    print(f"\ntimeline: {plot}" if args.format == "text" else f"\n![timeline]({plot})")
    return Exit.OK


def _status_json(environment: str, rows: "list[RunRecord]", refusals: "list[Refusal]",
                 now: float) -> dict[str, object]:
    """What the table says, as data: each run's state, attempt, step, checkpoint, reward, why it waits, when it
    was made, when it started, how long it ran and the time left (seconds); the refusals of a run that never
    started."""
    from rlops.runs.pace import progress
    from rlops.runs.policy import TERMINAL

    return {"environment": environment,
            "runs": [{"run": r.run, "state": r.state, "attempt": r.current.attempt, "step": r.step,
                      "checkpoint": r.last_checkpoint, "reward": r.reward, "created_at": r.created_at,
                      "waiting": r.waiting if r.state not in TERMINAL else None,
                      **asdict(progress(r, now))}
                     for r in sorted(rows, key=lambda r: r.created_at)],
            "refusals": [{"run": f.run, "message": f.message, "at": f.at, "reason": f.reason} for f in refusals]}


def _table(rows: "list[RunRecord]", now: float) -> str:
    from rlops.runs.pace import progress
    from rlops.runs.readable import duration

    header = ("RUN", "STATE", "ATTEMPT", "STEP", "CHECKPOINT", "REWARD", "STARTED", "DURATION", "ETA")
    lines: list[tuple[str, ...]] = [header]
    for r in sorted(rows, key=lambda r: r.created_at):
        said = progress(r, now)
        step = _dash(r.step) + (f"/{said.total}" if said.total else "")
        started = time.strftime("%m-%d %H:%M", time.gmtime(said.started_at)) if said.started_at else "-"
        lines.append((r.run, r.state, str(r.current.attempt), step, _dash(r.last_checkpoint), _dash(r.reward),
                       started, duration(said.seconds), duration(said.eta_seconds)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _logs(args: argparse.Namespace) -> int:
    site = open_site(args.environment, args.endpoints)
    record, _ = site.records.get(args.run_name)
    if record is None:
        raise Failure(site.records.unknown(args.run_name))
    attempts = {a.attempt: a for a in record.attempts}
    attempt = attempts.get(args.attempt or max(attempts))
    if attempt is None:
        raise Failure(f"run {args.run_name} has attempts {sorted(attempts)}, not {args.attempt}")
    if args.follow:
        return _follow(site, args.run_name, attempt)
    try:
        text = site.ray.logs(attempt.submission_id)
    except RuntimeError as error:  # the node that ran it is gone: the copy the watcher kept, if it ended
        text = site.records.log(args.run_name, attempt.attempt)
        if text is None:
            raise Failure(f"Ray no longer has the output of {attempt.submission_id} ({str(error)[-200:]}) "
                          "and no copy was kept") from None
        print(f"(Ray no longer has this output; the copy kept when attempt {attempt.attempt} ended)",
              file=sys.stderr)
    sys.stdout.write(text)
    return Exit.OK


def _follow(site: "Site", run: str, attempt: "Attempt") -> int:
    from rlops.runs.follow import follow
    from rlops.state.run_records import RunState

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    print(f"(attempt {attempt.attempt} of {run}, {attempt.submission_id}; Ctrl-C stops following, not the run)",
          file=sys.stderr, flush=True)
    try:
        ended = follow(site, run, attempt, write)
    except KeyboardInterrupt:
        return 130  # a shell's code for a command ended by SIGINT
    print(f"(attempt {attempt.attempt} of {run} ended: {ended})", file=sys.stderr)
    return Exit.OK if ended == RunState.SUCCEEDED else Exit.ERROR


def _cancel(args: argparse.Namespace) -> int:
    from rlops.cloud.ray_jobs import ACTIVE
    from rlops.runs.cancel import STOP_WAIT_SECONDS, cancel

    done = cancel(open_site(args.environment, args.endpoints), args.run_name, args.requested_by)
    if not done.cancelled:
        print(f"run {done.run} of {args.environment} had already ended ({done.before}); nothing to cancel")
        return Exit.OK
    if done.job is None:
        job = "Ray does not know it"
    elif done.job in ACTIVE:
        job = f"still {done.job} in Ray after {STOP_WAIT_SECONDS:.0f}s; each watch tick asks Ray to stop it again"
    else:
        job = done.job
    print(f"run {done.run} of {args.environment} cancelled (it was {done.before}); attempt {done.attempt}'s job "
          f"{done.submission_id}: {job}")
    return Exit.OK


def add_commands(commands: Commands) -> None:
    cost = environment_command(commands, "cost", _cost, "GPU-hours and dollars: used, waking, idle and reaped, per "
                                                        "pool and per run, with a PNG timeline")
    cost.add_argument("--since", metavar="DATE", help="from this UTC date or time (default: all the pool's history)")
    cost.add_argument("--run", dest="run_name", type=run_name, metavar="RUN",
                      help="only this run's row (the pool's rows count all)")
    cost.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    cost.add_argument("--output", metavar="DIR", help="where the timeline PNG goes (default reports/ENV)")

    status = environment_command(
        commands, "status", _status, "the runs of an environment: state, attempt, step, checkpoint")
    status.add_argument("--run", dest="run_name", type=run_name, metavar="NAME")
    status.add_argument("--follow", action="store_true",
                        help="keep showing changes; with --run, until that run ends (exit 0 only if it succeeded)")
    status.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help=argparse.SUPPRESS)
    status.add_argument("--format", choices=("text", "json"), default="text",
                        help="json: one document (with --follow, one line per change)")

    logs = environment_command(commands, "logs", _logs, "a run's output (its latest attempt's Ray job logs)")
    logs.add_argument("run_name", type=run_name, metavar="RUN")
    logs.add_argument("--attempt", type=int)
    logs.add_argument("--follow", action="store_true",
                      help="keep printing the attempt's new output until its job ends (exit 0 only if it succeeded)")

    cancel = environment_command(
        commands, "cancel", _cancel, "stop a run's Ray job and record it CANCELLED: never resumed; its name stays "
                                     "taken")
    cancel.add_argument("run_name", type=run_name, metavar="RUN")
    cancel.add_argument("--requested-by", default=os.environ.get("USER") or "rlops-cli", metavar="WHO")

    report = environment_command(
        commands, "report", _report, "a run's report: its settings, image, commit and W&B run, a plot per metric it "
                                     "logged (raw and smoothed) and a markdown page with its attempts, checkpoints "
                                     "and per-step series; with several runs, their comparison")
    report.add_argument("run_names", type=run_name, nargs="+", metavar="RUN")
    report.add_argument("--output", metavar="DIR", help="where to write it (default reports/ENV/RUN, or "
                                                         "reports/ENV/compare-RUN1-RUN2... for several)")
