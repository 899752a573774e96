"""The local recipe (TRL's GRPOTrainer on a tiny model, on CPU): its reward gives GRPO something to learn from."""

import subprocess
import sys

import pytest

from rlops.runs import progress
from rlops.workloads import trl_grpo


def test_the_shaped_reward_gives_full_credit_to_the_answer_alone_and_ranks_the_rest():
    exact, trailing, close, far, words = trl_grpo.shaped_reward(["12", "so 3 then 12", "11", "40", "no idea"],
                                                                ["12"] * 5)
    assert exact == trailing == 1.0
    assert 1.0 > close > far > words == 0.0
    digits, letters = trl_grpo.shaped_reward(["99", "a9"], ["12", "12"])
    assert digits > letters, "form counts: a completion of digits beats one with letters"


@pytest.mark.servers
def test_the_local_recipe_learns_its_mean_reward_rises_within_the_demos_steps(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(tmp_path / "run"),
                           "max_steps=40", "num_generations=8", "save_steps=40", "seed=0"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    series = progress.series("trl", done.stdout)
    rewards = [reward for _, reward, _, _ in series["steps"]]
    assert len(rewards) == 40
    # Every other number TRL logs reaches the series, one metrics point per step (names as TRL 0.2x logs them).
    assert [step for step, _ in series["metrics"]] == list(range(1, 41))
    assert {"entropy", "completions/mean_length", "clip_ratio/region_mean", "grad_norm", "reward_std"} <= set(
        series["metrics"][-1][1])
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > 1.6 * first, (first, last)  # 0.18 -> 0.49 here; a reward with nothing to learn stays flat


def test_the_nemo_rl_driver_checks_the_gpus_on_nemo_rls_schedule_then_raises_as_it_does(monkeypatch, capsys):
    """nemo_rl/distributed/virtual_cluster.py (v0.4.0-v0.7.0): NRL_VIRTUAL_CLUSTER_MAX_RETRIES tries (6 unless set),
    2**i seconds after the i-th, then ResourceInsufficientError; GPUs that come during the waits are taken. Ray's
    cluster_resources stands in for a cluster with no GPU-pool node, then one that joins in the third wait."""
    import ray

    from rlops.workloads import nemo_rl_driver

    monkeypatch.delenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", raising=False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    slept = []
    with pytest.raises(nemo_rl_driver.ResourceInsufficientError, match=r"^Maximum number of retries reached \(6\)\."):
        nemo_rl_driver.check("gpu_pool", 1, slept.append)
    assert slept == [1, 2, 4, 8, 16, 32] and sum(slept) == 63
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["Not enough GPUs available. Requested 1 GPUs, but only 0 are available in the cluster.",
                       "Retrying placement group creation... 1/6. Next retry in 1 seconds."]
    assert out[-1] == "Retrying placement group creation... 6/6. Next retry in 32 seconds."

    seen = iter([{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 2.0, "gpu_pool": 1.0}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: next(seen))
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "10")
    slept.clear()
    nemo_rl_driver.check("gpu_pool", 1, slept.append)
    assert slept == [1, 2]
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "0")
    with pytest.raises(ValueError, match="NRL_VIRTUAL_CLUSTER_MAX_RETRIES=0 must be an integer greater than 0"):
        nemo_rl_driver.check("gpu_pool", 1, slept.append)
