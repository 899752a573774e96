"""The pure parts of training runs: the train message, the job it becomes, progress, the failure policy."""

import json
import re
from pathlib import Path

import pytest

from conftest import ENVIRONMENTS, workload_words
from rlops.cloud import ray_jobs
from rlops.cloud.ray_jobs import JobView
from rlops.runs import jobs, message, policy, progress
from rlops.spec.load import load_or_raise
from rlops.state.run_records import Attempt, AttemptFailure, FailureKind, RunRecord, RunState, UnknownVersion, new

LOCAL = load_or_raise(ENVIRONMENTS / "local.yaml")
H200 = load_or_raise(ENVIRONMENTS / "h200.yaml")


def train(**fields) -> bytes:
    body = {"environment": "local", "recipe": "tiny-arith", "run": "r1", "overrides": {}, "requested_by": "ana"}
    body.update(fields)
    return json.dumps(body).encode()


def settings_of(data: bytes, env=LOCAL) -> dict:
    parsed = message.parse(data)
    return message.settings(parsed, message.recipe_of(parsed, env))


def test_a_message_gets_the_recipes_fixed_overrides_its_defaults_and_its_own_values():
    assert settings_of(train(overrides={"max_steps": 4})) == {"num_generations": 8, "save_steps": 2, "max_steps": 4,
                                                              "seed": 0}


@pytest.mark.parametrize("fields, where", [
    ({"run": "../etc"}, "run:"),
    ({"run": "UPPER"}, "run:"),
    ({"run": "a" * 41}, "run:"),
    ({"run": "x; rm -rf /"}, "run:"),
    ({"overrides": {"save_steps": 1}}, "overrides.save_steps: not an override"),
    ({"overrides": {"max_steps": 0}}, "overrides.max_steps: 0 is below the minimum 1"),
    ({"overrides": {"max_steps": True}}, "overrides.max_steps: expected int, got bool"),
    ({"overrides": {"max_steps": 4.0}}, "overrides.max_steps: expected int"),
    ({"overrides": {"learning_rate": float("nan")}}, "overrides.learning_rate: nan is not a finite number"),
    ({"overrides": {"learning_rate": float("inf")}}, "overrides.learning_rate: inf is not a finite number"),
    ({"overrides": {"$(id)": 1}}, "overrides.$(id)"),
    ({"recipe": "nope"}, "recipe: environment local has no recipe 'nope'"),
    ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ({"requested_by": "a\nb"}, "requested_by:"),
])
def test_a_bad_message_is_poison_and_says_which_field(fields, where):
    with pytest.raises(message.Poison) as caught:
        settings_of(train(**fields))
    assert str(caught.value).startswith(where)


@pytest.mark.parametrize("data, reason", [
    (b"\xff\xfe", "not JSON"), (b"[1]", "expected a JSON object"), (b"[" * 60_000, "nested too deeply"),
    (b" " * (64 * 1024 + 1), "more than the 65536"), (b'{"run": 1' + b"0" * 5000 + b"}", "not JSON"),
])
def test_what_is_not_a_json_object_is_poison(data, reason):
    with pytest.raises(message.Poison, match=reason):
        message.parse(data)


def test_the_submission_id_is_one_per_environment_run_and_attempt():
    assert jobs.submission_id("a-b", "c", 1) != jobs.submission_id("a", "b-c", 1)
    assert jobs.submission_id("local", "r1", 1) != jobs.submission_id("local", "r1", 2)


def test_a_trl_job_runs_the_recipe_module_into_the_runs_checkpoint_dir_and_carries_no_secret():
    recipe = LOCAL.recipes["tiny-arith"]
    request = jobs.request("local", "tiny-arith", recipe, "r1", {"max_steps": 4, "seed": 0}, "ana", 1,
                           "/work/.rlops/local/lustre", {"gpu_pool": 1})
    assert workload_words(request.entrypoint, "/work/.rlops/local/lustre/checkpoints/tiny-arith/r1") == [
        "python", "-m", "rlops.workloads.trl_grpo", "--output-dir",
                                               "/work/.rlops/local/lustre/checkpoints/tiny-arith/r1",
                                               "max_steps=4", "seed=0"]
    assert request.entrypoint_resources == {"gpu_pool": 1} and request.runtime_env == {}
    assert ray_jobs.described(type("Job", (), {"metadata": request.metadata}))["run"] == "r1"


