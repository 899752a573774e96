"""The `train` function: one message becomes at most one Ray job.

From a train message to the Ray call: `functions/main.py` `train` → `handle` here (the message parsed by
`message.py`, the site from `rlops.sites`) → `jobs.py` `for_site` (the job: submission id, command,
metadata, no secrets) and `submit` (with the manifests its checkpoint gate verifies against: an imported
checkpoint is resumed from only if it verifies) → `cloud/ray_jobs.py` `RayJobs.submit_once`.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from rlops.cloud.ray_jobs import JobRequest, described
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.logs import emit
from rlops.reaper.reap import wake
from rlops.runs import jobs, message
from rlops.sites import Site, UnknownEnvironment, load_environment, open_site, placement, run_records
from rlops.spec import nemo_rl
from rlops.spec.model import GcpEnvironment, LocalEnvironment, Recipe
from rlops.state.run_records import Refusal, RunRecord, RunRecords, new


class RunNameTaken(Failure):
    """A train message for a run that exists with another recipe or other settings: one run name is one run."""


def handle(data: bytes, endpoints: Endpoints, message_id: str | None = None) -> str:
    """'submitted', 'duplicate', 'refused' (a run of that name exists with other settings) or 'poison'. A refused
    or poison message is logged with its reason, kept by run name and message id where the environment and the run
    can be told, and never submitted; an error reaching Ray or the bucket raises, so that Pub/Sub delivers the
    message again."""
    try:
        request = message.parse(data)
        env = load_environment(request.environment)
        recipe = message.recipe_of(request, env)
        settings = message.settings(request, recipe)
    except (message.Poison, UnknownEnvironment) as poison:
        emit("WARNING", "train message refused", reason=str(poison), bytes=len(data))
        _keep_refusal(data, message_id, str(poison), endpoints)
        return "poison"
    return accept(open_site(request.environment, env, endpoints), request, settings, message_id)


def accept(site: Site, request: message.TrainMessage, settings: dict, message_id: str | None = None) -> str:
    """A valid train message on its environment: 'submitted', 'duplicate' or 'refused'."""
    job = jobs.for_site(site, request.recipe, request.run, settings, request.requested_by, attempt=1)
    # The record outlives Ray's job table (a restarted head forgets its jobs and their ids): look there first.
    try:
        record = submitted_before(site.records, request, settings)
    except RunNameTaken as taken:
        emit("WARNING", "train message refused", reason=str(taken), environment=request.environment, run=request.run)
        site.records.refuse(Refusal(request.run, message_key(message_id, request.model_dump_json().encode()),
                                    str(taken), site.clock.time()))
        return "refused"
    submitted = False
    if record is None:
        wake(site)  # a reaped pool comes back before the job is submitted; records the acceptance either way
        submitted = jobs.submit(site, job, request.run)
        now = site.clock.time()
        # Written also when Ray had the job already: a delivery before this one submitted it and stopped before
        # writing the record, which outlives Ray's job table (a head restarted since would leave the run known
        # nowhere, and the message acknowledged).
        meta = described(job)
        assert meta is not None  # jobs.request puts rlops's metadata on every job it makes
        site.records.create(new(meta, job.submission_id, now))
    if not submitted:
        emit("INFO", "train message for a run already submitted: nothing to do", environment=request.environment,
             run=request.run, submission_id=job.submission_id)
        return "duplicate"
    emit("INFO", "run submitted", environment=request.environment, run=request.run, submission_id=job.submission_id)
    site.publish({"type": "submitted", "environment": request.environment, "run": request.run, "attempt": 1,
                  "recipe": request.recipe, "submission_id": job.submission_id, "requested_by": request.requested_by,
                  "at": now})
    return "submitted"


def submitted_before(records: RunRecords, request: message.TrainMessage, settings: dict) -> RunRecord | None:
    """What `rlops train` looks at before it sends: the run's record when this is its request again (nothing to
    send), None for a new run; RunNameTaken when the run exists with another recipe or other settings."""
    record = records.get(request.run)[0]
    if record is not None and (taken := difference(record, request.recipe, settings)):
        raise RunNameTaken(f"run {request.run} exists with {taken}; one run name is one run: pick a new name to "
                           "train again")
    return record


def difference(record: RunRecord, recipe: str, settings: dict) -> str | None:
    """How a request differs from the one the run was started with (the recipe, the settings the job runs with);
    None when it is the same."""
    if record.recipe != recipe:
        return f"recipe {record.recipe} (this message: {recipe})"

    def said(found: dict, key: str) -> str:
        return json.dumps(found[key]) if key in found else "unset"
    changed = [f"{key}={said(record.settings, key)} (this message: {said(settings, key)})"
               for key in sorted(record.settings.keys() | settings.keys())
               if said(record.settings, key) != said(settings, key)]
    return ", ".join(changed) or None


def message_key(message_id: str | None, data: bytes) -> str:
    """A refusal's name: the Pub/Sub message id (digits), or the message's digest for an id that is missing or
    could not be an object name of its own."""
    if message_id and re.fullmatch(r"[A-Za-z0-9_-]{1,100}", message_id):
        return message_id
    return f"sha256-{hashlib.sha256(data).hexdigest()[:32]}"


def _keep_refusal(data: bytes, message_id: str | None, reason: str, endpoints: Endpoints) -> None:
    """The refusal where `rlops status --run` finds it: in the state bucket of the environment the message names,
    when it names a deployed environment and a valid run name. Best effort: the message is acknowledged either way,
    so an unwritable note never turns a poison message into one Pub/Sub delivers again and again."""
    addressee = message.addressee(data)
    if addressee is None:
        return
    environment, run = addressee
    try:
        records = run_records(environment, load_environment(environment), endpoints)
        records.refuse(Refusal(run, message_key(message_id, data), reason, records.clock.time()))
    except UnknownEnvironment:
        return
    except Exception as error:  # any failure to write the note leaves the log line as the only trace
        emit("WARNING", "refusal not kept in the state bucket", run=run,
             error=f"{type(error).__name__}: {error}"[-300:])


def refusals_shown(records: RunRecords, run: str, record: RunRecord | None) -> list[Refusal]:
    """The refusals `rlops status --run` shows: all of them while the run has no record (why it never started),
    else those that came after it started (messages that reused its name)."""
    since = record.created_at if record is not None else float("-inf")
    return [refusal for refusal in records.refusals(run) if refusal.at > since]


@dataclass
class WouldSubmit:
    """What the train function would submit for a message, nothing sent (`rlops train --dry-run`, like `helm
    template`): the job, and for a NeMo RL recipe the config its entry point would run with."""

    environment: str
    job: JobRequest
    recipe: Recipe
    secrets: list[str]
    nemo_rl_tag: nemo_rl.Tag | None = None
    final_config: Any = None  # as the tag's loader composes it, before logger.log_dir gets its exp_N
    not_composed: str | None = None  # why rlops cannot compose it: it has no copy of the image's NeMo RL tag


def would_submit(env_name: str, env: GcpEnvironment | LocalEnvironment, request: message.TrainMessage,
                 settings: dict[str, Any]) -> WouldSubmit:
    """Raises `Failure` naming each key NeMo RL's loader would refuse."""
    recipe = env.recipes[request.recipe]
    lustre, resources = placement(env)
    job = jobs.request(env_name, request.recipe, recipe, request.run, settings, request.requested_by, 1, lustre,
                       resources, jobs.actor_env(env, recipe), jobs.data_tag(env), jobs.pool_gpus(env, recipe))
    would = WouldSubmit(env_name, job, recipe, sorted(env.secrets))
    if recipe.runner == "nemo-rl" and isinstance(env, GcpEnvironment):  # a valid spec has nemo-rl on GCP only
        would.nemo_rl_tag = nemo_rl.tag_for(env.ray.image)
        if would.nemo_rl_tag is None:
            would.not_composed = nemo_rl.unsupported(env.ray.image)
        else:
            composed = nemo_rl.compose(would.nemo_rl_tag, recipe.config, nemo_rl.assignments(
                recipe, settings, jobs.checkpoint_dir(recipe, request.run, lustre)))
            if composed.problems:
                raise Failure("\n".join(f"{key or recipe.config}: {problem}" for key, problem in composed.problems))
            would.final_config = composed.config
    return would
