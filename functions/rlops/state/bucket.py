"""The state bucket (Cloud Storage), or a local emulator's (`Endpoints.storage`)."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import google.auth
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.permissions import lacking_permission

if TYPE_CHECKING:
    from rlops.spec.model import GcpEnvironment  # only a type here: a state reader need not load the spec models


def client(project: str | None, endpoints: Endpoints) -> storage.Client:
    if endpoints.storage:
        credentials = google.auth.default()[0] if endpoints.credentials else AnonymousCredentials()
        return storage.Client(project=project or "local", credentials=credentials,
                              client_options={"api_endpoint": endpoints.storage})
    return storage.Client(project=project)


def of_environment(spec: "GcpEnvironment", endpoints: Endpoints) -> storage.Bucket:
    """The state bucket a GCP environment's spec names, in its project."""
    return client(spec.project.id, endpoints).bucket(spec.state.bucket)


class Forbidden(Failure):
    """The state bucket refused the caller (a Failure: said, not a traceback)."""

    def __init__(self, what: str, error: Exception):
        super().__init__(f"storage: {what}: {lacking_permission(error) or 'forbidden'}: {error}")


@contextmanager
def refusals_said(what: str) -> Iterator[None]:
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
    return json.loads(data), _generation(blob)


def write_json(blob: storage.Blob, content: dict, if_generation_match: int) -> int:
    """Write only if the object is still at `if_generation_match` (0: does not exist yet); new generation.
    Raises PreconditionFailed when someone wrote in between. Compact: a run's series and records are written every
    tick, and indented JSON is written by Python's pure-Python encoder, at several times the time and twice the
    bytes (`jq` shows an object indented)."""
    with refusals_said(f"write gs://{blob.bucket.name}/{blob.name}"):
        blob.upload_from_string(json.dumps(content, sort_keys=True, separators=(",", ":")),
                                content_type="application/json", if_generation_match=if_generation_match)
    return _generation(blob)


def _generation(blob: storage.Blob) -> int:
    """The generation a read or a write just saw: Cloud Storage (and its emulator) send it with every object."""
    if blob.generation is None:
        raise Failure(f"storage: gs://{blob.bucket.name}/{blob.name}: the answer carried no generation")
    return blob.generation


def write_json_if(blob: storage.Blob, content: dict, generation: int) -> bool:
    """`write_json`, saying False instead of raising when the object is no longer at `generation`: the caller
    reads again and decides again (a train message and the reaper, two watch ticks)."""
    try:
        write_json(blob, content, if_generation_match=generation)
    except gexc.PreconditionFailed:
        return False
    return True


def listed(bucket: storage.Bucket, prefix: str) -> dict[str, storage.Blob]:
    """The objects under `prefix` by name, listed whole (a refusal raised here, as a Failure, not half way
    through)."""
    with refusals_said(f"list gs://{bucket.name}/{prefix}"):
        # A Blob's name is typed optional (one can be made without); a listed object always has one.
        return {cast(str, blob.name): blob for blob in bucket.list_blobs(prefix=prefix)}
