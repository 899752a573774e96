"""Issue 32 on the local loop's real Ray: GPU-pool nodes that join minutes late, longer than NeMo RL's own wait for
its GPUs. The waits are real time (about three minutes), on a stack of this module's own (tests/local_stack.py), so
they run beside the other local-loop modules.
"""

import time
from contextlib import contextmanager

import pytest

from conftest import until
from local_stack import (
    Local,
    gpu_pool_node_joined,
    gpu_pool_node_stopped,
    jobs_of_run,
    no_planted_token,
    ray_nodes,
    trained,
)

# One of the two groups of local-stack modules (tests/local_stack.py says why two).
pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("local-stack-a")]


LATE_JOIN_SECONDS = 90  # issue 32's: longer than NeMo RL's own wait for its GPUs (1 + 2 + ... + 32 = 63 s)
REPLACEMENT_JOIN_SECONDS = 70  # a replacement node slower than that wait too, by a margin


@contextmanager
def gpu_pool_joining_late(local: Local, seconds: int):
    """The module's spec with `local.gpu_pool.join_delay: SECONDS` while the block runs: every GPU-pool worker that
    `rlops up` or a wake starts joins Ray that long after; the spec as it was afterwards."""
    spec = local.root / "environments" / "local.yaml"
    original = spec.read_text()
    spec.write_text(original.replace("    cpus_per_worker: 1\n",
                                     f"    cpus_per_worker: 1\n    join_delay: {seconds}s\n"))
    try:
        yield
    finally:
        spec.write_text(original)


def test_a_run_driven_as_nemo_rl_drives_one_waits_for_a_late_gpu_node_then_for_a_slow_replacement(local):
    """Issue 32 on the local Ray: a run of `tiny-arith-on-head`, whose driver plays NeMo RL's (on the head, its
    environment copied into a training actor on the GPU pool, NeMo RL's 63 s GPU check), submitted while the GPU
    pool's node is down. The node joins 90 s after the submission: NeMo RL alone (the same workload without the
    gate, submitted beside it) fails with ResourceInsufficientError, which the watcher takes as a capacity failure;
    the run's gate waits, `rlops status` says for what and until when, and it trains. Preempted after a checkpoint,
    its replacement node joins 70 s after the new attempt was submitted: that attempt waits in its gate too, resumes
    from that checkpoint and the run SUCCEEDS. The two waits are the test's time (about three minutes)."""
    from ray.job_submission import JobSubmissionClient

    from rlops.cloud.ray_jobs import JobView
    from rlops.runs import policy
    from rlops.runs.progress import last_complete_checkpoint

    run = "late-gpus"
    checkpoints = local.root / ".rlops/local/lustre/checkpoints/tiny-arith-on-head" / run
    dashboard = f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}"
    client = JobSubmissionClient(dashboard)
    gpu_pool_node_stopped(local)
    with gpu_pool_joining_late(local, LATE_JOIN_SECONDS):
        submitted = time.time()
        local.rlops("train", "local", "--recipe", "tiny-arith-on-head", "--run", run,
                    "--set", "max_steps=8", "--set", "pause_while=hold")
        alone = client.submit_job(entrypoint=f"python -m rlops.workloads.trl_grpo --output-dir {local.root / 'alone'} "
                                             "--gpus gpu_pool=1 max_steps=1")
        up = local.up().stdout
        assert f"ray-worker-0: joins Ray in {LATE_JOIN_SECONDS}s" in up, up

        # While the node is on its way the attempt runs (its driver on the head) and its gate says what it waits for.
        record = local.tick_until(run, lambda r: "gate waits" in (r["waiting"] or ""))
        assert record["state"] == "RUNNING" and record["attempts"][0]["resume_point"] is None
        assert record["waiting"].startswith("no GPU-pool node is up: ray-worker-0 was started and joins Ray at about ")
        assert "; the attempt's gate waits for 1 gpu_pool (Ray has 0) until " in record["waiting"]
        assert f"{run}: waiting: {record['waiting']}" in local.rlops("status", "local", "--run", run).stdout

        # NeMo RL alone gave up after its 63 s, before the node came.
        until(lambda: str(client.get_job_status(alone).value) in ("SUCCEEDED", "FAILED"), "NeMo RL alone to give up",
              timeout=LATE_JOIN_SECONDS + 30, poll=0.5)
        info = client.get_job_info(alone)
        output = client.get_job_logs(alone)
        assert str(info.status.value) == "FAILED" and "Retrying placement group creation... 6/6. Next retry in 32" \
            in output and "ResourceInsufficientError: Maximum number of retries reached (6)" in info.message
        assert policy.failure_kind(JobView.of(info), ray_nodes(dashboard), gate_said=True) == "capacity"
        joined = gpu_pool_node_joined(local, timeout=LATE_JOIN_SECONDS + 60)
        assert joined - submitted >= LATE_JOIN_SECONDS and info.end_time / 1000 < joined
        client.delete_job(alone)

        # The gate had its GPU-pool node and the run trains, in an actor on it. It holds after a step past its first
        # checkpoint (which step depends on how fast the steps go; the resume is from the newest complete one).
        until(lambda: (checkpoints / "checkpoint-2" / "trainer_state.json").is_file(), "checkpoint 2", timeout=180,
              poll=0.1)
        (checkpoints / "hold").touch()
        until(lambda: "paused after step=" in client.get_job_logs(jobs_of_run(local, run)[0]), "the run to hold",
              timeout=60, poll=0.2)
        saved = last_complete_checkpoint(checkpoints)
        assert saved is not None and 2 <= saved < 8
        record = local.tick_until(run, lambda r: r["step"] and r["step"] >= saved)
        assert record["waiting"] is None and record["attempts"][0]["first_step"] == 1
        local.rlops("snapshot", "local")  # its manifest: the resume is from a checkpoint that verifies

    # Preempted; the replacement node is slow too.
    with gpu_pool_joining_late(local, REPLACEMENT_JOIN_SECONDS):
        gpu_pool_node_stopped(local)
        record = local.tick_until(run, lambda r: len(r["attempts"]) == 2)
        assert record["attempts"][0]["failure"]["kind"] == "node-lost"
        resubmitted = record["attempts"][1]["submitted_at"]
        (checkpoints / "hold").unlink()
        local.up()
        record = local.tick_until(run, lambda r: "gate waits" in (r["waiting"] or ""))
        assert record["attempts"][1]["resume_point"] is None
        joined = gpu_pool_node_joined(local, timeout=REPLACEMENT_JOIN_SECONDS + 60)
        assert joined - resubmitted >= REPLACEMENT_JOIN_SECONDS
        record = local.tick_until(run, lambda r: r["state"] == "SUCCEEDED", timeout=180)
    second = record["attempts"][1]
    assert second["resume_point"]["step"] == saved and second["resume_point"]["set_aside"] == [], record
    assert second["resumed_from"] == saved and second["first_step"] == saved + 1 and record["step"] == 8
    assert record["waiting"] is None and len(local.jobs_of(run)) == 2



def test_the_planted_token_is_in_no_job_log_record_or_event(local):
    if not local.ray_jobs():  # run alone or before the module's other test: a run of its own for the check to read
        trained(local, "planted", steps=1)
    no_planted_token(local, lost=set())
