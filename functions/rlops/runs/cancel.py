"""`rlops cancel`: a run ended for good at its requester's wish.

The record says CANCELLED first, written with the generation read: from then on no watcher tick resumes the run
(a tick that resubmitted it meanwhile loses its record write, and the next tick stops that job: `watch.py`
`_settle_cancelled`), and a train message for it is a duplicate. Then Ray is asked to stop the current attempt's
job, a `run-cancelled` event is published, and Ray is watched a while until the job has ended. The watcher records
the attempt's end and keeps its output, as for any attempt that ends.
"""

from dataclasses import dataclass

from rlops.cloud.ray_jobs import ACTIVE, JobView
from rlops.errors import Failure
from rlops.logs import emit
from rlops.sites import Site
from rlops.state.run_records import TERMINAL, HistoryEntry, RunState

STOP_WAIT_SECONDS = 30.0  # Ray sends SIGTERM, then SIGKILL 3 s later (RAY_JOB_STOP_WAIT_TIME_S): ended well before
POLL_SECONDS = 0.5
WRITE_TRIES = 5


class UnknownRun(Failure):
    pass


@dataclass(frozen=True)
class Cancellation:
    run: str
    attempt: int
    submission_id: str
    before: str              # the run's state as recorded before (or SUCCEEDED: Ray's, not recorded yet)
    cancelled: bool          # False: the run had already ended, nothing was changed
    job: str | None = None   # the job's status in Ray once the cancel is done (None: Ray does not know the job)


def cancel(site: Site, run: str, requested_by: str) -> Cancellation:
    """Cancel the run, unless it has ended (then say how); UnknownRun when the environment has no such run."""
    for _ in range(WRITE_TRIES):
        record, generation = site.records.get(run)
        if record is None:
            raise UnknownRun(site.records.unknown(run))
        current = record.current
        if record.state in TERMINAL:
            return Cancellation(run, current.attempt, current.submission_id, record.state, cancelled=False)
        found = site.ray.find(current.submission_id)
        job = JobView.of(found) if found is not None else None
        if job is not None and job.status == RunState.SUCCEEDED:  # ended before the watcher's tick recorded it
            return Cancellation(run, current.attempt, current.submission_id, job.status, cancelled=False)
        before, now = record.state, site.clock.time()
        record.state, record.waiting = RunState.CANCELLED, None
        record.history.append(HistoryEntry(now, current.attempt, RunState.CANCELLED))
        if site.records.replace(record, generation):
            break
    else:
        raise Failure(f"the record of run {run} kept changing while it was cancelled; try again")
    if job is not None and job.status in ACTIVE:
        site.ray.stop(job.submission_id)
    site.publish({"type": "run-cancelled", "environment": site.name, "run": run, "attempt": current.attempt,
                  "submission_id": current.submission_id, "state_before": before, "requested_by": requested_by,
                  "at": now})
    emit("INFO", "run cancelled", environment=site.name, run=run, submission_id=current.submission_id,
         requested_by=requested_by)
    return Cancellation(run, current.attempt, current.submission_id, before, cancelled=True,
                        job=_ended(site, job) if job is not None else None)


def _ended(site: Site, job: JobView) -> str | None:
    """The job's status once Ray has ended it, or as it still is after STOP_WAIT_SECONDS; None if Ray forgot it."""
    deadline = site.clock.monotonic() + STOP_WAIT_SECONDS
    status = job.status
    while status in ACTIVE and site.clock.monotonic() < deadline:
        site.clock.sleep(POLL_SECONDS)
        found = site.ray.find(job.submission_id)
        if found is None:
            return None
        status = JobView.of(found).status
    return status
