"""The CLI for the local stack and training runs: up, down, train, watch, status, logs, cancel."""

import argparse
import json
import os
import sys
import time

from rlops import environments
from rlops.cli.common import Exit, environment_command, format_option, load_spec, print_json, run_name
from rlops.endpoints import Endpoints
from rlops.errors import Failure


def _local_stack(name: str, verb: str):
    from rlops.local.stack import Stack
    from rlops.spec.model import LocalEnvironment

    _, env_name, env = load_spec(name)
    if not isinstance(env, LocalEnvironment):
        instead = "rlops destroy" if verb == "down" else "rlops apply"
        raise Failure(f"{env_name} is a GCP environment; `rlops {verb}` is for local ones (use `{instead} {env_name}`)")
    return Stack(env_name, env, lambda text: print(text, flush=True))


def _site(name: str, endpoints: Endpoints):
    """The environment's runs (a local one's with its stack's emulators)."""
    from rlops import sites

    _, env_name, env = load_spec(name)
    return sites.open_site(env_name, env, endpoints)


def _up(args) -> int:
    _local_stack(args.environment, "up").up()
    return Exit.OK


def _down(args) -> int:
    _local_stack(args.environment, "down").down()
    return Exit.OK


def _typed(text: str):
    """`--set` values: JSON scalars (4, 0.001, true, "x") as such, anything else as a string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (bool, int, float, str)) else text


def _train(args) -> int:
    from rlops import sites
    from rlops.runs import message, train
    from rlops.spec.model import LocalEnvironment

    _, env_name, env = load_spec(args.environment)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise Failure(f"--set {item}: expected key=value")
        overrides[key] = _typed(value)
    payload = {"environment": env_name, "recipe": args.recipe, "run": args.run_name, "overrides": overrides,
               "requested_by": args.requested_by}
    data = json.dumps(payload).encode()
    try:  # the function checks again; this saves a round trip for a typo
        parsed = message.parse(data)
        settings = message.settings(parsed, message.recipe_of(parsed, env))
    except message.Poison as poison:
        raise Failure(f"not sent: {poison}") from None
    if args.samples is not None and (not args.check_data or args.samples < 1):
        raise Failure(f"--samples {args.samples}: a count of at least 1, with --check-data FILE")
    if args.check_data:  # before anything is sent, so a recipe whose reward cannot be earned never starts
        refused = _check_data(env, parsed, settings, args.check_data, args.samples)
        if refused:
            return refused
    if args.dry_run:
        print(_would_submit(env_name, env, parsed, settings))
        return Exit.OK
    hint = f"follow it with: rlops status {args.environment} --run {args.run_name} --follow"
    try:
        earlier = train.submitted_before(sites.run_records(env_name, env, args.endpoints), parsed, settings)
    except train.RunNameTaken as taken:
        raise Failure(f"not sent: {taken}") from None
    if earlier is not None:
        print(f"run {args.run_name} of {env_name}: already submitted with these settings ({earlier.state}, attempt "
              f"{earlier.current.attempt}); nothing sent")
        print(hint)
        return Exit.OK
    if isinstance(env, LocalEnvironment):
        how = _send_local(_local_stack(args.environment, "train"), data, args.endpoints)
    else:
        from rlops.cloud import pubsub

        sent = pubsub.publish(args.endpoints, env.project.id, pubsub.TRAIN_TOPIC, payload)
        how = f"published to {pubsub.TRAIN_TOPIC} (message {sent})"
    print(f"train message for run {args.run_name} of {env_name}: {how}")
    print(hint)
    return Exit.OK


def _would_submit(env_name: str, env, parsed, settings: dict) -> str:
    """What the train function would submit for this message, like `helm template`: nothing is sent."""
    import yaml

    from rlops.cloud.ray_jobs import META_PREFIX
    from rlops.runs import jobs
    from rlops.sites import placement
    from rlops.spec import nemo_rl

    recipe = env.recipes[parsed.recipe]
    lustre, resources = placement(env)
    job = jobs.request(env_name, parsed.recipe, recipe, parsed.run, settings, parsed.requested_by, 1, lustre,
                       resources, jobs.actor_env(env, recipe), jobs.data_tag(env), jobs.pool_gpus(env, recipe))
    lines = [f"# rlops train {env_name} --dry-run: nothing was sent",
             yaml.safe_dump({"submission_id": job.submission_id,
                             "working_directory": nemo_rl.WORKDIR if recipe.runner == "nemo-rl" else "(Ray's)",
                             "entrypoint": job.entrypoint, "entrypoint_resources": job.entrypoint_resources,
                             "runtime_env": job.runtime_env, "metadata": job.metadata,
                             "secrets_by_name_only": sorted(env.secrets)},
                            sort_keys=False, width=10**6).rstrip(),
             "# secrets reach the Ray nodes as files (HF_TOKEN_PATH, NETRC), never an environment variable or the job"]
    if recipe.driver_on_head:
        lines.append("# runtime_env.env_vars reach every actor, whichever node the driver runs on: NeMo RL's init_ray "
                     "copies the driver's environment into them")
    if recipe.runner == "nemo-rl":
        tag = nemo_rl.tag_for(env.ray.image)
        if tag is None:
            lines.append(f"# {nemo_rl.unsupported(env.ray.image)}")
        else:
            composed = nemo_rl.compose(tag, recipe.config, nemo_rl.assignments(
                recipe, settings, job.metadata[META_PREFIX + "checkpoint-dir"]))
            if composed.problems:
                raise Failure("\n".join(f"{key or recipe.config}: {problem}" for key, problem in composed.problems))
            lines += [f"# the final config NeMo RL {tag.name} (commit {tag.commit[:12]}) runs with: {recipe.config}",
                      f"# composed as {recipe.entrypoint} composes it, before logger.log_dir gets its exp_N",
                      "---", yaml.safe_dump(composed.config, sort_keys=False, width=10**6).rstrip()]
    return "\n".join(lines)


def _check_data(env, parsed, settings: dict, path: str, samples: int | None) -> int:
    """`--check-data FILE`: FILE's first rows, as the recipe's data source publishes them, through its data steps,
    read and rewarded as its NeMo RL tag reads and rewards a model's answer (`spec.nemo_rl_reward`)."""
    from rlops.spec import nemo_rl, nemo_rl_reward as reward

    recipe = env.recipes[parsed.recipe]
    if recipe.runner != "nemo-rl":
        raise Failure(f"--check-data: {parsed.recipe} runs {recipe.runner}; the check follows NeMo RL's data loading "
                      "and math reward")
    tag = nemo_rl.tag_for(env.ray.image)
    if tag is None:
        raise Failure(f"--check-data: {nemo_rl.unsupported(env.ray.image)}")
    try:
        check = reward.check_for(tag, recipe, settings)
    except reward.Unchecked as why:
        raise Failure(f"--check-data: not checked: {why}") from None
    if not check.sources:
        raise Failure("--check-data: the config names no data file (data.train_data_path)")
    installed = reward.math_verify_here()
    if installed is None:
        raise Failure("--check-data scores with math-verify, which is not installed here (pip install -r "
                      "requirements.txt)")
    try:
        with open(path, encoding="utf-8") as lines:
            rows = reward.rows_of(lines, samples or reward.SAMPLES)
    except OSError as error:
        raise Failure(f"--check-data {path}: {error.strerror}") from None
    except ValueError as error:
        raise Failure(f"--check-data {path}: {error}") from None
    source = check.sources[0]  # the training data; FILE is in the shape its source publishes
    verdict = reward.score(check, source, rows)
    print(f"check-data {parsed.recipe}: {len(rows)} rows of {path} as {source.published} publishes them"
          + (f", through the data step {source.transform} (to {source.path})" if source.transform else ""))
    print(f"  {check.describe()}")
    if installed != reward.MATH_VERIFY[tag.name]:
        print(f"  scored with math-verify {installed} (installed here), not the {reward.MATH_VERIFY[tag.name]} "
              f"{tag.name} pins")
    earned = sum(scored.reward == 1.0 for scored in verdict.scored)
    print(f"mean reward {verdict.mean:.3f} over {verdict.count} rows ({earned} of {verdict.count} earn 1.0)")
    if verdict.earnable():
        return Exit.OK
    print(f"refused: a mean below {reward.MINIMUM}: {verdict.reason()}", file=sys.stderr)
    if verdict.scored:
        miss = verdict.example()
        problem = str(miss.problem)
        shown = problem[:120] + ("…" if len(problem) > 120 else "")
        print(f"example, row {miss.row}: problem {json.dumps(shown, ensure_ascii=False)}\n  ground truth "
              f"{json.dumps(miss.ground_truth, ensure_ascii=False)}\n  answered {json.dumps(miss.response)}: reward "
              f"{miss.reward}", file=sys.stderr)
    return Exit.UNEARNED


