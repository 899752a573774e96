"""What `rlops status` shows, read from the state bucket alone: the runs as their records say, the GPU pool's wake
under way, and the refusals of a run's train messages; with `follow`, again each time it changes, until the run has
ended or its message was refused."""

from collections.abc import Iterator
from dataclasses import dataclass

from rlops import waiting
from rlops.runs.policy import TERMINAL
from rlops.runs.train import refusals_shown
from rlops.spec.model import GcpEnvironment, LocalEnvironment
from rlops.state.pool import PoolState
from rlops.state.run_records import Refusal, RunRecord, RunRecords


@dataclass
class StatusView:
    rows: list[RunRecord]
    refusals: list[Refusal]
    now: float
    changed: bool          # since the view before: the one to show
    waking: str | None     # the GPU pool's wake under way, in one line (read when changed)
    done: bool             # every run shown has ended
    never_started: bool    # no record, only refusals: the function refused its message, nothing will come


def views(records: RunRecords, env_name: str, env: LocalEnvironment | GcpEnvironment, run: str | None,
          follow: bool, interval: float, waking: bool = True) -> Iterator[StatusView]:
    """One view, or with `follow` one every `interval` seconds until `run` has ended or was refused (every run's
    view until the caller stops, without `run`); without `waking`, the pool's state is not read."""
    shown = None
    while True:
        now = records.clock.time()
        rows = [record for record, _ in records.all().values() if run in (None, record.run)]
        refusals = refusals_shown(records, run, rows[0] if rows else None) if run else []
        seen = [(r.run, r.state, len(r.attempts), r.step, r.last_checkpoint, r.waiting) for r in rows], refusals
        changed, shown = seen != shown, seen
        line = _waking(records, env_name, env, now) if waking and changed and rows else None
        view = StatusView(rows, refusals, now, changed, line,
                          done=bool(rows) and all(r.state in TERMINAL for r in rows),
                          never_started=not rows and bool(refusals))
        yield view
        if not follow or (run and view.done) or view.never_started:
            return
        records.clock.sleep(interval)


def _waking(records: RunRecords, env_name: str, env: LocalEnvironment | GcpEnvironment, now: float) -> str | None:
    """Which phase the GPU pool's latest wake is in and for how long, as the reaper's last tick measured it (None
    when no wake is under way)."""
    state, _ = PoolState(records.bucket, env.state.prefix, env_name).read()
    wake = state.wakes[-1] if state.wakes else None
    if state.scaled_down or wake is None or wake.done:
        return None
    first = waiting.LOCAL_PHASES if isinstance(env, LocalEnvironment) else waiting.GKE_PHASES
    return "GPU pool " + waiting.wake_line(wake.at, list(wake.phases), now, first + waiting.LATER_PHASES)
