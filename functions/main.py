"""Cloud Function entry points (deployed from `functions/`, sharing the `rlops` package with the CLI).

- `train` (Pub/Sub, the train topic): one message → at most one Ray job.
- `watch` (Pub/Sub, the tick topic, from Cloud Scheduler): run records and resubmission after preemption.
- `snapshot` (the same ticks): manifests of new complete checkpoints, written once.
- `reap` (the same ticks): an idle environment's GPU pool scaled to zero.

Each handler imports only what it needs when it runs, so a cold start stays small.
"""

import base64
import json

import functions_framework


def _data(cloud_event) -> bytes | None:
    """The Pub/Sub message's payload; None when the event carries none that decodes."""
    message = cloud_event.data.get("message") if isinstance(cloud_event.data, dict) else None
    try:
        return base64.b64decode(message.get("data", ""), validate=True) if isinstance(message, dict) else None
    except (ValueError, TypeError):
        return None


@functions_framework.cloud_event
def train(cloud_event) -> None:
    from rlops.logs import emit
    from rlops.runs.service import handle_train

    data = _data(cloud_event)
    if data is None:
        emit("WARNING", "train message refused", reason="message.data: missing or not base64")
        return
    handle_train(data)


def _each_environment(cloud_event, what: str, act) -> None:
    """A tick, `{"environment": NAME}` for one environment or `{}` for every deployed one: `act(site)` for each."""
    from rlops.logs import emit
    from rlops.runs import service

    try:
        wanted = json.loads(_data(cloud_event) or b"{}").get("environment")
    except (ValueError, AttributeError, RecursionError):
        emit("WARNING", f"{what} tick refused: not a JSON object")
        return
    for name, env in service.ticked_environments(wanted, what):
        try:
            events = act(service.open_site(name, env))
        except Exception as error:  # one unreachable environment must not starve the others; the next tick retries
            emit("ERROR", f"{what} tick failed", environment=name, error=f"{type(error).__name__}: {error}")
            continue
        emit("INFO", f"{what} tick", environment=name, changes=len(events))


@functions_framework.cloud_event
def watch(cloud_event) -> None:
    """Run records, and resubmission of runs whose nodes went away."""
    from rlops.runs.service import tick

    _each_environment(cloud_event, "watch", tick)


@functions_framework.cloud_event
def snapshot(cloud_event) -> None:
    """Manifests of new complete checkpoints."""
    from rlops.runs.snapshots import tick

    _each_environment(cloud_event, "snapshot", tick)


@functions_framework.cloud_event
def reap(cloud_event) -> None:
    """Scale an idle environment's GPU pool to zero."""
    from rlops.reaper.service import reap as reap_site

    def act(site) -> list:
        decision, actions = reap_site(site)
        return actions if decision.scale_down else []

    _each_environment(cloud_event, "reap", act)
