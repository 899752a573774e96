"""Run records in the state bucket: `PREFIX/environments/ENV/runs/RUN.json`, one per run.

A record holds the run's request, its attempts (one Ray job each), its state and the transitions
that led there, and its progress (step, reward, last complete checkpoint). Writes are conditional
on the generation read, so two ticks never overwrite each other's changes.
"""

import time

LOG_TAIL_BYTES = 256 * 1024

from google.api_core import exceptions as gexc

from rlops.state.bucket import read_json, write_json_if
from rlops.state.layout import Layout


def new(job_meta: dict, submission_id: str, submitted_at: float) -> dict:
    """The record of a run whose first attempt was just submitted, from the job's rlops metadata."""
    import json

    return {"environment": job_meta["environment"], "recipe": job_meta["recipe"], "run": job_meta["run"],
            "requested_by": job_meta["requested-by"], "settings": json.loads(job_meta["settings"]),
            "checkpoint_dir": job_meta["checkpoint-dir"], "state": "PENDING", "step": None, "reward": None,
            "last_checkpoint": None, "created_at": submitted_at, "updated_at": submitted_at,
            "attempts": [attempt(int(job_meta["attempt"]), submission_id, submitted_at)],
            "history": [{"at": submitted_at, "attempt": int(job_meta["attempt"]), "state": "PENDING"}]}


def attempt(number: int, submission_id: str, submitted_at: float) -> dict:
    return {"attempt": number, "submission_id": submission_id, "state": "PENDING", "submitted_at": submitted_at,
            "ended_at": None, "failure": None, "resumed_from": None, "first_step": None}


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

    def add_metrics(self, run: str, attempt: int, points: dict) -> None:
        """Merges `points` into the attempt's series (progress.merged); a tick that loses the race to another
        tries again on what that one wrote."""
        from rlops.runs.progress import merged

        blob = self.bucket.blob(self.layout.attempt_metrics(run, attempt))
        for _ in range(3):
            old, generation = read_json(blob)
            new = merged(old, points)
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
