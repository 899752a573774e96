"""Run records: typed, and kept in the state bucket as `PREFIX/environments/ENV/runs/RUN.json`, one per run,
with each attempt's per-step series and its kept output beside it; and why the train function refused a message
for a run (`refusals/RUN/`).

A record holds the run's request, its attempts (one Ray job each), its state and the transitions
that led there, and its progress (step, reward, last complete checkpoint). The JSON form carries
`version`: a record of a newer version than this code knows is refused rather than misread, and
one without (written before records were versioned) has the same fields as version 1. Writes are
conditional on the generation read, so two ticks never overwrite each other's changes.
"""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import storage

from rlops.clock import SYSTEM, Clock
from rlops.environments import did_you_mean
from rlops.errors import Failure
from rlops.permissions import calls
from rlops.state.bucket import listed, read_json, write_json_if
from rlops.state.layout import Layout

LOG_TAIL_BYTES = 256 * 1024
VERSION = 1
Known = TypeVar("Known", bound=StrEnum)


class UnknownVersion(ValueError):
    pass


class RunState(StrEnum):
    """A run's or an attempt's state: Ray's job statuses (ray.job_submission.JobStatus, whose values these are, so a
    job's status compares equal to its state), and two of rlops's own."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    CANCELLED = "CANCELLED"      # a run's only: `rlops cancel` ended it, and nothing resumes it
    RESUBMITTED = "RESUBMITTED"  # a history entry's only: a new attempt followed a failed one


TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.CANCELLED})  # ended


class FailureKind(StrEnum):
    """Why an attempt failed (runs.policy.failure_kind), which decides whether a new attempt follows."""

    NODE_LOST = "node-lost"  # its nodes went away under it (a Spot preemption)
    CAPACITY = "capacity"    # the GPUs did not come
    GATE = "gate"            # it failed before its checkpoint gate said where it resumes
    DATA = "data"            # the gate refused the recipe's data: no retry changes that
    CODE = "code"            # the training code failed
    STOPPED = "stopped"      # stopped (rlops cancel, or by hand)


@dataclass
class AttemptFailure:
    kind: FailureKind
    error_type: str | None
    message: str


@dataclass
class Attempt:
    attempt: int
    submission_id: str
    submitted_at: float
    state: RunState = RunState.PENDING
    ended_at: float | None = None
    failure: AttemptFailure | None = None
    resumed_from: int | None = None   # the checkpoint step NeMo RL or the recipe said it resumed from
    first_step: int | None = None
    epoch: int = 1
    # NeMo RL: the last step banner a tick saw ({"step", "rewarded"}), which a later tick's tail may not show.
    banner: dict | None = None
    # Where the attempt's gate set it to resume, and what it set aside (checkpoints.gate).
    resume_point: dict | None = None
    started_at: float | None = None   # when its command began on a node (the gate's clock): running from then
    first_step_at: float | None = None  # the watcher tick that first saw a step of it (a wake's last phase ends)


@dataclass
class HistoryEntry:
    at: float
    attempt: int
    state: RunState


@dataclass
class RunRecord:
    environment: str
    recipe: str
    run: str
    requested_by: str
    settings: dict
    checkpoint_dir: str
    created_at: float
    updated_at: float
    attempts: list[Attempt]
    history: list[HistoryEntry]
    state: RunState = RunState.PENDING
    step: int | None = None
    reward: float | None = None
    last_checkpoint: int | None = None
    manifests: dict[str, dict] = field(default_factory=dict)  # step -> {object, digest}: the snapshot's links
    report: str | None = None                                  # the report's object, once the run ended
    exports: dict[str, dict] = field(default_factory=dict)      # step -> {destination, objects, verified_at}
    waiting: str | None = None                                 # why its pending attempt is not running, if known

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    def to_json(self) -> dict:
        return {"version": VERSION, **plain_fields(self)}

    @classmethod
    def from_json(cls, content: dict) -> "RunRecord":
        values = readable(cls, content, f"run record {content.get('run')!r}", VERSION)
        values["attempts"] = [_attempt(a) for a in content.get("attempts", [])]
        what = f"run record {content.get('run')!r}"
        values["history"] = [HistoryEntry(entry["at"], entry["attempt"], _known(RunState, entry["state"], what))
                             for entry in content.get("history", [])]
        if "state" in values:
            values["state"] = _known(RunState, values["state"], what)
        return cls(**values)


@dataclass
class Refusal:
    """Why the train function refused a message for a run: kept where `rlops status --run` looks, since the
    function's log line is in Cloud Logging, which the sender may not read."""

    run: str
    message: str   # the Pub/Sub message id (or the message's digest): a redelivery is the same refusal
    reason: str
    at: float

    def to_json(self) -> dict:
        return {"version": VERSION, **plain_fields(self)}

    @classmethod
    def from_json(cls, content: dict) -> "Refusal":
        return cls(**readable(cls, content, f"refusal of a message for run {content.get('run')!r}", VERSION))


def plain(value: object) -> Any:
    """`value` as JSON-ready data, nested dataclasses as dicts of their fields, every container copied (a snapshot:
    changing the record later changes nothing in it). `dataclasses.asdict` does the same but deep-copies each leaf,
    which made it most of a watch tick's time (a tick takes a record's JSON form twice to see if it changed)."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return plain_fields(value)


def plain_fields(value: object) -> dict[str, Any]:
    """A dataclass's fields as `plain` data."""
    return {name: plain(getattr(value, name)) for name in _field_names(type(value))}


