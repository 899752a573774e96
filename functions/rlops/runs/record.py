"""The shape of a run record (kept by `rlops.state.run_records`). Pure.

A record holds the run's request, its attempts (one Ray job each), its state and the transitions
that led there, and its progress (step, reward, last complete checkpoint).
"""

import json


def new(job_meta: dict, submission_id: str, submitted_at: float) -> dict:
    """The record of a run whose first attempt was just submitted, from the job's rlops metadata."""
    return {"environment": job_meta["environment"], "recipe": job_meta["recipe"], "run": job_meta["run"],
            "requested_by": job_meta["requested-by"], "settings": json.loads(job_meta["settings"]),
            "checkpoint_dir": job_meta["checkpoint-dir"], "state": "PENDING", "step": None, "reward": None,
            "last_checkpoint": None, "created_at": submitted_at, "updated_at": submitted_at,
            "attempts": [attempt(int(job_meta["attempt"]), submission_id, submitted_at)],
            "history": [{"at": submitted_at, "attempt": int(job_meta["attempt"]), "state": "PENDING"}]}


def attempt(number: int, submission_id: str, submitted_at: float) -> dict:
    return {"attempt": number, "submission_id": submission_id, "state": "PENDING", "submitted_at": submitted_at,
            "ended_at": None, "failure": None, "resumed_from": None, "first_step": None}
