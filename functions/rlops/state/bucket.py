"""The state bucket (Cloud Storage), or a local emulator's (`Endpoints.storage`)."""

import json
from contextlib import contextmanager

from google.api_core import exceptions as gexc
from google.cloud import storage

from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.permissions import lacking_permission


def client(project: str | None, endpoints: Endpoints) -> storage.Client:
    if endpoints.storage:
        import google.auth
        from google.auth.credentials import AnonymousCredentials

        credentials = google.auth.default()[0] if endpoints.credentials else AnonymousCredentials()
        return storage.Client(project=project or "local", credentials=credentials,
                              client_options={"api_endpoint": endpoints.storage})
    return storage.Client(project=project)


def of_environment(spec, endpoints: Endpoints):
    """The state bucket a GCP environment's spec names, in its project."""
    return client(spec.project.id, endpoints).bucket(spec.state.bucket)


class Forbidden(Failure):
    """The state bucket refused the caller (a Failure: said, not a traceback)."""

    def __init__(self, what: str, error: Exception):
        super().__init__(f"storage: {what}: {lacking_permission(error) or 'forbidden'}: {error}")


@contextmanager
def refusals_said(what: str):
    """A refusal of the caller inside, raised as Forbidden naming `what` and the permission it lacks."""
    try:
        yield
    except (gexc.Forbidden, gexc.PermissionDenied) as error:
        raise Forbidden(what, error) from error


def read_json(blob: storage.Blob) -> tuple[dict | None, int]:
    """(content, generation) of the object's live version; (None, 0) when the object does not exist."""
    blob = blob.bucket.blob(blob.name)  # a Blob that saw a generation asks for that one, which a newer write removed
    try:
        with refusals_said(f"read gs://{blob.bucket.name}/{blob.name}"):
            data = blob.download_as_bytes()
    except gexc.NotFound:
        return None, 0
    return json.loads(data), blob.generation


def write_json(blob: storage.Blob, content: dict, if_generation_match: int) -> int:
    """Write only if the object is still at `if_generation_match` (0: does not exist yet); new generation.
    Raises PreconditionFailed when someone wrote in between. Compact: a run's series and records are written every
    tick, and indented JSON is written by Python's pure-Python encoder, at several times the time and twice the
    bytes (`jq` shows an object indented)."""
    with refusals_said(f"write gs://{blob.bucket.name}/{blob.name}"):
        blob.upload_from_string(json.dumps(content, sort_keys=True, separators=(",", ":")),
                                content_type="application/json", if_generation_match=if_generation_match)
    return blob.generation


def write_json_if(blob: storage.Blob, content: dict, generation: int) -> bool:
    """`write_json`, saying False instead of raising when the object is no longer at `generation`: the caller
    reads again and decides again (a train message and the reaper, two watch ticks)."""
    try:
        write_json(blob, content, if_generation_match=generation)
    except gexc.PreconditionFailed:
        return False
    return True


def listed(bucket, prefix: str) -> list:
    """The objects under `prefix`, listed whole (a refusal raised here, as a Failure, not half way through)."""
    with refusals_said(f"list gs://{bucket.name}/{prefix}"):
        return list(bucket.list_blobs(prefix=prefix))