def _send_local(stack, data: bytes, endpoints: Endpoints) -> str:
    """Through the emulator's train topic when it runs; else the CloudEvent its push subscription would POST."""
    from rlops.cloud import pubsub
    from rlops.local.stack import LOCAL_PROJECT, post_cloud_event

    running = stack.processes()
    if "pubsub" in running:
        message_id = pubsub.publish(stack.endpoints(endpoints), LOCAL_PROJECT, pubsub.TRAIN_TOPIC, json.loads(data))
        return f"published to the emulator's {pubsub.TRAIN_TOPIC} topic (message {message_id})"
    if "functions-train" not in running:
        raise Failure(f"{stack.name} is not up; run `rlops up {stack.name}`")
    post_cloud_event(running["functions-train"].ports["http"], pubsub.TRAIN_TOPIC, data)
    return "posted to the train function (no Pub/Sub emulator)"


def _watch(args) -> int:
    from rlops.runs.watch import tick

    events = tick(_site(args.environment, args.endpoints))
    if args.format == "json":
        print_json({"environment": args.environment, "changes": events})
        return Exit.OK
    for event in events:
        print(f"{event['run']}: attempt {event['attempt']} {event['state']}"
              + (f" ({event['reason']})" if event.get("reason") else ""))
    if not events:
        print("no changes")
    return Exit.OK


