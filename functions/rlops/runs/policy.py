"""The watcher's decisions, from what Ray reports. Pure.

A failed attempt is resubmitted only when its nodes went away under it (a Spot preemption, a lost
node): Ray says the job's supervisor died with its node, or a non-head node died while the job ran
(NeMo RL's driver on the head then exits non-zero because its GPU actors are gone); or when it failed
before its checkpoint gate said where it resumes (a full disk, Lustre away, a runtime environment that
did not install): the workload never started, so nothing of the recipe's failed; or when the GPUs did not come
(a capacity failure: the gate's wait ran out, or NeMo RL's own check gave up), after a backoff. A failure of the
training code itself is final, and so is a gate that found the recipe's gold answers earn no reward on its data.
"""

from dataclasses import dataclass

from rlops.checkpoints import gate
from rlops.cloud.ray_jobs import JobView
from rlops.spec.model import ExportPolicy
from rlops.state.run_records import TERMINAL, Attempt, AttemptFailure, FailureKind, RunRecord, RunState

NODE_DEATH_SLACK_MS = 60_000  # the driver notices a lost actor a little after the node is gone
# Ray's job list may not show a job submitted a moment ago; after this, a job the head does not know is lost.
LISTING_GRACE_SECONDS = 60.0
RECENT_SECONDS = 24 * 3600  # an ended run's last checkpoints land at its end: looked at for a day after
FORGOTTEN = "the Ray head no longer knows this job (it restarted?)"
# What NeMo RL raises when its GPU check runs out of tries (nemo_rl/distributed/virtual_cluster.py, v0.4.0-v0.7.0:
# `RayVirtualCluster._init_placement_groups`); the traceback ends the driver's output, which Ray's message carries.
RESOURCE_INSUFFICIENT = "ResourceInsufficientError"
BACKOFF_SECONDS, BACKOFF_LIMIT_SECONDS = 30, 600  # doubled for each capacity failure in a row


@dataclass(frozen=True)
class Transition:
    """What a run's current attempt goes through at one look: its new state, and what follows from it."""

    state: RunState
    ended_at: float | None = None
    failure: AttemptFailure | None = None
    resubmit: bool = False        # a new attempt follows, resuming from the last checkpoint
    reason: str | None = None     # said in the state-changed event


def failure_kind(job: JobView, nodes: list[dict], gate_said: bool = True) -> FailureKind:
    """Why a terminal, unsuccessful job failed; `gate_said`: its
    output has the checkpoint gate's line (the workload started). From the output's last lines, which Ray's failure
    message carries: 'capacity', the GPUs did not come (the gate gave up waiting, or NeMo RL's check raised
    ResourceInsufficientError); 'data', the gate refused the recipe's data, which no retry changes."""
    if job.status == RunState.STOPPED:
        return FailureKind.STOPPED
    if job.error_type == "JOB_SUPERVISOR_ACTOR_DIED":
        return FailureKind.NODE_LOST
    started = job.start_time or 0
    ended = (job.end_time or 0) + NODE_DEATH_SLACK_MS
    for node in nodes:
        if node["state"] != "DEAD" or node.get("is_head_node"):
            continue
        died = node.get("end_time_ms") or 0
        if node["node_id"] == job.driver_node_id or started <= died <= ended:
            return FailureKind.NODE_LOST
    if RESOURCE_INSUFFICIENT in (job.message or "") or gate.gave_up(job.message or ""):
        return FailureKind.CAPACITY
    if gate_said:
        return FailureKind.CODE
    return FailureKind.DATA if gate.REFUSED in (job.message or "") else FailureKind.GATE


RETRIED = {FailureKind.NODE_LOST: "node lost", FailureKind.GATE: "the checkpoint gate failed",  # a new attempt follows
           FailureKind.CAPACITY: "the GPUs did not come"}