@functools.cache
def _field_names(cls: type) -> dict[str, None]:
    """The dataclass's field names, in order (a dict: read for every record of every tick)."""
    return dict.fromkeys(f.name for f in fields(cls))


def readable(cls: type, content: dict, what: str, version: int) -> dict[str, Any]:
    """The fields of `content` that dataclass `cls` has, once `content` is of a version this code reads (one
    without a version was written before versions, in the first one's shape)."""
    found = content.get("version", 1)
    if found > version:
        raise UnknownVersion(f"{what} is version {found}; this rlops reads up to {version}: upgrade rlops")
    known = _field_names(cls)
    return {key: value for key, value in content.items() if key in known}


def _attempt(content: dict) -> Attempt:
    values = readable(Attempt, content, "attempt", VERSION)
    if values.get("failure"):
        failure = values["failure"]
        values["failure"] = AttemptFailure(_known(FailureKind, failure["kind"], "attempt"), failure["error_type"],
                                           failure["message"])
    if "state" in values:
        values["state"] = _known(RunState, values["state"], "attempt")
    return Attempt(**values)


def _known(kind: type[Known], value: str, what: str) -> Known:
    try:
        return kind(value)
    except ValueError:
        raise UnknownVersion(f"{what} says {value!r}, which this rlops does not know: upgrade rlops") from None


def new(job_meta: dict, submission_id: str, submitted_at: float) -> RunRecord:
    """The record of a run whose first attempt was just submitted, from the job's rlops metadata."""
    number = int(job_meta["attempt"])
    return RunRecord(environment=job_meta["environment"], recipe=job_meta["recipe"], run=job_meta["run"],
                     requested_by=job_meta["requested-by"], settings=json.loads(job_meta["settings"]),
                     checkpoint_dir=job_meta["checkpoint-dir"], created_at=submitted_at, updated_at=submitted_at,
                     attempts=[Attempt(number, submission_id, submitted_at)],
                     history=[HistoryEntry(submitted_at, number, RunState.PENDING)])


@calls("storage.objects.get", "storage.objects.insert", "storage.objects.list")
class RunRecords:
    def __init__(self, bucket: storage.Bucket, prefix: str, environment: str, clock: Clock = SYSTEM):
        self.bucket, self.layout, self.clock = bucket, Layout(prefix, environment), clock

    def get(self, run: str) -> tuple[RunRecord | None, int]:
        content, generation = read_json(self.bucket.blob(self.layout.run(run)))
        return (None if content is None else RunRecord.from_json(content)), generation

    def create(self, record: RunRecord) -> bool:
        """Write a new record; False when the run already has one."""
        return write_json_if(self.bucket.blob(self.layout.run(record.run)), record.to_json(), 0)

    def replace(self, record: RunRecord, generation: int) -> bool:
        """Write over the version read at `generation`; False when someone wrote in between."""
        record.updated_at = self.clock.time()
        return write_json_if(self.bucket.blob(self.layout.run(record.run)), record.to_json(), generation)

    def update(self, run: str, change: Callable[[RunRecord], None], tries: int = 5) -> bool:
        """`change` applied to the run's record and written, read again and applied again when another writer
        (the watcher) got in between; False when it never landed. A run with no record is a Failure."""
        for _ in range(tries):
            record, generation = self.get(run)
            if record is None:
                raise Failure(f"no record of run {run} in {self.layout.environment} to change")
            change(record)
            if self.replace(record, generation):
                return True
        return False

    def manifest_objects(self, run: str) -> dict[int, storage.Blob]:
        """The run's stored checkpoint manifests (the snapshot tick's), by step, unread."""
        prefix = self.layout.manifests(run)
        return {int(name[len(prefix):-len(".json")]): blob
                for name, blob in listed(self.bucket, prefix).items() if name.endswith(".json")}

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

    def refuse(self, refusal: Refusal) -> None:
        """Keep a refusal, once per message: a redelivered message's refusal is already there."""
        write_json_if(self.bucket.blob(self.layout.refusal(refusal.run, refusal.message)), refusal.to_json(), 0)

    def refusals(self, run: str) -> list[Refusal]:
        """The run's refused messages, oldest first."""
        found = [read_json(blob)[0] for blob in listed(self.bucket, self.layout.refusals(run)).values()]
        return sorted((Refusal.from_json(content) for content in found if content is not None), key=lambda r: r.at)

    def names(self) -> list[str]:
        """The runs that have a record, from the listing alone (no record is read)."""
        return sorted(name[len(self.layout.runs):-len(".json")] for name in listed(self.bucket, self.layout.runs)
                      if name.endswith(".json") and "/" not in name[len(self.layout.runs):])

    def unknown(self, run: str) -> str:
        """What to say of a run that has no record, with the closest name that has one."""
        return f"no run {run} in {self.layout.environment}" + did_you_mean(run, self.names())

    def all(self) -> dict[str, tuple[RunRecord, int]]:
        records = {}
        for name, blob in listed(self.bucket, self.layout.runs).items():
            if not name.endswith(".json") or "/" in name[len(self.layout.runs):]:
                continue
            content, generation = read_json(blob)
            if content is not None:
                records[content["run"]] = (RunRecord.from_json(content), generation)
        return records