def _snapshot(args) -> int:
    from rlops.runs import snapshot

    events = snapshot.tick(_site(args.environment, args.endpoints))
    if args.format == "json":
        print_json({"environment": args.environment, "manifests": events})
        return Exit.OK
    for event in events:
        print(f"{event['run']}: manifest of step {event['step']} written ({event['manifest']})")
    if not events:
        print("no new complete checkpoints")
    return Exit.OK


def _reap(args) -> int:
    from rlops.reaper.reap import reap

    decision, actions = reap(_site(args.environment, args.endpoints), dry_run=args.dry_run)
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


def _status(args) -> int:
    from dataclasses import asdict

    from rlops import sites
    from rlops.runs.policy import TERMINAL
    from rlops.runs.report import set_aside_said
    from rlops.runs.train import refusals_shown

    _, env_name, env = load_spec(args.environment)
    records = sites.run_records(env_name, env, args.endpoints)
    shown = None
    while True:
        rows = [record for record, _ in records.all().values() if args.run_name in (None, record.run)]
        refusals = refusals_shown(records, args.run_name, rows[0] if rows else None) if args.run_name else []
        states = [(r.run, r.state, len(r.attempts), r.step, r.last_checkpoint, r.waiting) for r in rows]
        if (states, refusals) != shown and args.format == "json":
            print(json.dumps(_status_json(args.environment, rows, refusals)), flush=True)
            shown = states, refusals
        elif (states, refusals) != shown:
            if rows:
                print(_table(rows), flush=True)
                waking = _waking(records, env_name, env)
                if waking:
                    print(waking, flush=True)
                for record in rows:
                    if record.waiting and record.state not in TERMINAL:
                        print(f"{record.run}: waiting: {record.waiting}", flush=True)
                    aside = set_aside_said([asdict(attempt) for attempt in record.attempts])
                    if aside:
                        print(f"{record.run}: {aside}", flush=True)
            elif not refusals:
                print(f"waiting for run {args.run_name}" if args.run_name else f"no runs in {args.environment}",
                      flush=True)
            for refusal in refusals:
                at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(refusal.at))
                print(f"{refusal.run}: train message {refusal.message} refused at {at}: {refusal.reason}", flush=True)
            shown = states, refusals
        done = rows and all(r.state in TERMINAL for r in rows)
        never_started = not rows and refusals  # the function refused its message: nothing will come
        if not args.follow or (args.run_name and done) or never_started:
            break
        time.sleep(args.interval)
    if never_started:
        return Exit.ERROR
    if args.run_name and not rows:
        print(records.unknown(args.run_name), file=sys.stderr)
        return Exit.ERROR
    # Following one run to its end: the exit code says how it ended (0 succeeded, 1 not).
    return Exit.ERROR if args.follow and args.run_name and rows[0].state != "SUCCEEDED" else Exit.OK


