"""The local recipe (TRL's GRPOTrainer on a tiny model, on CPU): its reward gives GRPO something to learn from."""

import subprocess
import sys

from rlops.runs import progress
from rlops.workloads import trl_grpo


def test_the_shaped_reward_gives_full_credit_to_the_answer_alone_and_ranks_the_rest():
    exact, trailing, close, far, words = trl_grpo.shaped_reward(["12", "so 3 then 12", "11", "40", "no idea"], ["12"] * 5)
    assert exact == trailing == 1.0
    assert 1.0 > close > far > words == 0.0
    digits, letters = trl_grpo.shaped_reward(["99", "a9"], ["12", "12"])
    assert digits > letters, "form counts: a completion of digits beats one with letters"


def test_the_local_recipe_learns_its_mean_reward_rises_within_the_demos_steps(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(tmp_path / "run"),
                           "max_steps=40", "num_generations=8", "save_steps=40", "seed=0"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rewards = [reward for _, reward, _, _ in progress.series("trl", done.stdout)["steps"]]
    assert len(rewards) == 40
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > 1.6 * first, (first, last)  # 0.18 -> 0.49 here; a reward with nothing to learn stays flat
