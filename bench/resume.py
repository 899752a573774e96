"""From a preemption to the resubmitted attempt's first step, in the local loop, in watcher ticks.

A local stack (real Ray head and GPU-pool worker, fake-gcs-server, the functions, and the scheduler
ticking `watch` and `snapshot` every TICK seconds) runs the tiny GRPO recipe. Once a checkpoint has
its manifest, the worker node is stopped (a preemption) and started again at once (a replacement
node ready with no delay, so that what is measured is Ray's and rlops's part, not a node's boot).
Measured from the job's own output, polled here independently of the ticks:

- Ray's detection: from the stop to Ray listing the attempt as failed (Ray's, not rlops's);
- rlops's part: from that failure to the first step the resubmitted attempt prints: the watcher's
  next tick, the resubmission, the attempt's checkpoint gate (which hashes the checkpoints against
  their manifests) and the workload's own start;
- the baseline, in the same run: a fresh attempt's submission to its first step (the same workload
  start, with no failure to notice and nothing to verify).

Usage: python bench/resume.py [TICK_SECONDS]   (default 5, the local scheduler's default)
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RLOPS = str(Path(sys.executable).parent / "rlops")
FIRST_STEP = re.compile(r"^\[rlops\] step=(\d+)", re.M)


def until(condition, what: str, timeout: float = 300.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return found


def main() -> None:
    tick = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    from ray.job_submission import JobSubmissionClient

    from rlops.endpoints import Endpoints
    from rlops.local import processes
    from rlops.local.stack import Stack
    from rlops.spec.load import load_text
    from rlops.state.run_records import RunRecords

    work = Path(tempfile.mkdtemp(prefix="rlops-resume-bench-"))
    (work / "environments").mkdir()
    spec = (REPO / "environments" / "local.yaml").read_text().replace(  # a run long enough to be preempted
        "max_steps: {type: int, min: 1, max: 50, default: 6}", "max_steps: {type: int, min: 1, max: 1000, default: 6}")
    (work / "environments" / "local.yaml").write_text(spec)
    os.chdir(work)
    os.environ.update(RLOPS_ENVIRONMENTS=str(work / "environments"), RLOPS_LOCAL_TICK_SECONDS=str(tick))
    env = load_text(spec, "local", "local.yaml").environment
    stack = Stack("local", env, lambda line: None)
    try:
        stack.up()
        ray = JobSubmissionClient(stack.dashboard_url())
        from rlops.state.bucket import client

        records = RunRecords(client("rlops-local", stack.endpoints(Endpoints())).bucket(env.state.bucket),
                             env.state.prefix, "local")

        def first_step(submission: str) -> bool:
            try:
                return bool(FIRST_STEP.search(ray.get_job_logs(submission)))
            except RuntimeError:  # not submitted yet
                return False

        submitted = time.monotonic()
        subprocess.run([RLOPS, "train", "local", "--recipe", "tiny-arith", "--run", "bench", "--set", "max_steps=1000"],
                       check=True, capture_output=True, env=os.environ)
        until(lambda: first_step("rlops.local.bench.1"), "the first attempt's first step")
        fresh = time.monotonic() - submitted
        until(lambda: (records.get("bench")[0].manifests or None), "a checkpoint with its manifest")
        if str(ray.get_job_status("rlops.local.bench.1").value) != "RUNNING":
            raise SystemExit("the run ended before it could be preempted")
        stopped = time.monotonic()
        processes.stop(stack.processes()["ray-worker-0"])
        stack.up()  # the replacement node, at once
        until(lambda: str(ray.get_job_status("rlops.local.bench.1").value) == "FAILED", "Ray to see the failure")
        failed = time.monotonic()
        until(lambda: first_step("rlops.local.bench.2"), "the resubmitted attempt's first step", every=0.05)
        resumed = time.monotonic()
        record = until(lambda: (r := records.get("bench")[0]) and r.attempts[-1].resume_point and r, "the record")
        point = record.attempts[-1].resume_point
    finally:
        stack.down()
    detection, rlops_part = failed - stopped, resumed - failed
    print(f"tick {tick:.0f}s; a fresh attempt's submission to its first step: {fresh:.1f}s")
    print(f"stop of the node to Ray's FAILED: {detection:.1f}s; FAILED to the resubmitted attempt's first step: "
          f"{rlops_part:.1f}s (resumed from step {point['step']}, verified: {point['verified']}, set aside: "
          f"{json.dumps([a['step'] for a in point['set_aside']])})")
    # One tick at most to notice the failure, then a start no slower than a fresh attempt's plus its gate.
    print(f"failure-to-first-step-in-ticks: {rlops_part / tick:.2f} (goal <= 3)")
    print(f"failure-to-first-step-vs-fresh-start: {rlops_part / fresh:.2f} (goal <= 2)")
    print(f"preemption-to-first-step-in-ticks: {(resumed - stopped) / tick:.2f} (goal <= 4)")


if __name__ == "__main__":
    main()