def _report(args) -> int:
    from pathlib import Path

    from rlops.runs import reporting

    site = _site(args.environment, args.endpoints)
    records = []
    for run in dict.fromkeys(args.run_names):  # a run named twice is compared once
        record, _ = site.records.get(run)
        if record is None:
            raise Failure(site.records.unknown(run))
        records.append(record)
    folder = records[0].run if len(records) == 1 else "compare-" + "-".join(r.run for r in records)
    out = Path(args.output or environments.root() / "reports" / args.environment / folder)
    drawn = reporting.write(site, records[0], out) if len(records) == 1 else reporting.compare(site, records, out)
    print(f"report: {drawn.markdown}")
    for plot in drawn.plots:
        print(f"plot: {plot}")
    return Exit.OK


def _cost(args) -> int:
    from datetime import datetime, timezone
    from pathlib import Path

    from rlops.runs import costing

    since = None
    if args.since:
        try:
            parsed = datetime.fromisoformat(args.since)
        except ValueError:
            raise Failure(f"--since {args.since}: expected a date or time such as 2026-12-01 or 2026-12-01T08:00") \
                from None
        since = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()
    site = _site(args.environment, args.endpoints)
    report = costing.gather(site, since=since, run=args.run_name)
    if args.format == "json":
        print(costing.as_json(report))
        return Exit.OK
    out = Path(args.output or Path("reports") / args.environment)
    out.mkdir(parents=True, exist_ok=True)
    plot = costing.timeline(report, out / "cost-timeline.png")
    print(costing.text(report, markdown=args.format == "markdown"), end="")
    print(f"\ntimeline: {plot}" if args.format == "text" else f"\n![timeline]({plot})")
    return Exit.OK


def _waking(records, env_name: str, env) -> str | None:
    """Which phase the GPU pool's latest wake is in and for how long, as the reaper's last tick measured it (None
    when no wake is under way)."""
    from rlops import waiting
    from rlops.spec.model import LocalEnvironment
    from rlops.state.pool import PoolState

    state, _ = PoolState(records.bucket, env.state.prefix, env_name).read()
    wake = state.wakes[-1] if state.wakes else None
    if state.scaled_down or wake is None or wake.done:
        return None
    first = waiting.LOCAL_PHASES if isinstance(env, LocalEnvironment) else waiting.GKE_PHASES
    return "GPU pool " + waiting.wake_line(wake.at, list(wake.phases), time.time(), first + waiting.LATER_PHASES)


def _status_json(environment: str, rows: list, refusals: list) -> dict:
    """What the table says, as data: each run's state, attempt, step, checkpoint, reward, why it waits, when it
    was made, when it started, how long it ran and the time left (seconds); the refusals of a run that never
    started."""
    from dataclasses import asdict

    from rlops.runs.policy import TERMINAL
    from rlops.runs.report import progress

    now = time.time()

    return {"environment": environment,
            "runs": [{"run": r.run, "state": r.state, "attempt": r.current.attempt, "step": r.step,
                      "checkpoint": r.last_checkpoint, "reward": r.reward, "created_at": r.created_at,
                      "waiting": r.waiting if r.state not in TERMINAL else None,
                      **asdict(progress(r, now))}
                     for r in sorted(rows, key=lambda r: r.created_at)],
            "refusals": [{"run": f.run, "message": f.message, "at": f.at, "reason": f.reason} for f in refusals]}


