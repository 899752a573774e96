"""Ray's job table in simulated time, for the control plane's tests: jobs submitted through rlops's own submission,
each started, printing and ending on a script, reported as Ray's job API reports them (status, error type, start and
end times in ms, the job's output, the gate's `[rlops-resume]` line first), and the nodes that joined.

A stop is Ray's `stop_job`: True for a pending or running job, False for one that has ended, a 404 for an id Ray
does not know; the job ends STOPPED `stop_seconds` later (Ray's supervisor sends SIGTERM, then SIGKILL after
RAY_JOB_STOP_WAIT_TIME_S), with its output up to then.
"""

import json
from types import SimpleNamespace


class Clock:
    """A simulated `rlops.clock.Clock`: `now` moves only when a test sets it or something sleeps."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    monotonic = time

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SimulatedRay:
    def __init__(self, clock: Clock, stop_seconds: float = 0.0):
        self.clock, self.jobs, self.scripts, self.node_starts = clock, {}, {}, []
        self.stop_seconds, self.stopped, self.stops = stop_seconds, {}, []

    def script(self, submission_id: str, start: float, steps: list[tuple[float, int]], end: float,
               status: str = "SUCCEEDED", error_type: str | None = None, resumed: int | None = None,
               runner: str = "trl") -> None:
        """Times relative to the job's submission. `runner`: whose step lines the job prints, the local recipe's
        (trl) or NeMo RL's grpo.py banners (nemo-rl; rlops.runs.progress says both)."""
        self.scripts[submission_id] = dict(start=start, steps=steps, end=end, status=status, error_type=error_type,
                                           resumed=resumed, runner=runner)

    def submit_once(self, request) -> bool:
        if request.submission_id in self.jobs:
            return False
        assert "rlops.checkpoints.gate" in request.entrypoint and request.runtime_env["py_modules"]
        self.jobs[request.submission_id] = (request, self.clock())
        return True

    def _at(self, submission_id: str) -> tuple[dict, float, float]:
        request, submitted = self.jobs[submission_id]
        return self.scripts[submission_id], submitted, self.clock()

    def _end(self, submission_id: str) -> tuple[float, str, str | None]:
        """When the job ends, with which status and error type: as scripted, or stopped before that."""
        script, submitted, _ = self._at(submission_id)
        ended = submitted + script["end"]
        stopped = self.stopped.get(submission_id)
        if stopped is not None and stopped < ended:
            return stopped, "STOPPED", None
        return ended, script["status"], script["error_type"]

    def _job(self, submission_id: str) -> SimpleNamespace:
        request, submitted = self.jobs[submission_id]
        script, _, now = self._at(submission_id)
        started = submitted + script["start"]
        ended, final, error_type = self._end(submission_id)
        status = final if now >= ended else "PENDING" if now < started else "RUNNING"
        return SimpleNamespace(
            submission_id=submission_id, status=status, message="", metadata=request.metadata,
            error_type=error_type if now >= ended else None, start_time=int(submitted * 1000),
            end_time=int(ended * 1000) if now >= ended else None,
            driver_node_id="node-1" if now >= started else None)

    def all(self) -> list:
        return [self._job(submission_id) for submission_id in self.jobs]

    def find(self, submission_id: str):
        return self._job(submission_id) if submission_id in self.jobs else None

    def stop(self, submission_id: str) -> bool:
        if submission_id not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {submission_id} does not exist.")
        self.stops.append(submission_id)
        if self._job(submission_id).status not in ("PENDING", "RUNNING"):
            return False
        self.stopped.setdefault(submission_id, self.clock() + self.stop_seconds)
        return True

    def logs(self, submission_id: str) -> str:
        script, submitted, now = self._at(submission_id)
        if now < submitted + script["start"]:
            return ""
        now = min(now, self.stopped.get(submission_id, now))  # a stopped job prints nothing after its stop
        point = {"step": script["resumed"], "set_aside": [], "verified": True, "at": submitted + script["start"]}
        lines = ["[rlops-resume] " + json.dumps(point)]
        if script["resumed"] is not None:
            lines.append(f"[rlops] resuming from checkpoint-{script['resumed']}")
        printed = [step for at, step in script["steps"] if submitted + at <= now]
        if script["runner"] == "nemo-rl":
            total = max((step for _, step in script["steps"]), default=0)
            lines += (["===== Epoch 1/1 ====="] if printed else []) + [
                line for step in printed for line in (f"===== Step {step}/{total} =====", "  • Loss: 0.1",
                                                      "  • Avg Reward: 0.5", "  • Total step time: 60.0s")]
        else:
            lines += [f"[rlops] step={step} reward=0.5 loss=0.1 seconds=60.0" for step in printed]
        return "\n".join(lines) + "\n"

    def tail(self, submission_id: str, node: str, lines: int) -> str:
        return self.logs(submission_id)

    def nodes(self) -> list[dict]:
        return [{"node_id": f"node-{i}", "state": "ALIVE", "is_head_node": False, "start_time_ms": int(at * 1000)}
                for i, at in enumerate(self.node_starts) if at <= self.clock()]
