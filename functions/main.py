"""Cloud Function entry points (deployed from `functions/`, sharing the `rlops` package with the CLI).

- `train` (Pub/Sub, the train topic): one message → at most one Ray job.
- `watch` (Pub/Sub, the tick topic, from Cloud Scheduler): run records and resubmission after preemption.

Each handler imports only what it needs when it runs, so a cold start stays small.
"""

import base64
import json

import functions_framework


def _data(cloud_event) -> bytes:
    payload = cloud_event.data.get("message", {}).get("data", "") if isinstance(cloud_event.data, dict) else ""
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        return b"\x00not base64"  # refused as not JSON by the train message's checks


@functions_framework.cloud_event
def train(cloud_event) -> None:
    from rlops.runs.service import handle_train

    handle_train(_data(cloud_event))


@functions_framework.cloud_event
def watch(cloud_event) -> None:
    """A tick: `{"environment": NAME}` for one environment, `{}` for every deployed one."""
    from rlops import environments
    from rlops.logs import emit
    from rlops.runs import service

    try:
        wanted = json.loads(_data(cloud_event) or b"{}").get("environment")
    except (ValueError, AttributeError):
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