def _table(rows: list) -> str:
    from rlops.runs.report import duration, progress

    header = ("RUN", "STATE", "ATTEMPT", "STEP", "CHECKPOINT", "REWARD", "STARTED", "DURATION", "ETA")
    lines = [header]
    now = time.time()
    for r in sorted(rows, key=lambda r: r.created_at):
        said = progress(r, now)
        step = _dash(r.step) + (f"/{said.total}" if said.total else "")
        started = time.strftime("%m-%d %H:%M", time.gmtime(said.started_at)) if said.started_at else "-"
        lines.append((r.run, r.state, str(r.current.attempt), step, _dash(r.last_checkpoint), _dash(r.reward),
                       started, duration(said.seconds), duration(said.eta_seconds)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _logs(args) -> int:
    site = _site(args.environment, args.endpoints)
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


def _follow(site, run: str, attempt) -> int:
    from rlops.runs.follow import follow

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
    return Exit.OK if ended == "SUCCEEDED" else Exit.ERROR


def _cancel(args) -> int:
    from rlops.cloud.ray_jobs import ACTIVE
    from rlops.runs.cancel import STOP_WAIT_SECONDS, cancel

    done = cancel(_site(args.environment, args.endpoints), args.run_name, args.requested_by)
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


def add_commands(commands) -> None:
    environment_command(commands, "up", _up, "start a local environment: Ray, the state bucket, Pub/Sub, the functions")
    environment_command(commands, "down", _down, "stop exactly the processes `up` started, by their PIDs")

    train = environment_command(
        commands, "train", _train, "send a train message: start run NAME of a recipe, exactly once")
    train.add_argument("--recipe", required=True)
    train.add_argument("--run", dest="run_name", required=True, metavar="NAME", help="a DNS label; one name, one run")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="an override the recipe allows (repeatable)")
    train.add_argument("--requested-by", default=os.environ.get("USER") or "rlops-cli", metavar="WHO")
    train.add_argument("--dry-run", action="store_true",
                       help="print the job it would submit (and, for nemo-rl, the composed config); send nothing")
    train.add_argument("--check-data", metavar="FILE",
                       help="first score FILE's gold answers (JSON Lines as the recipe's data source publishes them) "
                            "as the recipe's NeMo RL tag rewards a model's; below 0.9 on average, exit 2 and send "
                            "nothing")
    train.add_argument("--samples", type=int, metavar="K", help="rows of FILE to score (default 64)")

    watch = environment_command(commands, "watch", _watch, "one watch tick now: record run states, resubmit preempted runs")

    snapshot = environment_command(commands, "snapshot", _snapshot, "one snapshot tick now: manifests of new complete checkpoints")

    reap = environment_command(commands, "reap", _reap, "one reaper tick now: scale an idle GPU pool to zero")
    reap.add_argument("--dry-run", action="store_true", help="say what it would do and why; change nothing")
    for tick in (watch, snapshot, reap):
        format_option(tick)

    cost = environment_command(commands, "cost", _cost, "GPU-hours and dollars: used, waking, idle and reaped, per "
                                                        "pool and per run, with a PNG timeline")
    cost.add_argument("--since", metavar="DATE", help="from this UTC date or time (default: all the pool's history)")
    cost.add_argument("--run", dest="run_name", type=run_name, metavar="RUN", help="only this run's row (the pool's rows count all)")
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
    add_checkpoint_commands(commands)


def _checkpoint_manifest(args) -> int:
    from pathlib import Path

    from rlops.checkpoints import manifest

    try:
        print(json.dumps(manifest.build(Path(args.path)), indent=1, sort_keys=True))
    except manifest.ManifestError as error:
        raise Failure(str(error)) from None
    return Exit.OK


def _checkpoint_verify(args) -> int:
    from pathlib import Path

    from rlops.checkpoints import manifest

    try:
        differences = manifest.verify(Path(args.path), manifest.load(Path(args.manifest)))
    except manifest.ManifestError as error:
        raise Failure(str(error)) from None
    for kind in ("missing", "extra", "changed"):
        for item in differences[kind]:
            print(f"{kind}: {item}")
    same = not any(differences.values())
    print(f"{args.path}: {'identical to' if same else 'differs from'} {args.manifest}")
    return Exit.OK if same else Exit.ERROR


def _gs(site, url: str, flag: str) -> tuple[object, str]:
    """(bucket, prefix) of a gs:// URL, reached as the environment reaches Cloud Storage (for a local one: the
    emulator of the local environment whose state bucket it is, else its own)."""
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    if not url.startswith("gs://") or not bucket or not prefix.strip("/"):
        raise Failure(f"{flag} {url}: expected gs://BUCKET/PREFIX")
    endpoints = site.endpoints
    if site.checkpoints_here:
        from rlops.local.stack import hosting

        endpoints = hosting(bucket) or endpoints
    from rlops.state.bucket import client

    return client(None, endpoints).bucket(bucket), prefix.strip("/")


def _export_checkpoint(args) -> int:
    from rlops.checkpoints.manifest import ManifestError
    from rlops.runs.exports import export_checkpoint
    from rlops.runs.report import size

    site = _site(args.environment, args.endpoints)
    destination = _gs(site, args.to, "--to") if args.to else None
    try:
        done = export_checkpoint(site, args.run_name, args.step, destination, _progress)
    except ManifestError as error:
        raise Failure(str(error)) from None
    print(f"exported step {done['step']} of {args.run_name}: {done['objects']} objects, {size(done['bytes'])}, to "
          f"{done['destination']}")
    print("verified: every object's size and crc32c match the manifest, none missing, none extra")
    return Exit.OK


def _import_checkpoint(args) -> int:
    from rlops.checkpoints.manifest import ManifestError
    from rlops.runs.exports import import_checkpoint
    from rlops.runs.report import size

    site = _site(args.environment, args.endpoints)
    recipe = args.recipe or (next(iter(site.env.recipes)) if len(site.env.recipes) == 1 else None)
    if recipe is None:
        raise Failure(f"--recipe: {args.environment} has recipes {', '.join(site.env.recipes)}; say which one the "
                      "run will use (its checkpoint directory is CHECKPOINT_ROOT/RUN)")
    try:
        done = import_checkpoint(site, args.run_name, recipe, _gs(site, getattr(args, "from"), "--from"), _progress)
    except ManifestError as error:
        raise Failure(str(error)) from None
    print(f"imported step {done['step']} into {done['directory']}: {done['objects']} objects, {size(done['bytes'])}; "
          f"{done['verified']}")
    print(f"its manifest is with {args.environment}'s state: `rlops train {args.environment} --recipe {recipe} --run "
          f"{args.run_name}` resumes from it")
    return Exit.OK


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _list_checkpoints(args) -> int:
    from rlops.runs import snapshot
    from rlops.runs.report import size

    environment, run = args.environment, args.run_name
    site = _site(environment, args.endpoints)
    rows = snapshot.listing(site, run)
    if rows is None:
        raise Failure(site.records.unknown(run))
    if args.format == "json":
        print_json({"environment": environment, "run": run, "checkpoints": rows})
        return Exit.OK
    header = ("STEP", "SIZE", "SAVED", "VERIFIED", "METRICS")
    lines = [header] + [(str(r["step"]), size(r["total_bytes"]), r["saved"], r["verified"], _metrics(r["metrics"]))
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines))
    return Exit.OK


