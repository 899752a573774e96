"""Run records in the state bucket: `PREFIX/environments/ENV/runs/RUN.json`, one per run (the shape of a
record: `rlops.runs.record`), with each attempt's per-step series and its kept output beside it.

Writes are conditional on the generation read, so two ticks never overwrite each other's changes.
"""

import time
from collections.abc import Callable

from google.api_core import exceptions as gexc

from rlops.state.bucket import read_json, write_json_if
from rlops.state.layout import Layout

LOG_TAIL_BYTES = 256 * 1024


class RunRecords:
    def __init__(self, bucket, prefix: str, environment: str):
        self.bucket, self.layout = bucket, Layout(prefix, environment)

    def get(self, run: str) -> tuple[dict | None, int]:
        return read_json(self.bucket.blob(self.layout.run(run)))

    def create(self, record: dict) -> bool:
        """Write a new record; False when the run already has one."""
        return write_json_if(self.bucket.blob(self.layout.run(record["run"])), record, 0)

    def replace(self, record: dict, generation: int) -> bool:
        """Write over the version read at `generation`; False when someone wrote in between."""
        record["updated_at"] = time.time()
        return write_json_if(self.bucket.blob(self.layout.run(record["run"])), record, generation)

    def metrics(self, run: str, attempt: int) -> dict | None:
        """The per-step series of an attempt ({"steps": [[step, reward, loss, seconds]], "saves": [[step,
        seconds]]}), as the watcher gathered it from the job's output."""
        return read_json(self.bucket.blob(self.layout.attempt_metrics(run, attempt)))[0]

    def add_metrics(self, run: str, attempt: int, merge: Callable[[dict | None], dict]) -> None:
        """The attempt's series becomes `merge(series)`; a tick that loses the race to another merges again
        into what that one wrote."""
        blob = self.bucket.blob(self.layout.attempt_metrics(run, attempt))
        for _ in range(3):
            old, generation = read_json(blob)
            new = merge(old)
            if new == old or write_json_if(blob, new, generation):
                return

    def save_log(self, run: str, attempt: int, text: str) -> None:
        """Keep an ended attempt's output: Ray's copy lives on the driver's node, which the reaper or a
        preemption takes away."""
        self.bucket.blob(self.layout.attempt_log(run, attempt)).upload_from_string(text[-LOG_TAIL_BYTES:],
                                                                                  content_type="text/plain")

    def log(self, run: str, attempt: int) -> str | None:
        try:
            return self.bucket.blob(self.layout.attempt_log(run, attempt)).download_as_text()
        except gexc.NotFound:
            return None

    def all(self) -> dict[str, tuple[dict, int]]:
        records = {}
        for blob in self.bucket.list_blobs(prefix=self.layout.runs):
            if not blob.name.endswith(".json") or "/" in blob.name[len(self.layout.runs):]:
                continue
            content, generation = read_json(blob)
            if content is not None:
                records[content["run"]] = (content, generation)
        return records
