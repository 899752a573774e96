"""`rlops logs ENV RUN --follow`: an attempt's output as Ray gets it, until its job ends.

Ray's job API answers with a job's whole output each time; each poll writes only what lies past what was written.
The job's status is read before its output, so the output read once Ray says the job has ended is all of it.
"""

from collections.abc import Callable

from rlops.cloud.ray_jobs import ACTIVE, JobView
from rlops.errors import Failure
from rlops.sites import Site
from rlops.state.run_records import TERMINAL, Attempt

POLL_SECONDS = 1.0


def follow(site: Site, run: str, attempt: Attempt, write: Callable[[str], None],
           interval: float = POLL_SECONDS) -> str:
    """Write the attempt's output, each part once, until its job has ended; how it ended (Ray's status, or the
    record's when Ray no longer knows the job, whose output is then the copy the watcher kept)."""
    written = 0
    while True:
        found = site.ray.find(attempt.submission_id)
        if found is None:
            recorded = _recorded(site, run, attempt.attempt)
            if recorded.state in TERMINAL:
                kept = site.records.log(run, attempt.attempt) if not written else None
                if kept:
                    write(kept)
                return recorded.state
        else:
            status = JobView.of(found).status
            try:
                text = site.ray.logs(attempt.submission_id)
            except RuntimeError:  # the driver's node went away, and its output with it (Ray's SDK: RuntimeError)
                text = ""
            if len(text) > written:
                write(text[written:])
                written = len(text)
            if status not in ACTIVE:
                return status
        site.clock.sleep(interval)


def _recorded(site: Site, run: str, number: int) -> Attempt:
    record, _ = site.records.get(run)
    if record is None:  # removed while its output was followed (the environment destroyed)
        raise Failure(site.records.unknown(run))
    return next(a for a in record.attempts if a.attempt == number)
