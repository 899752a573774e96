"""Cloud Function entry points (deployed from `functions/`, sharing the `rlops` package with the CLI).

- `train` (Pub/Sub, the train topic): one message → at most one Ray job (`rlops/runs/train.py`).
- `watch` (Pub/Sub, the tick topic, from Cloud Scheduler): run records and resubmission after preemption
  (`rlops/runs/watch.py`).
- `snapshot` (the same ticks): manifests of new complete checkpoints, written once (`rlops/runs/snapshot.py`).
- `reap` (the same ticks): an idle environment's GPU pool scaled to zero (`rlops/reaper/reap.py`).

Each handler imports only what it needs when it runs, so a cold start stays small. Where the clients point
(`rlops.endpoints`) is read from the function's environment once, at the first message.
"""

import base64
import json
import os
from functools import cache

import functions_framework


@cache
def _endpoints():
    from rlops.endpoints import Endpoints

    return Endpoints.from_environment()


def _message(cloud_event) -> dict | None:
    message = cloud_event.data.get("message") if isinstance(cloud_event.data, dict) else None
    return message if isinstance(message, dict) else None


def _data(cloud_event) -> bytes | None:
    """The Pub/Sub message's payload; None when the event carries none that decodes."""
    message = _message(cloud_event)
    try:
        return base64.b64decode(message.get("data", ""), validate=True) if message is not None else None
    except (ValueError, TypeError):
        return None


@functions_framework.cloud_event
def train(cloud_event) -> None:
    from rlops.logs import emit
    from rlops.runs.train import handle

    data = _data(cloud_event)
    if data is None:
        emit("WARNING", "train message refused", reason="message.data: missing or not base64")
        return
    message_id = _message(cloud_event).get("messageId")  # what a refusal is kept by, with the run's name
    handle(data, _endpoints(), message_id if isinstance(message_id, str) else None)


def _each_environment(cloud_event, what: str, act) -> None:
    """A tick, `{"environment": NAME}` for one environment or `{}` for every deployed one: `act(site)` for each."""
    from rlops import sites
    from rlops.logs import emit

    try:
        wanted = json.loads(_data(cloud_event) or b"{}").get("environment")
    except (ValueError, AttributeError, RecursionError):
        emit("WARNING", f"{what} tick refused: not a JSON object")
        return
    # RLOPS_PROJECT: the deployment's project; an environment of another is that project's deployment's to tick.
    for name, env in sites.ticked_environments(wanted, what, _endpoints(), os.environ.get("RLOPS_PROJECT")):
        try:
            events = act(sites.open_site(name, env, _endpoints()))
        except Exception as error:  # one unreachable environment must not starve the others; the next tick retries
            emit("ERROR", f"{what} tick failed", environment=name, error=f"{type(error).__name__}: {error}")
            continue
        emit("INFO", f"{what} tick", environment=name, changes=len(events))


@functions_framework.cloud_event
def watch(cloud_event) -> None:
    """Run records, and resubmission of runs whose nodes went away."""
    from rlops.runs.watch import tick

    _each_environment(cloud_event, "watch", tick)


@functions_framework.cloud_event
def snapshot(cloud_event) -> None:
    """Manifests of new complete checkpoints."""
    from rlops.runs.snapshot import tick

    _each_environment(cloud_event, "snapshot", tick)


@functions_framework.cloud_event
def reap(cloud_event) -> None:
    """Scale an idle environment's GPU pool to zero."""
    from rlops.reaper.reap import reap as reap_site

    def act(site) -> list:
        decision, actions = reap_site(site)
        return actions if decision.scale_down else []

    _each_environment(cloud_event, "reap", act)
