"""How far along a run is, from its record: the steps it takes (when its settings say), when it started, how long
it has run, and while it runs the time left at its current attempt's pace. `rlops status` and the runs' comparison
show it."""

from dataclasses import dataclass

from rlops.state.run_records import TERMINAL, RunRecord, RunState

# Where a recipe's settings say how many steps a run takes: the local recipe's (TRL) and NeMo RL's key.
TOTAL_STEP_SETTINGS = ("max_steps", "grpo.max_num_steps")


@dataclass(frozen=True)
class Progress:
    total: int | None          # the steps the run takes, when its settings say
    started_at: float | None   # when its first attempt began on a node
    seconds: float | None      # how long it has run since, to its end once it ended
    eta_seconds: float | None  # while running: the steps left at the current attempt's pace so far


def progress(record: RunRecord, now: float) -> Progress:
    total = next((int(record.settings[key]) for key in TOTAL_STEP_SETTINGS if key in record.settings), None)
    started = next((a.started_at for a in record.attempts if a.started_at is not None), None)
    ended = max((a.ended_at for a in record.attempts if a.ended_at), default=None)
    seconds = None if started is None else (ended if record.state in TERMINAL and ended else now) - started
    current, eta = record.current, None
    if record.state == RunState.RUNNING and total and record.step and current.started_at is not None:
        done = record.step - (current.first_step or 1) + 1  # steps this attempt made: a resumed one starts later
        if done > 0:
            eta = max(total - record.step, 0) * (now - current.started_at) / done
    return Progress(total, started, seconds, eta)
