"""The `watch` function: a tick brings the environment's run records up to date with Ray.

The decisions are `policy.advance` (pure); this module reads Ray, the job's output and the
checkpoints, writes the records and resubmits what `advance` says to.
"""

import functools
from pathlib import Path

from rlops import waiting as workers_waiting
from rlops.checkpoints import gate
from rlops.cloud.ray_jobs import ACTIVE, JobView, RayError
from rlops.logs import emit
from rlops.reaper.reap import wake
from rlops.runs import jobs, policy, progress
from rlops.sites import Site
from rlops.state.run_records import Attempt, AttemptFailure, HistoryEntry, RunRecord, RunState, new

# NeMo RL prints a few dozen lines a step, its actors any number more: a step's banner the tail no longer shows is
# the one the attempt keeps (`Attempt.banner`).
TAIL_LINES = 2000


def tick(site: Site) -> list[dict]:
    """One look at the environment's Ray jobs (one list call); updated run records; the transitions, as events."""
    by_run: dict[str, dict[int, JobView]] = {}
    for job in map(JobView.of, site.ray.all()):
        if job.meta.get("environment") == site.name:
            by_run.setdefault(job.meta["run"], {})[int(job.meta["attempt"])] = job
    stored = site.records.all()
    events, nodes = [], _Nodes(site)
    # Whose jobs Ray runs now: a job it holds PENDING on a pool that is up waits for them.
    running = sorted(run for run, views in by_run.items()
                     if any(view.status == RunState.RUNNING for view in views.values()))
    for run in sorted(set(by_run) | set(stored)):
        record, generation = stored.get(run, (None, 0))
        attempts = by_run.get(run, {})
        if record is None:  # the train function stopped between submitting and writing the record
            first = attempts[min(attempts)]
            record = new(first.meta, first.submission_id, (first.start_time or 0) / 1000)
        before = record.to_json()
        changes = _advance(site, record, attempts, nodes, [other for other in running if other != run])
        if record.to_json() == before:  # progress too (step, reward, the attempt's step banner), not only states
            continue
        if record.state in policy.TERMINAL:
            record.report = _publish_report(site, record)
        written = site.records.create(record) if generation == 0 else site.records.replace(record, generation)
        if not written:
            emit("INFO", "run record changed during this tick; the next tick will look again", run=run)
            continue
        for change in changes:
            event = {"type": "state-changed", "environment": site.name, "run": run, **change,
                     "step": record.step, "last_checkpoint": record.last_checkpoint,
                     **({"report": record.report} if record.report else {})}
            site.publish(event)
            events.append(event)
    return events


class _Nodes:
    """Ray's nodes, and why the GPU workers are not up, each read at most once a tick and only when needed: to
    tell a lost node from a code failure, or why an attempt that has not trained yet waits."""

    def __init__(self, site: Site):
        self.site = site

    def get(self) -> list[dict]:
        return self._listed

    def waiting(self) -> str | None:
        return self._waiting

    @functools.cached_property
    def _listed(self) -> list[dict]:
        return self.site.ray.nodes()

    @functools.cached_property
    def _waiting(self) -> str | None:
        return self.site.waiting(self.site.pool.read()[0].scaled_down)


def _publish_report(site: Site, record: RunRecord) -> str | None:
    """The ended run's report in the state bucket; a report that cannot be drawn is logged, never blocks the
    record of how the run ended."""
    # Imported here: drawing a report needs the checkpoint listing and its cloud clients, ~0.2 s more of every
    # watch function's cold start, and only a run that ends is drawn.
    from rlops.runs import report_writer  # noqa: PLC0415 cold start, as said above

    try:
        return report_writer.publish(site, record)
    except Exception as error:  # a plot's failure is not the run's
        emit("WARNING", "run report not written", run=record.run, error=f"{type(error).__name__}: {error}"[-300:])
        return None


