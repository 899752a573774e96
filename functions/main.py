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
from collections.abc import Callable, Sized
from functools import cache
from typing import TYPE_CHECKING, Any

import functions_framework
from cloudevents.http import CloudEvent  # what functions_framework hands a cloud_event function

from rlops.endpoints import Endpoints

if TYPE_CHECKING:  # the handlers import rlops.sites when they run: it loads the Google clients
    from rlops.sites import Site


@cache
def _endpoints() -> Endpoints:
    return Endpoints.from_environment()


def _message(cloud_event: CloudEvent) -> dict[str, Any] | None:
    message = cloud_event.data.get("message") if isinstance(cloud_event.data, dict) else None
    return message if isinstance(message, dict) else None


def _data(message: dict[str, Any] | None) -> bytes | None:
    """The Pub/Sub message's payload; None when there is no message, or none that decodes."""
    try:
        return base64.b64decode(message.get("data", ""), validate=True) if message is not None else None
    except (ValueError, TypeError):
        return None


@functions_framework.cloud_event
def train(cloud_event: CloudEvent) -> None:
    from rlops.logs import emit
    from rlops.runs.train import handle

    message = _message(cloud_event)
    data = _data(message)
    if message is None or data is None:
        emit("WARNING", "train message refused", reason="message.data: missing or not base64")
        return
    message_id = message.get("messageId")  # what a refusal is kept by, with the run's name
    handle(data, _endpoints(), message_id if isinstance(message_id, str) else None)


def _each_environment(cloud_event: CloudEvent, what: str, act: Callable[["Site"], Sized]) -> None:
    """A tick, `{"environment": NAME}` for one environment or `{}` for every deployed one: `act(site)` for each."""
    from rlops import sites
    from rlops.logs import emit

    try:
        wanted = json.loads(_data(_message(cloud_event)) or b"{}").get("environment")
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
def watch(cloud_event: CloudEvent) -> None:
    """Run records, and resubmission of runs whose nodes went away."""
    from rlops.runs.watch import tick

    _each_environment(cloud_event, "watch", tick)


@functions_framework.cloud_event
def snapshot(cloud_event: CloudEvent) -> None:
    """Manifests of new complete checkpoints."""
    from rlops.runs.snapshot import tick

    _each_environment(cloud_event, "snapshot", tick)


@functions_framework.cloud_event
def reap(cloud_event: CloudEvent) -> None:
    """Scale an idle environment's GPU pool to zero."""
    from rlops.reaper.reap import reap as reap_site

    def act(site: "Site") -> list[str]:
        decision, actions = reap_site(site)
        return actions if decision.scale_down else []

    _each_environment(cloud_event, "reap", act)
