"""Preemptions on the local loop's real Ray: a run's GPU-pool node stopped under it (the local stand-in for a Spot
preemption) after a checkpoint, with that checkpoint left whole, corrupted or torn; the watcher resubmits and the
attempt's gate chooses where it resumes. On a stack of this module's own (tests/local_stack.py).
"""

from pathlib import Path

import pytest

from conftest import until
from local_stack import (
    Local,
    jobs_of_run,
    no_planted_token,
)

# One of the two groups of local-stack modules (tests/local_stack.py says why two).
pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("local-stack-b")]


RUN_STEPS = 12  # held after its first checkpoints, so the attempt that resumes has a few steps left to train


def preempted_after_a_checkpoint(local: Local, run: str) -> tuple[Path, int, list[tuple[int, str]]]:
    """A run of the local recipe held (`pause_while`) once checkpoint-4 is complete, its GPU-pool node stopped under
    it while it holds (the local stand-in for a Spot preemption) and the hold lifted for the attempt that resumes;
    its checkpoint directory, its newest complete checkpoint's step, and how the set-aside list of the resumed
    attempt starts: any checkpoint newer than that one, torn (the stop comes between two steps, so usually none)."""
    from ray.job_submission import JobSubmissionClient

    from rlops.local.processes import stop
    from rlops.runs.progress import last_complete_checkpoint

    local.rlops("train", "local", "--recipe", "tiny-arith", "--run", run, "--set", f"max_steps={RUN_STEPS}",
                "--set", "pause_while=hold")
    checkpoints = local.root / ".rlops/local/lustre/checkpoints/tiny-arith" / run
    until(lambda: (checkpoints / "checkpoint-4" / "trainer_state.json").is_file(), "checkpoint 4", timeout=180,
          poll=0.1)
    (checkpoints / "hold").touch()
    client = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    until(lambda: "paused after step=" in client.get_job_logs(jobs_of_run(local, run)[0]), "the run to hold",
          timeout=60, poll=0.2)
    stop(local.registry()["ray-worker-0"])
    (checkpoints / "hold").unlink()
    newest = last_complete_checkpoint(checkpoints)
    assert newest is not None and 4 <= newest < RUN_STEPS
    cut_off = sorted((int(p.name.removeprefix("checkpoint-")) for p in checkpoints.glob("checkpoint-*")
                      if int(p.name.removeprefix("checkpoint-")) > newest), reverse=True)
    return checkpoints, newest, [(step, "torn: its save never finished") for step in cut_off]


def test_a_preempted_run_is_resubmitted_and_resumes_from_its_last_checkpoint(local, first):
    _, saved, cut_off = preempted_after_a_checkpoint(local, "preempted")
    local.rlops("snapshot", "local")  # its checkpoints' manifests: a resume is only from one that verifies
    record = local.tick_until("preempted", lambda r: len(r["attempts"]) == 2)
    assert record["attempts"][0]["failure"]["kind"] == "node-lost"
    assert "RESUBMITTED" in [h["state"] for h in record["history"]]
    # While no GPU-pool node is up, the pending attempt says why, in the record, an event and `status`.
    record = local.tick_until("preempted", lambda r: r["waiting"])
    assert record["waiting"] == "no GPU-pool node is up (stopped, or lost): `rlops up` starts it again"
    status = local.rlops("status", "local", "--run", "preempted").stdout
    assert "preempted: waiting: no GPU-pool node is up (stopped, or lost)" in status
    assert any(e["type"] == "waiting" and e.get("run") == "preempted" for e in local.events())
    up = local.up().stdout  # brings the node back, and says it had stopped
    assert "ray-worker-0 (pid" in up and "had stopped" in up
    # The attempt's gate chooses where it resumes on the node, as the attempt starts.
    record = local.tick_until("preempted", lambda r: r["attempts"][1]["resume_point"])
    point = record["attempts"][1]["resume_point"]
    assert point["step"] == saved and [(a["step"], a["reason"]) for a in point["set_aside"]] == cut_off
    assert record["waiting"] is None and "waiting" not in local.rlops("status", "local", "--run", "preempted").stdout
    record = local.tick_until("preempted", lambda r: r["state"] == "SUCCEEDED")
    second = record["attempts"][1]
    assert second["resumed_from"] == saved and second["first_step"] == saved + 1
    assert record["step"] == RUN_STEPS and record["last_checkpoint"] == RUN_STEPS
    assert len(local.jobs_of("preempted")) == 2
    # The first run's node is gone, and Ray's copy of its output with it; rlops kept one.
    kept = local.rlops("logs", "local", "first")
    assert "[rlops] step=4" in kept.stdout and "the copy kept" in kept.stderr


def test_a_preempted_run_whose_newest_checkpoint_was_corrupted_resumes_from_the_previous_verified_one(local):
    checkpoints, newest, cut_off = preempted_after_a_checkpoint(local, "corrupted")
    local.rlops("snapshot", "local")
    weights = checkpoints / f"checkpoint-{newest}" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped byte, after the manifest was written
    weights.write_bytes(bytes(data))
    local.tick_until("corrupted", lambda r: len(r["attempts"]) == 2)
    local.up()
    point = local.tick_until("corrupted", lambda r: r["attempts"][1]["resume_point"])["attempts"][1]["resume_point"]
    assert point["step"] == newest - 2
    assert [(a["step"], a["reason"]) for a in point["set_aside"][:-1]] == cut_off
    aside = point["set_aside"][-1]
    assert aside["step"] == newest and "does not match its manifest: 1 changed (model.safetensors" in aside["reason"]
    assert (checkpoints / aside["moved_to"] / "model.safetensors").is_file()  # moved aside, not deleted
    said = [e for e in local.events() if e["type"] == "resumed" and e.get("run") == "corrupted"]
    assert [(e["attempt"], e["step"]) for e in said] == [(2, newest - 2)]
    record = local.tick_until("corrupted", lambda r: r["state"] == "SUCCEEDED")
    assert record["attempts"][1]["resumed_from"] == newest - 2 and record["step"] == RUN_STEPS


def test_a_preempted_run_whose_newest_checkpoint_is_torn_sets_it_aside_and_resumes_from_the_previous_one(local):
    checkpoints, newest, cut_off = preempted_after_a_checkpoint(local, "torn")
    (checkpoints / f"checkpoint-{newest}" / "trainer_state.json").unlink()  # its save cut off with the node
    local.rlops("snapshot", "local")  # a torn checkpoint gets no manifest
    local.tick_until("torn", lambda r: len(r["attempts"]) == 2)
    local.up()
    point = local.tick_until("torn", lambda r: r["attempts"][1]["resume_point"])["attempts"][1]["resume_point"]
    assert point["step"] == newest - 2
    assert [(a["step"], a["reason"]) for a in point["set_aside"]] == cut_off + [
        (newest, "torn: its save never finished")]
    record = local.tick_until("torn", lambda r: r["state"] == "SUCCEEDED")
    assert record["attempts"][1]["resumed_from"] == newest - 2 and record["step"] == RUN_STEPS




def test_the_planted_token_is_in_no_job_log_record_or_event(local, first):
    no_planted_token(local, lost={f"rlops.local.{run}.1" for run in ("preempted", "corrupted", "torn")})