def _advance(site: Site, record: RunRecord, attempts: dict[int, JobView], nodes: _Nodes,
             others_running: list[str]) -> list[dict]:
    """Bring `record` up to date with Ray; the state changes it went through."""
    now = site.clock.time()
    if record.state == RunState.CANCELLED:
        return _settle_cancelled(site, record, attempts, nodes, now)
    known = {a.attempt for a in record.attempts}
    closed = []
    for number in sorted(set(attempts) - known):  # an attempt submitted by a tick whose record write lost
        closed += _close_superseded(record, attempts, nodes, now)
        record.attempts.append(Attempt(number, attempts[number].submission_id, now))
    current = record.current
    job = policy.seen(record, attempts.get(current.attempt), now)
    recipe = site.env.recipes.get(record.recipe)
    settled = current.state in policy.TERMINAL and record.state in policy.TERMINAL
    text = None
    if job is not None and not settled and job.status != RunState.PENDING and job.start_time:
        text = _update_progress(site, record, current, job, recipe.runner if recipe else "trl")
    transition = policy.advance(record, job, nodes.get() if policy.needs_nodes(record, job) else [], now,
                                recipe.resume_budget if recipe else None)
    waited = closed + _waiting(site, record, job, transition, nodes, text, others_running)
    if transition is None:
        return waited
    if transition.state in policy.TERMINAL and text:
        site.records.save_log(record.run, current.attempt, text)
    current.state = record.state = transition.state
    record.history.append(HistoryEntry(now, current.attempt, transition.state))
    changes = waited + [{"attempt": current.attempt, "state": transition.state,
                         **({"reason": transition.reason} if transition.reason else {})}]
    if transition.ended_at is not None:
        current.ended_at = transition.ended_at
    if transition.failure is not None:
        current.failure = transition.failure
    if transition.resubmit:
        assert transition.failure is not None  # a resubmission follows a failure (policy.advance)
        number = current.attempt + 1
        request = jobs.for_site(site, record.recipe, record.run, record.settings, record.requested_by, number,
                                hold=policy.backoff(record))
        wake(site)  # as a train message does: a pool reaped since the attempt ended comes back for it
        jobs.submit(site, request, record.run)
        record.attempts.append(Attempt(number, request.submission_id, now))
        record.state = RunState.PENDING
        record.history.append(HistoryEntry(now, number, RunState.RESUBMITTED))
        changes.append({"attempt": number, "state": RunState.RESUBMITTED, "reason": transition.failure.kind})
        emit("INFO", f"run resubmitted: {policy.RETRIED[transition.failure.kind]}", run=record.run, attempt=number,
             submission_id=request.submission_id)
    return changes


def _close_superseded(record: RunRecord, attempts: dict[int, JobView], nodes: _Nodes, now: float) -> list[dict]:
    """The record's current attempt, which a later attempt in Ray supersedes (a tick submitted it, then its
    record write lost to another writer, or its function died): ended as Ray says it ended (or, forgotten by a
    restarted head, as lost with its node), so its state, end and failure are kept, never re-derived."""
    current = record.current
    if current.state in policy.TERMINAL and current.ended_at is not None:
        return []
    job = attempts.get(current.attempt) or policy.as_forgotten(current)
    _end(record, current, job, nodes, now)
    return [{"attempt": current.attempt, "state": current.state,
             "reason": "recorded late: a later attempt was submitted"}]


def _settle_cancelled(site: Site, record: RunRecord, attempts: dict[int, JobView], nodes: _Nodes,
                      now: float) -> list[dict]:
    """A cancelled run (`runs/cancel.py`) is never resumed: a job of it that Ray still has pending or running (a
    resubmission by a tick whose record write lost to the cancel, or a stop Ray has not carried out yet) is asked to
    stop again, and each attempt is ended as Ray ended it, with its output kept."""
    known = {a.attempt for a in record.attempts}
    for number in sorted(set(attempts) - known):
        record.attempts.append(Attempt(number, attempts[number].submission_id, now))
    recipe = site.env.recipes.get(record.recipe)
    changes = []
    for attempt in record.attempts:
        job = attempts.get(attempt.attempt) or policy.forgotten(attempt, now)
        if attempt.ended_at is not None or job is None:
            continue
        if job.status in ACTIVE:
            site.ray.stop(job.submission_id)
            continue
        if job.start_time:
            text = _update_progress(site, record, attempt, job, recipe.runner if recipe else "trl")
            if text:
                site.records.save_log(record.run, attempt.attempt, text)
        _end(record, attempt, job, nodes, now)
        changes.append({"attempt": attempt.attempt, "state": attempt.state, "reason": "the run was cancelled"})
    return changes


def _end(record: RunRecord, attempt: Attempt, job: JobView, nodes: _Nodes, now: float) -> None:
    """The attempt ended as Ray says it ended (a job still listed as running counts as failed: it is superseded),
    with its failure's kind."""
    state = RunState(job.status) if job.status in policy.TERMINAL else RunState.FAILED
    attempt.state = state
    attempt.ended_at = (job.end_time or now * 1000) / 1000
    if state != RunState.SUCCEEDED and attempt.failure is None:
        kind = policy.failure_kind(job, nodes.get() if job.status == RunState.FAILED else [],
                                   gate_said=attempt.resume_point is not None)
        attempt.failure = AttemptFailure(kind, job.error_type, (job.message or "")[-500:])
    record.history.append(HistoryEntry(now, attempt.attempt, state))


