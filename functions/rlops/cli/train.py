"""The CLI's `train`: a run's train message, checked and sent (or, with --dry-run, the job it would submit)."""

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from rlops.cli.common import Commands, Exit, environment_command, load_spec
from rlops.cli.stack import local_stack
from rlops.endpoints import Endpoints
from rlops.errors import Failure

if TYPE_CHECKING:
    from rlops.local.stack import Stack
    from rlops.runs.message import TrainMessage
    from rlops.runs.train import WouldSubmit
    from rlops.spec.model import GcpEnvironment, LocalEnvironment


def _typed(text: str) -> bool | int | float | str:
    """`--set` values: JSON scalars (4, 0.001, true, "x") as such, anything else as a string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (bool, int, float, str)) else text


def _train(args: argparse.Namespace) -> int:
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
        print(_would_submit(train.would_submit(env_name, env, parsed, settings)))
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
        how = _send_local(local_stack(args.environment, "train"), data, args.endpoints)
    else:
        from rlops.cloud import pubsub

        sent = pubsub.publish(args.endpoints, env.project.id, pubsub.TRAIN_TOPIC, payload)
        how = f"published to {pubsub.TRAIN_TOPIC} (message {sent})"
    print(f"train message for run {args.run_name} of {env_name}: {how}")
    print(hint)
    return Exit.OK


def _would_submit(would: "WouldSubmit") -> str:
    """The job `rlops train --dry-run` would submit, as YAML."""
    import yaml

    from rlops.spec import nemo_rl

    job, recipe = would.job, would.recipe
    lines = [f"# rlops train {would.environment} --dry-run: nothing was sent",
             yaml.safe_dump({"submission_id": job.submission_id,
                             "working_directory": nemo_rl.WORKDIR if recipe.runner == "nemo-rl" else "(Ray's)",
                             "entrypoint": job.entrypoint, "entrypoint_resources": job.entrypoint_resources,
                             "runtime_env": job.runtime_env, "metadata": job.metadata,
                             "secrets_by_name_only": would.secrets},
                            sort_keys=False, width=10**6).rstrip(),
             "# secrets reach the Ray nodes as files (HF_TOKEN_PATH, NETRC), never an environment variable or the job"]
    if recipe.driver_on_head:
        lines.append("# runtime_env.env_vars reach every actor, whichever node the driver runs on: NeMo RL's init_ray "
                     "copies the driver's environment into them")
    if would.not_composed:
        lines.append(f"# {would.not_composed}")
    elif would.nemo_rl_tag is not None:
        tag = would.nemo_rl_tag
        lines += [f"# the final config NeMo RL {tag.name} (commit {tag.commit[:12]}) runs with: {recipe.config}",
                  f"# composed as {recipe.entrypoint} composes it, before logger.log_dir gets its exp_N",
                  "---", yaml.safe_dump(would.final_config, sort_keys=False, width=10**6).rstrip()]
    return "\n".join(lines)


def _check_data(env: "GcpEnvironment | LocalEnvironment", parsed: "TrainMessage", settings: dict[str, Any], path: str,
                samples: int | None) -> int:
    """`--check-data FILE`: FILE's first rows, as the recipe's data source publishes them, through its data steps,
    read and rewarded as its NeMo RL tag reads and rewards a model's answer (`spec.nemo_rl_reward`)."""
    from rlops.spec import nemo_rl
    from rlops.spec import nemo_rl_reward as reward
    from rlops.spec.model import GcpEnvironment

    recipe = env.recipes[parsed.recipe]
    if recipe.runner != "nemo-rl" or not isinstance(env, GcpEnvironment):  # a valid spec has nemo-rl on GCP only
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


def _send_local(stack: "Stack", data: bytes, endpoints: Endpoints) -> str:
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


def add_commands(commands: Commands) -> None:
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
