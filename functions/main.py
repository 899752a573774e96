"""Cloud Function entry points (deployed from `functions/`, sharing the `rlops` package with the CLI).

- `train` (Pub/Sub, the train topic): one message → at most one Ray job.
- `watch` (Pub/Sub, the tick topic, from Cloud Scheduler): run records and resubmission after preemption.

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


@functions_framework.cloud_event
def watch(cloud_event) -> None:
    """A tick: `{"environment": NAME}` for one environment, `{}` for every deployed one."""
    from rlops import environments
    from rlops.logs import emit
    from rlops.runs import service

    try:
        wanted = json.loads(_data(cloud_event) or b"{}").get("environment")
    except (ValueError, AttributeError, RecursionError):
        emit("WARNING", "tick refused: not a JSON object")
        return
    names = [wanted] if wanted else [path.stem for path in environments.spec_files()]
    for name in names:
        try:
            env = service.load_environment(name)
        except service.message.Poison as poison:
            emit("WARNING", "tick for an unknown environment", reason=str(poison))
            continue
        try:
            events = service.tick(service.open_site(name, env))
        except Exception as error:  # one unreachable environment must not starve the others; the next tick retries
            emit("ERROR", "watch tick failed", environment=name, error=f"{type(error).__name__}: {error}")
            continue
        emit("INFO", "watch tick", environment=name, changes=len(events))