def _waiting(site: Site, record: RunRecord, job: JobView | None, transition: policy.Transition | None,
             nodes: _Nodes, text: str | None, others_running: list[str]) -> list[dict]:
    """Why an attempt that has not trained yet waits (Ray holds its job PENDING, or a driver RUNNING on the head
    waits for its GPU actors), in one line: why the GPU workers are not up (`Site.waiting`), and what the attempt's
    gate waits for and until when (its last wait line in `text`, the output read this tick), or, with the workers
    up, the runs whose jobs hold them; kept in the record and said in a `waiting` event when it changes (a cleared
    cause is only written to the record). Empty when nothing is to be said."""
    state = transition.state if transition is not None else (job.status if job is not None else record.current.state)
    cause = None
    if state in (RunState.PENDING, RunState.RUNNING) and record.current.first_step is None:
        cause = "; ".join(filter(None, (nodes.waiting(), workers_waiting.in_gate(gate.waits(text or ""))))) or None
        if cause is None and state == RunState.PENDING and others_running:
            cause = workers_waiting.queued_behind(others_running)
    if cause == record.waiting:
        return []
    record.waiting = cause
    if cause is None:
        return []
    site.publish({"type": "waiting", "environment": site.name, "run": record.run, "attempt": record.current.attempt,
                  "cause": cause})
    return [{"attempt": record.current.attempt, "state": state, "reason": f"waiting: {cause}"}]


def _resume_point(site: Site, record: RunRecord, current: Attempt, text: str) -> None:
    """Where the attempt's gate chose to resume (`checkpoints.gate`), once it said; a `resumed` event when the
    attempt resumes from a checkpoint or set one aside."""
    point = progress.resume_point(text)
    if point is None:
        return
    current.started_at = point.pop("at", None)
    current.resume_point = point
    if point["step"] is not None or point["set_aside"]:
        site.publish({"type": "resumed", "environment": site.name, "run": record.run, "attempt": current.attempt,
                      **point})
        emit("INFO", "resume point chosen", run=record.run, attempt=current.attempt, step=point["step"],
             set_aside=point["set_aside"])


def _update_progress(site: Site, record: RunRecord, current: Attempt, job: JobView, runner: str) -> str:
    """Step, reward and checkpoint from the job's output and its checkpoint directory; the output.

    A long run's output is megabytes: once what its beginning says is known (the first step, a
    resume), a tick reads only its end. The whole output is read at the end, to be kept.
    """
    whole = (job.status in policy.TERMINAL or not job.driver_node_id
             or (current.resume_point is None and current.first_step is None)  # the gate's line is near the top
             or (runner == "trl" and current.first_step is None))
    node = job.driver_node_id
    try:
        text = (site.ray.tail(job.submission_id, node, TAIL_LINES) if node and not whole
                else site.ray.logs(job.submission_id))
    except (RuntimeError, RayError) as error:
        # the driver's node is gone, and its logs with it (Ray's SDK: RuntimeError)
        emit("INFO", "job logs unavailable", submission_id=job.submission_id, error=str(error)[-200:])
        text = ""
    if current.resume_point is None:
        _resume_point(site, record, current, text)
    found = progress.from_logs(runner, text, current.epoch, current.banner)
    points = progress.series(runner, text, current.epoch, current.banner)
    if any(points.values()):
        site.records.add_metrics(record.run, current.attempt, lambda old: progress.merged(old, points))
    if found.get("epoch"):
        current.epoch = found["epoch"]
    if found.get("banner"):
        current.banner = found["banner"]
    if whole:
        if found["first_step"] is not None:
            current.first_step = found["first_step"]
            current.first_step_at = current.first_step_at or site.clock.time()
        if found["resumed_from"] is not None:
            current.resumed_from = found["resumed_from"]
    if found["step"] is not None:
        record.step, record.reward = found["step"], found["reward"]
    directory = Path(record.checkpoint_dir)
    if site.checkpoints_here and directory.is_dir():  # look at the checkpoints themselves
        record.last_checkpoint = progress.last_complete_checkpoint(directory)
    elif not site.checkpoints_here and record.manifests:  # what the snapshot scan found complete
        record.last_checkpoint = max(map(int, record.manifests))
    elif runner == "trl" and found["reported_checkpoint"] is not None:  # printed once the save is done
        record.last_checkpoint = found["reported_checkpoint"]
    return text
