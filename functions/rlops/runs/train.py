"""The `train` function: one message becomes at most one Ray job.

From a train message to the Ray call: `functions/main.py` `train` → `handle` here (the message parsed by
`message.py`, the site from `rlops.sites`) → `jobs.py` `for_site` (the job: submission id, command,
metadata, no secrets) and `submit` (with the manifests its checkpoint gate verifies against: an imported
checkpoint is resumed from only if it verifies) → `cloud/ray_jobs.py` `RayJobs.submit_once`.
"""

import time

from rlops.cloud.ray_jobs import described
from rlops.endpoints import Endpoints
from rlops.logs import emit
from rlops.reaper.reap import wake
from rlops.runs import jobs, message
from rlops.sites import UnknownEnvironment, load_environment, open_site
from rlops.state.run_records import new


def handle(data: bytes, endpoints: Endpoints) -> str:
    """'submitted', 'duplicate' or 'poison'. A poison message is logged with its reason and never submitted;
    an error reaching Ray or the bucket raises, so that Pub/Sub delivers the message again."""
    try:
        request = message.parse(data)
        env = load_environment(request.environment)
        recipe = message.recipe_of(request, env)
        settings = message.settings(request, recipe)
    except (message.Poison, UnknownEnvironment) as poison:
        emit("WARNING", "train message refused", reason=str(poison), bytes=len(data))
        return "poison"
    return accept(open_site(request.environment, env, endpoints), request, settings)


def accept(site, request: message.TrainMessage, settings: dict) -> str:
    """A valid train message on its environment: 'submitted' or 'duplicate'."""
    job = jobs.for_site(site, request.recipe, request.run, settings, request.requested_by, attempt=1)
    # The record outlives Ray's job table (a restarted head forgets its jobs and their ids): look there first.
    known = site.records.get(request.run)[0] is not None
    if not known:
        wake(site)  # a reaped pool comes back before the job is submitted; records the acceptance either way
    if known or not jobs.submit(site, job, request.run):
        emit("INFO", "train message for a run already submitted: nothing to do", environment=request.environment,
             run=request.run, submission_id=job.submission_id)
        return "duplicate"
    now = time.time()
    site.records.create(new(described(job), job.submission_id, now))
    emit("INFO", "run submitted", environment=request.environment, run=request.run, submission_id=job.submission_id)
    site.publish({"type": "submitted", "environment": request.environment, "run": request.run, "attempt": 1,
                  "recipe": request.recipe, "submission_id": job.submission_id, "requested_by": request.requested_by,
                  "at": now})
    return "submitted"