def backoff(record: RunRecord) -> int:
    """Seconds the next attempt's gate waits before it looks for the GPUs: none after a lost node or a gate error,
    BACKOFF_SECONDS after a capacity failure, doubled for each one before it in a row, at most BACKOFF_LIMIT_SECONDS."""
    failed = 0
    for attempt in reversed(record.attempts):
        if attempt.failure is None or attempt.failure.kind != FailureKind.CAPACITY:
            break
        failed += 1
    return 0 if not failed else min(BACKOFF_SECONDS * 2 ** (failed - 1), BACKOFF_LIMIT_SECONDS)


def resubmittable(record: RunRecord, kind: FailureKind, resume_budget: int) -> bool:
    return kind in RETRIED and len(record.attempts) <= resume_budget


def seen(record: RunRecord, job: JobView | None, now: float) -> JobView | None:
    """The current attempt's job as the watcher should take it: as listed, or `forgotten`."""
    return job if job is not None else forgotten(record.current, now)


def forgotten(attempt: Attempt, now: float) -> JobView | None:
    """An attempt whose job Ray does not list: a job the head has forgotten (a restarted head keeps no job table)
    is a failed one whose nodes went away (`as_forgotten`); None while it may just not be listed yet."""
    if now - attempt.submitted_at < LISTING_GRACE_SECONDS:
        return None
    return as_forgotten(attempt)


def as_forgotten(attempt: Attempt) -> JobView:
    """The attempt's job as one the head has forgotten: failed, its nodes gone."""
    return JobView(attempt.submission_id, RunState.FAILED, FORGOTTEN, "JOB_SUPERVISOR_ACTOR_DIED")


def needs_nodes(record: RunRecord, job: JobView | None) -> bool:
    """Whether `advance` must know Ray's nodes: only to tell a lost node from a code failure."""
    return job is not None and job.status == RunState.FAILED and record.current.state != RunState.FAILED


def advance(record: RunRecord, job: JobView | None, nodes: list[dict], now: float, resume_budget: int | None) -> \
        Transition | None:
    """The transition of the run's current attempt, given its job as `seen`; None when nothing changed.
    `resume_budget` is the recipe's, None when the spec no longer has the recipe (nothing is resubmitted)."""
    if job is None or job.status == record.current.state:
        return None
    if record.current.state in TERMINAL and record.state in TERMINAL:
        return None
    ended_at = (job.end_time or now * 1000) / 1000
    status = RunState(job.status)
    if status == RunState.SUCCEEDED:
        return Transition(status, ended_at)
    if status not in (RunState.FAILED, RunState.STOPPED):
        return Transition(status)
    kind = failure_kind(job, nodes, gate_said=record.current.resume_point is not None)
    failure = AttemptFailure(kind, job.error_type, (job.message or "")[-500:])
    if resume_budget is not None and resubmittable(record, kind, resume_budget):
        return Transition(status, ended_at, failure, resubmit=True)
    reason = f"{RETRIED[kind]}, resume budget of {resume_budget or 0} spent" if kind in RETRIED else None
    return Transition(status, ended_at, failure, reason=reason)


def exports_due(record: RunRecord, manifested: list[int], export: ExportPolicy) -> list[int]:
    """The steps with a manifest that the recipe's `export:` policy wants copied and that have no export (or a
    failed one: not tried again) yet. `final`: the last checkpoint of a run that succeeded; `every`: every N-th
    checkpoint, counted over the run's manifests."""
    if export.when == "final":
        last = max(manifested, default=None)
        newest = last is not None and last >= (record.last_checkpoint or 0)
        wanted = [last] if newest and last is not None and record.state == RunState.SUCCEEDED else []
    elif export.when == "every" and export.every is not None:  # a valid spec sets both (spec.recipe_rules)
        wanted = sorted(manifested)[export.every - 1::export.every]
    else:
        wanted = []
    return [step for step in wanted if str(step) not in record.exports]


def recent(record: RunRecord, now: float) -> bool:
    """Whether the snapshot tick looks at the run: active, or ended less than a day ago."""
    return record.state not in TERMINAL or now - record.updated_at < RECENT_SECONDS