def _metrics(said: str) -> str:
    """A checkpoint's metrics (JSON, as the manifest has them) as `reward=0.4123 loss=0.01235`: rounded for the
    table; `--format json` keeps the numbers whole."""
    from rlops.runs.report import number

    if said == "-":
        return said
    return " ".join(f"{name}={number(value) if isinstance(value, float) else value}"
                    for name, value in json.loads(said).items())


def add_checkpoint_commands(commands) -> None:
    checkpoints = commands.add_parser("checkpoints", help="checkpoint manifests: list a run's, build one, verify one")
    verbs = checkpoints.add_subparsers(dest="verb", required=True, metavar="VERB")

    def of_a_run(verb: str, run, help: str) -> argparse.ArgumentParser:
        parser = verbs.add_parser(verb, help=help)
        parser.add_argument("environment", metavar="ENV")
        parser.add_argument("run_name", type=run_name, metavar="RUN")
        parser.set_defaults(run=run)
        return parser

    format_option(of_a_run("list", _list_checkpoints, "a run's checkpoints with their manifests and whether they verify"))
    build = verbs.add_parser("manifest", help="print the manifest of the checkpoint at PATH (JSON)")
    build.add_argument("path", metavar="PATH")
    build.set_defaults(run=_checkpoint_manifest)
    export = of_a_run("export", _export_checkpoint, "copy a run's checkpoint to Cloud Storage (GKE: the Lustre "
                                                    "API's exportData) and verify every object against its manifest")
    export.add_argument("--step", type=int, help="default: the newest with a manifest")
    export.add_argument("--to", metavar="gs://BUCKET/PREFIX", help="default: the state bucket, runs/RUN/exports")
    imported = of_a_run("import", _import_checkpoint, "copy a verified export into a run's checkpoint directory "
                                                      "here (GKE: importData), so that the run resumes from it")
    imported.add_argument("--from", required=True, metavar="gs://BUCKET/PREFIX/step-N")
    imported.add_argument("--recipe", help="the recipe the run will use (default: the environment's only one)")
    verify = verbs.add_parser("verify", help="re-hash PATH against MANIFEST and list missing, extra and changed "
                                             "files (exit 0 identical, 1 not)")
    verify.add_argument("path", metavar="PATH")
    verify.add_argument("manifest", metavar="MANIFEST")
    verify.set_defaults(run=_checkpoint_verify)
