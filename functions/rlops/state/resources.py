"""The record of the cloud resources rlops created for an environment (what it may update and delete)."""

import threading

from google.api_core import exceptions as gexc
from google.cloud import storage

from rlops.errors import Failure
from rlops.permissions import calls
from rlops.state.bucket import read_json, write_json
from rlops.state.layout import Layout


@calls("storage.objects.get", "storage.objects.insert")
class ResourceRecord:
    """`{key: {"fields": ..., "depends_on": [...]}}`, kept in the state bucket, written after every step."""

    def __init__(self, bucket: storage.Bucket | None, prefix: str, environment: str):
        """`bucket` None: a record kept in memory only (a dry run's)."""
        self.blob = bucket.blob(Layout(prefix, environment).resources) if bucket else None
        self._mutex = threading.Lock()
        self.resources: dict[str, dict] = {}
        self.generation = 0

    @calls("storage.objects.get")
    def load(self) -> "ResourceRecord":
        if self.blob is not None:
            content, self.generation = read_json(self.blob)
            self.resources = (content or {}).get("resources", {})
        return self

    def put(self, key: str, fields: dict, depends_on: tuple[str, ...]) -> None:
        with self._mutex:
            self.resources[key] = {"fields": fields, "depends_on": list(depends_on)}
            self._save()

    def remove(self, key: str) -> None:
        with self._mutex:
            if self.resources.pop(key, None) is not None:
                self._save()

    def _save(self) -> None:
        if self.blob is None:
            return
        try:
            self.generation = write_json(self.blob, {"resources": self.resources}, if_generation_match=self.generation)
        except gexc.PreconditionFailed as error:
            raise Failure(f"the resource record {self.blob.name} was changed by someone else during this apply; "
                               "re-run it (the lock should have prevented this)") from error


@calls("storage.objects.get", "storage.objects.insert", "storage.objects.delete")
class AppliedSpec:
    """Which spec an environment's last complete apply carried out (`applied.json`).

    The object exists from an environment's first apply on, with `spec_sha256` null until one
    completes; destroy removes it. A push to main applies the environments its last commit touched
    and every environment that has the object with another digest than its spec's: so the commits
    before the last one in a push count too, and an apply that failed is tried again; an
    environment that was never applied, or was destroyed, is left alone until its file changes.
    """

    def __init__(self, bucket: storage.Bucket, prefix: str, environment: str):
        self.blob = bucket.blob(Layout(prefix, environment).applied)

    def read(self) -> dict | None:
        """None when the environment was never applied (or was destroyed since)."""
        return read_json(self.blob)[0]

    def mark_attempt(self, commit: str | None = None) -> None:
        """An apply starts (of `commit`, when a pipeline names it); the last complete apply's record stays."""
        content, generation = read_json(self.blob)
        wanted = {**(content or {"spec_sha256": None}), **({"attempted_commit": commit} if commit else {})}
        if content != wanted:
            write_json(self.blob, wanted, if_generation_match=generation)

    def mark(self, digest: str, commit: str | None = None) -> None:
        content, generation = read_json(self.blob)
        wanted = {**(content or {}), "spec_sha256": digest, **({"commit": commit} if commit else {})}
        if content != wanted:  # an apply that changed nothing writes nothing
            write_json(self.blob, wanted, if_generation_match=generation)

    def clear(self) -> None:
        try:
            self.blob.bucket.blob(self.blob.name).delete()
        except gexc.NotFound:
            pass