def test_a_nemo_rl_job_is_the_seeds_command_with_lustre_paths_and_the_runtime_env_override():
    recipe = H200.recipes[next(iter(H200.recipes))]
    request = jobs.request("h200", "grpo", recipe, "run-7", {"grpo.max_num_steps": 20, "policy.x": "a b;c"}, "ana",
                           2, "/lustre", actors=jobs.actor_env(H200, recipe))
    words = workload_words(request.entrypoint, f"{recipe.checkpoint_root}/run-7")
    assert words[:3] == ["cd", "/opt/nemo-rl", "&&"]  # the configs' relative paths are relative to the repository
    assert words[3:9] == ["uv", "run", "python", recipe.entrypoint, "--config", recipe.config]
    assert f'checkpointing.checkpoint_dir="{recipe.checkpoint_root}/run-7"' in words
    assert f'policy.model_name="{recipe.model}"' in words
    assert 'policy.x="a b;c"' in words  # one argument, whatever it contains
    # Every attempt of the run logs into one W&B run (issue 32: each attempt started a new one).
    run_id = jobs.wandb_run_id("h200", "run-7")
    assert request.runtime_env == {"env_vars": {**jobs.actor_env(H200, recipe), "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                                "WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow",
                                                "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "10"}}
    first = jobs.request("h200", "grpo", recipe, "run-7", {}, "ana", 1, "/lustre")
    assert first.runtime_env["env_vars"]["WANDB_RUN_ID"] == run_id != jobs.wandb_run_id("b200", "run-7")
    assert re.fullmatch(r"[a-z0-9-]{1,64}", run_id)
    assert request.submission_id == "rlops.h200.run-7.2"


TRL_LOG = """[rlops] resuming from checkpoint-4 (max_steps=8, seed=0; HF token file readable; \
HF_TOKEN not in the environment)
[rlops] step=5 reward=0.2500 loss=0.0000
[rlops] metrics step=5 {"entropy":0.61,"completions/mean_length":7.5}
[rlops] checkpoint step=6
[rlops] step=6 reward=0.5000 loss=0.1000
[rlops] metrics step=6 {"entropy":0.58,"completions/mean_length":7.25}
"""
def nemo_output(epochs: int, batches: int, max_steps: int, saves_every: int, stop_after: int) -> str:
    """What NeMo RL's grpo_train (v0.4.0/v0.5.0 grpo.py) prints, by its own format strings, until the
    banner of step `stop_after` (whose reward is not printed yet)."""
    lines, total = [], 0
    for epoch in range(1, epochs + 1):
        lines.append(f"\n{'=' * 25} Epoch {epoch}/{epochs} {'=' * 25}")
        for current in range(1, batches + 1):
            total += 1
            lines.append(f"\n{'=' * 25} Step {current}/{min(batches, max_steps)} {'=' * 25}")
            if total == stop_after:
                return "\n".join(lines)
            if total % saves_every == 0:
                lines.append(f"Saving checkpoint for step {total}...")
            lines += ["\n📊 Training Results:", f"  • Loss: {-total / 1000:.4f}", "  • Generation KL Error: 0.0010",
                      f"  • Avg Reward: {total / 100:.4f}", "\n⏱️  Timing:", f"  • Total step time: {10 + total:.2f}s"]
            if total % saves_every == 0:
                lines.append(f"  • checkpointing: {total / 10:.2f}s ({total / (10 + total):.1f}%)")
            lines.append(f"  • policy_training: {5.0:.2f}s (50.0%)")
    return "\n".join(lines)


def test_progress_is_read_from_what_each_runner_prints():
    assert progress.from_logs("trl", TRL_LOG) == {"step": 6, "reward": 0.5, "first_step": 5, "resumed_from": 4,
                                                  "reported_checkpoint": 6}
    # Each step moves the step; the save line of step 10 is printed before the save and is not a checkpoint.
    assert progress.from_logs("nemo-rl", nemo_output(1, 50, 20, 10, stop_after=13)) == {
        "step": 12, "reward": 0.12, "first_step": 1, "resumed_from": None, "reported_checkpoint": None, "epoch": 1,
        "banner": {"step": 13, "rewarded": False}}  # step 13's banner, for the next tick (issue 32, 5)
    # The step banner counts within an epoch; the global step goes on across epochs.
    assert progress.from_logs("nemo-rl", nemo_output(3, 4, 100, 5, stop_after=11))["step"] == 10
    whole = nemo_output(3, 4, 100, 5, stop_after=11)
    assert progress.from_logs("nemo-rl", whole)["epoch"] == 3
    tail = whole.split("Epoch 3/3")[1]  # what a later tick reads: the epoch comes from the last one
    assert progress.from_logs("nemo-rl", tail, epoch=3)["step"] == 10
    assert progress.from_logs("trl", "Runtime env is setting up.")["step"] is None


def test_a_checkpoint_counts_only_once_complete(tmp_path: Path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-4").mkdir()  # being written: no trainer_state.json yet
    assert progress.last_complete_checkpoint(tmp_path) == 2
    nemo = tmp_path / "nemo"
    for name in ("step_10", "tmp_step_20", "old_step_5", "step_30"):
        for part in ("training_info.json", "config.yaml", "train_dataloader.pt", "policy/weights"):
            if name == "step_30" and part == "train_dataloader.pt":
                continue  # the loop writes it last
            (nemo / name / part).parent.mkdir(parents=True, exist_ok=True)
            (nemo / name / part).write_text("{}")
    assert progress.last_complete_checkpoint(nemo) == 10
    assert progress.last_complete_checkpoint(tmp_path / "missing") is None


def job(status="FAILED", error_type="JOB_ENTRYPOINT_COMMAND_FAILED", start=1000, end=5000, driver="n1", message=""):
    return JobView("rlops.e.r.1", status, message, error_type, start, end, driver)


def node(node_id, state="ALIVE", end=0, head=False):
    return {"node_id": node_id, "state": state, "end_time_ms": end, "is_head_node": head}


def test_a_failure_is_a_lost_node_only_when_ray_or_the_nodes_say_so():
    alive = [node("h", head=True), node("n1")]
    assert policy.failure_kind(job(), alive) == "code"
    assert policy.failure_kind(job(error_type="JOB_SUPERVISOR_ACTOR_DIED"), alive) == "node-lost"
    assert policy.failure_kind(job(), [node("n1", "DEAD", end=4000)]) == "node-lost"  # the driver's node
    assert policy.failure_kind(job(driver="h"), [node("h", head=True), node("gpu", "DEAD", end=4500)]) == "node-lost"
    assert policy.failure_kind(job(driver="h"), [node("gpu", "DEAD", end=500)]) == "code"  # died before the job
    assert policy.failure_kind(job(driver="h"), [node("h", "DEAD", end=4000, head=True)]) == "code"
    assert policy.failure_kind(job(status="STOPPED"), alive) == "stopped"


def test_resubmission_stays_within_the_resume_budget():
    record = run_record("FAILED", "RUNNING")
    assert policy.resubmittable(record, "node-lost", 2)
    assert not policy.resubmittable(record, "node-lost", 1)
    assert not policy.resubmittable(record, "code", 5)


def run_record(*attempt_states: str, state: str | None = None, submitted_at: float = 0.0,
               gate_said: bool = True) -> RunRecord:
    attempts = [Attempt(number, f"rlops.e.r.{number}", submitted_at, attempt_state)
                for number, attempt_state in enumerate(attempt_states, 1)]
    if gate_said:  # the attempt's checkpoint gate printed where it resumes: the workload started
        attempts[-1].resume_point = {"step": None, "set_aside": [], "verified": True}
    return RunRecord("e", "r", "run", "tests", {}, "/lustre/r", submitted_at, submitted_at, attempts, [],
                     state or attempt_states[-1])


ALIVE = [node("h", head=True), node("n1")]


@pytest.mark.parametrize("before, seen, budget, expected", [
    # (attempt states before, the job as Ray lists it, the recipe's resume budget, the transition)
    (("PENDING",), job("PENDING"), 2, None),                                   # nothing new
    (("PENDING",), job("RUNNING"), 2, policy.Transition("RUNNING")),
    (("RUNNING",), job("SUCCEEDED", end=9000), 2, policy.Transition("SUCCEEDED", 9.0)),
    (("RUNNING",), job("FAILED", message="x" * 600), 2,                         # the code failed: final
     policy.Transition("FAILED", 5.0, AttemptFailure("code", "JOB_ENTRYPOINT_COMMAND_FAILED", "x" * 500))),
    (("RUNNING",), job("FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED"), 2,    # its node went away: resume
     policy.Transition("FAILED", 5.0, AttemptFailure("node-lost", "JOB_SUPERVISOR_ACTOR_DIED", ""), resubmit=True)),
    (("FAILED", "FAILED", "RUNNING"), job("FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED"), 2,  # budget spent
     policy.Transition("FAILED", 5.0, AttemptFailure("node-lost", "JOB_SUPERVISOR_ACTOR_DIED", ""),
                       reason="node lost, resume budget of 2 spent")),
    (("RUNNING",), job("FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED"), None,  # the recipe left the spec
     policy.Transition("FAILED", 5.0, AttemptFailure("node-lost", "JOB_SUPERVISOR_ACTOR_DIED", ""),
                       reason="node lost, resume budget of 0 spent")),
    (("RUNNING",), job("STOPPED"), 2,                                           # stopped by someone: final
     policy.Transition("STOPPED", 5.0, AttemptFailure("stopped", "JOB_ENTRYPOINT_COMMAND_FAILED", ""))),
    (("SUCCEEDED",), job("FAILED"), 2, None),                                   # an ended run stays ended
])
def test_the_watcher_decides_each_transition_from_what_ray_says(before, seen, budget, expected):
    assert policy.advance(run_record(*before), seen, ALIVE, now=100.0, resume_budget=budget) == expected


def test_a_failure_before_the_checkpoint_gate_said_is_retried_within_the_budget_never_final_as_code():
    """Issue 34, 6: a gate error (a full disk, Lustre away, a runtime env that did not install) was classed
    "code", which is final, though the recipe's code never ran."""
    assert policy.failure_kind(job(), ALIVE, gate_said=False) == "gate"
    transition = policy.advance(run_record("RUNNING", gate_said=False), job("FAILED"), ALIVE, 100.0, 2)
    assert transition.resubmit and transition.failure.kind == "gate"
    spent = policy.advance(run_record("FAILED", "FAILED", "RUNNING", gate_said=False), job("FAILED"), ALIVE, 100.0, 2)
    assert not spent.resubmit and spent.reason == "the checkpoint gate failed, resume budget of 2 spent"


def test_a_job_missing_from_rays_list_is_waited_for_then_taken_as_lost_with_its_node():
    young, old = run_record("PENDING", submitted_at=1000.0), run_record("RUNNING", submitted_at=1000.0)
    assert policy.seen(young, None, now=1000.0 + policy.LISTING_GRACE_SECONDS - 1) is None  # not listed yet
    forgotten = policy.seen(old, None, now=1000.0 + policy.LISTING_GRACE_SECONDS + 1)  # the head restarted
    assert (forgotten.status, forgotten.message) == ("FAILED", policy.FORGOTTEN)
    transition = policy.advance(old, forgotten, [], now=2000.0, resume_budget=1)
    assert transition.resubmit and transition.failure.kind == "node-lost" and transition.ended_at == 2000.0
    listed = job("RUNNING")
    assert policy.seen(old, listed, now=5000.0) is listed


def test_rays_nodes_are_asked_for_only_to_tell_a_lost_node_from_a_code_failure():
    assert policy.needs_nodes(run_record("RUNNING"), job("FAILED"))
    assert not policy.needs_nodes(run_record("FAILED"), job("FAILED"))  # told already
    assert not any(policy.needs_nodes(run_record("RUNNING"), job(status)) for status in ("SUCCEEDED", "STOPPED",
                                                                                             "RUNNING"))
    assert not policy.needs_nodes(run_record("RUNNING"), None)
    # With the nodes: a code failure on a node that died in the job's window is a lost node.
    died = [node("h", head=True), node("n2", "DEAD", end=4500)]
    assert policy.advance(run_record("RUNNING"), job("FAILED"), died, 100.0, 1).resubmit


def test_the_per_step_series_is_read_from_what_each_runner_prints():
    nemo = progress.series("nemo-rl", nemo_output(2, 4, 100, 3, stop_after=99))
    assert nemo["steps"][0] == [1, 0.01, -0.001, 11.0] and nemo["steps"][-1] == [8, 0.08, -0.008, 18.0]
    assert nemo["saves"] == [[3, 0.3], [6, 0.6]]
    trl = progress.series("trl", "[rlops] step=1 reward=0.2500 loss=0.1000 seconds=0.500\n"
                                 "[rlops] checkpoint step=2 seconds=1.250\n[rlops] step=2 reward=0.5000 loss=0.0000\n")
    assert trl == {"steps": [[1, 0.25, 0.1, 0.5], [2, 0.5, 0.0, None]], "saves": [[2, 1.25]], "metrics": []}
    assert progress.series("trl", TRL_LOG)["metrics"] == [[5, {"entropy": 0.61, "completions/mean_length": 7.5}],
                                                          [6, {"entropy": 0.58, "completions/mean_length": 7.25}]]


def test_the_local_recipes_metrics_line_carries_every_number_trl_logged_and_the_step_line_is_unchanged():
    """Issue 39, 4: TRL logs entropy, completion lengths, clip ratios, grad norm, reward std...; the recipe prints
    them on a line of their own, rounded, which `series` keeps and the step line's readers do not see."""
    from rlops.workloads.trl_grpo import metrics_line

    logs = {"loss": 0.0123, "reward": 0.25, "grad_norm": 0.12345678901234567, "entropy": 2.0,
            "completions/mean_length": 8.0, "clip_ratio/region_mean": 0.0, "reward_std": 1.234567890123e-07,
            "num_tokens": 123456789.0, "epoch": 0.04, "flag": True, "note": "text"}
    line = f"[rlops] metrics step=3 {metrics_line(logs)}"
    assert line == ('[rlops] metrics step=3 {"clip_ratio/region_mean":0.0,"completions/mean_length":8.0,'
                    '"entropy":2.0,"epoch":0.04,"grad_norm":0.123457,"num_tokens":123457000.0,'
                    '"reward_std":1.23457e-07}')
    text = "[rlops] step=3 reward=0.2500 loss=0.0123 seconds=1.500\n" + line + "\n"
    assert progress.series("trl", text)["metrics"] == [[3, json.loads(line.split(" ", 3)[3])]]
    assert progress.from_logs("trl", text) == progress.from_logs("trl", text.splitlines()[0])
    # A tail that cuts the line short keeps what it can read and drops the rest.
    assert progress.series("trl", text[:-20])["metrics"] == []
    assert progress.series("trl", line[5:])["metrics"] == []


def test_a_long_runs_metrics_are_kept_within_their_own_smaller_bound():
    series = None
    for start in range(1, 10_001, 500):
        series = progress.merged(series, {"steps": [[s, 0.5, 0.0, 1.0] for s in range(start, start + 500)],
                                          "metrics": [[s, {f"m{i}": s / 3 for i in range(20)}]
                                                      for s in range(start, start + 500)]})
    kept = [point[0] for point in series["metrics"]]
    assert len(kept) <= progress.SERIES_LIMIT // 8 and len(json.dumps(series["metrics"])) < 300_000
    assert kept[-progress.RECENT:] == list(range(10_001 - progress.RECENT, 10_001)) and kept[0] <= 64
    assert len(series["steps"]) > len(kept) and series["saves"] == []


def test_a_10000_step_series_stays_bounded_and_keeps_its_newest_steps_whole():
    import json

    series = None
    for start in range(1, 10_001, 500):  # as ticks add what each tail shows
        series = progress.merged(series, {"steps": [[s, s / 10_000, 0.0, 1.0] for s in range(start, start + 500)],
                                          "saves": [[s, 2.0] for s in range(start, start + 500, 100)]})
    steps = [point[0] for point in series["steps"]]
    assert len(steps) <= progress.SERIES_LIMIT and len(json.dumps(series)) < 200_000
    assert steps[-progress.RECENT:] == list(range(10_001 - progress.RECENT, 10_001)) and steps == sorted(steps)
    assert steps[0] <= 4, "the beginning of the curve is kept"


def test_a_run_record_round_trips_its_versioned_json_and_refuses_a_newer_version():
    record = new({"environment": "e", "recipe": "r", "run": "one", "requested-by": "tests", "settings": '{"a": 1}',
                  "checkpoint-dir": "/lustre/one", "attempt": "1"}, "rlops.e.one.1", 100.0)
    record.current.failure = AttemptFailure("node-lost", "JOB_SUPERVISOR_ACTOR_DIED", "gone")
    record.manifests["4"] = {"object": "o", "digest": "d"}
    stored = json.loads(json.dumps(record.to_json()))
    assert stored["version"] == 1 and stored["attempts"][0]["failure"]["kind"] == "node-lost"
    assert RunRecord.from_json(stored) == record
    unversioned = {k: v for k, v in stored.items() if k != "version"}  # written before records had versions
    assert RunRecord.from_json(unversioned) == record
    with pytest.raises(UnknownVersion, match="version 2; this rlops reads up to 1"):
        RunRecord.from_json({**stored, "version": 2})
    loaded = RunRecord.from_json(stored)  # states and failure kinds read back as the enums, not strings
    assert loaded.state is RunState.PENDING and loaded.history[0].state is RunState.PENDING
    assert loaded.current.state is RunState.PENDING and loaded.current.failure.kind is FailureKind.NODE_LOST
    with pytest.raises(UnknownVersion, match="attempt says 'node-vanished', which this rlops does not know"):
        RunRecord.from_json({**stored, "attempts": [{**stored["attempts"][0], "failure": {
            **stored["attempts"][0]["failure"], "kind": "node-vanished"}}]})
    with pytest.raises(UnknownVersion, match="run record 'one' says 'PAUSED'"):
        RunRecord.from_json({**stored, "state": "PAUSED"})


def test_the_export_policy_asks_for_the_final_or_every_nth_checkpoint_once():
    from rlops.spec.model import ExportPolicy

    final, every = ExportPolicy(when="final"), ExportPolicy(when="every", every=2)
    running, done = run_record("RUNNING"), run_record("SUCCEEDED")
    done.last_checkpoint = 8
    assert policy.exports_due(running, [2, 4, 6], final) == []       # not before the run succeeded
    assert policy.exports_due(done, [2, 4, 6], final) == []          # its last checkpoint has no manifest yet
    assert policy.exports_due(done, [2, 4, 6, 8], final) == [8]
    assert policy.exports_due(running, [2, 4, 6, 8, 10], every) == [4, 8]
    running.exports["4"] = {"error": "pruned before its export"}      # tried once, said, not tried every tick
    assert policy.exports_due(running, [2, 4, 6, 8, 10], every) == [8]
    assert policy.exports_due(done, [2, 4, 6, 8], ExportPolicy()) == []



def test_a_local_recipe_driven_from_the_head_waits_in_its_gate_and_asks_ray_for_no_resource():
    """Issue 32, 6: `driver: head` plays NeMo RL's driver on the local stack: no entrypoint resource (the driver runs
    on the CPU-only head as on GKE), the gate waits for a GPU-pool node's resource, the workload asks for it, and the
    job carries what NeMo RL's jobs carry (one W&B run, NeMo RL's retries raised behind the gate)."""
    recipe = LOCAL.recipes["tiny-arith-on-head"]
    gpus = jobs.pool_gpus(LOCAL, recipe)
    assert gpus == ("gpu_pool", 1) and jobs.pool_gpus(LOCAL, LOCAL.recipes["tiny-arith"]) is None
    request = jobs.request("local", "tiny-arith-on-head", recipe, "r1", {"max_steps": 4}, "ana", 2, "/l",
                           {"gpu_pool": 1}, gpus=gpus, hold=60)
    gate_words = request.entrypoint.split(" && ")[0].split()
    assert gate_words[gate_words.index("--wait-for") + 1:][:3] == ["gpu_pool=1", "--wait-seconds", "300"]
    assert gate_words[gate_words.index("--hold") + 1] == "60"
    assert workload_words(request.entrypoint) == ["python", "-m", "rlops.workloads.trl_grpo", "--output-dir",
                                                  "/l/checkpoints/tiny-arith-on-head/r1", "--gpus", "gpu_pool=1",
                                                  "max_steps=4"]
    assert request.entrypoint_resources == {}
    assert request.runtime_env["env_vars"]["NRL_VIRTUAL_CLUSTER_MAX_RETRIES"] == "10"
    assert "--hold" not in jobs.request("local", "tiny-arith-on-head", recipe, "r1", {}, "ana", 1, "/l",
                                        gpus=gpus).entrypoint


def test_progress_is_read_through_rays_prefix_on_an_actors_lines():
    """The local recipe trains in a Ray actor when it plays NeMo RL's driver: log_to_driver prefixes each line
    (colored, with the node's address when it is another's: ray/_private/worker.py print_worker_logs)."""
    prefixed = "\n".join(("\x1b[36m(GpuPoolActor pid=7)\x1b[0m " if number % 2
                          else "(GpuPoolActor pid=7, ip=10.0.0.2) ") + line
                         for number, line in enumerate(TRL_LOG.splitlines()))
    assert progress.from_logs("trl", prefixed) == progress.from_logs("trl", TRL_LOG)
    assert progress.series("trl", prefixed) == progress.series("trl", TRL_LOG)
    assert progress.from_logs("trl", "(GpuPoolActor) [rlops] step=3 reward=1.0")["step"] is None  # no pid: not Ray's


def test_the_drivers_last_line_gives_the_last_step_when_the_actors_last_lines_never_reached_it():
    """Ray forwards an actor's lines to the driver asynchronously; a driver that exits as its actor returns can
    lose the last ones. Its own `done step=N` line still says where the run ended, and never goes back."""
    lost = "(GpuPoolActor pid=7) [rlops] step=5 reward=0.5\n[rlops] done step=8\n"
    assert progress.from_logs("trl", lost)["step"] == 8 and progress.from_logs("trl", lost)["reward"] == 0.5
    assert progress.from_logs("trl", "[rlops] step=9 reward=1.0\n[rlops] done step=8\n")["step"] == 9


GAVE_UP = ('Job entrypoint command failed with exit code 75, last available logs (truncated to 20,000 chars):\n'
           '[rlops-wait] {"resource": "GPU", "have": 8.0, "need": 16.0, "waited": 1800, "until": 1.0, "got": false}\n')
NEMO_GAVE_UP = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
                "Retrying placement group creation... 6/6. Next retry in 32 seconds.\nTraceback (most recent call "
                "last):\n...\nnemo_rl.distributed.virtual_cluster.ResourceInsufficientError: Maximum number of "
                "retries reached (6). Cluster resources may be insufficient")


def test_gpus_that_never_came_are_a_capacity_failure_retried_with_a_growing_backoff_never_code():
    """Issue 32, 1: NeMo RL's ResourceInsufficientError after the gate let the workload start, or the gate's own wait
    running out: the cluster lacked the GPUs, so the attempt is retried within the resume budget, each retry's gate
    backing off longer."""
    assert policy.failure_kind(job(message=NEMO_GAVE_UP), ALIVE, gate_said=True) == "capacity"
    assert policy.failure_kind(job(message=GAVE_UP), ALIVE, gate_said=False) == "capacity"
    assert policy.failure_kind(job(message=GAVE_UP.replace('"got": false', '"got": true')), ALIVE, False) == "gate"
    assert policy.failure_kind(job(message=NEMO_GAVE_UP, error_type="JOB_SUPERVISOR_ACTOR_DIED"), ALIVE) == "node-lost"
    transition = policy.advance(run_record("RUNNING"), job(message=NEMO_GAVE_UP), ALIVE, 100.0, 2)
    assert transition.resubmit and transition.failure.kind == "capacity"
    spent = policy.advance(run_record("FAILED", "FAILED", "RUNNING"), job(message=NEMO_GAVE_UP), ALIVE, 100.0, 2)
    assert not spent.resubmit and spent.reason == "the GPUs did not come, resume budget of 2 spent"

    def failed(*kinds: str) -> RunRecord:
        record = run_record(*["FAILED"] * len(kinds))
        for attempt, kind in zip(record.attempts, kinds, strict=True):
            attempt.failure = AttemptFailure(kind, None, "")
        return record
    assert [policy.backoff(failed(*kinds)) for kinds in (("node-lost",), ("capacity",), ("capacity", "capacity"),
                                                         ("capacity", "node-lost"), ("node-lost", "capacity"))] == \
        [0, 30, 60, 0, 30]
    assert policy.backoff(failed(*["capacity"] * 8)) == policy.BACKOFF_LIMIT_SECONDS
