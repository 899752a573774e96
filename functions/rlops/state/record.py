"""The record of the cloud resources rlops created for an environment (what it may update and delete)."""

import threading

from google.api_core import exceptions as gexc

from rlops.state.bucket import read_json, write_json


class ResourceRecord:
    """`{key: {"fields": ..., "depends_on": [...]}}`, kept in the state bucket, written after every step."""

    def __init__(self, bucket, prefix: str, environment: str):
        self.blob = bucket.blob(f"{prefix}/environments/{environment}/resources.json") if bucket else None
        self._mutex = threading.Lock()
        self.resources: dict[str, dict] = {}
        self.generation = 0

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
            raise RuntimeError(f"the resource record {self.blob.name} was changed by someone else during this apply; "
                               "re-run it (the lock should have prevented this)") from error
