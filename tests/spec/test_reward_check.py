"""Issue 32, 4: a reward that can be earned, checked before GPUs start.

The oracle is NeMo RL's own reading and reward at the recipe's tag (`spec.nemo_rl_reward` cites each line) with
math-verify at the version the tag pins, and GSM8K's published rows (tests/data/README.md says where they are from):
the gold answers of a correct recipe earn the reward, those of h200's seed recipe (the whole worked solution as the
ground truth) earn nothing.
"""

import json
import re
import shlex

import pytest

from conftest import ENVIRONMENTS, REPO
from rlops import cli
from rlops.checkpoints import gate
from rlops.cloud.ray_jobs import JobView
from rlops.runs import jobs, policy
from rlops.spec import nemo_rl
from rlops.spec import nemo_rl_reward as reward
from rlops.spec.load import load, load_or_raise

SAMPLE = REPO / "tests" / "data" / "gsm8k-sample.jsonl"
GSM8K = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
H200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
GEMMA = H200.recipes["gemma3-27b-gsm8k"]
V050 = nemo_rl.tags()["v0.5.0"]


def as_the_seed_had_it(text: str) -> str:
    """h200.yaml as the seed's script sets its data: GSM8K's published files, read as they are."""
    text = re.sub(r"    data_steps:\n(      .*\n)+", "", text)
    return text.replace("/lustre/data/gsm8k/train.jsonl", f"{GSM8K}/train.jsonl").replace(
        "/lustre/data/gsm8k/test.jsonl", f"{GSM8K}/test.jsonl")


def check_data(*extra: str) -> list[str]:
    return ["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "x", "--dry-run", "--check-data", str(SAMPLE),
            *extra]


def test_the_sample_is_gsm8ks_published_shape():
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert len(rows) == 20 and all(set(row) == {"question", "answer"} for row in rows)
    assert all(re.search(r"\n#### -?[0-9,]+$", row["answer"]) for row in rows)


def test_the_reward_is_nemo_rls_math_verify_at_the_version_v050_pins():
    assert reward.math_verify_here() == reward.MATH_VERIFY["v0.5.0"] == "0.8.0"
    solution = json.loads(SAMPLE.read_text().splitlines()[0])["answer"]
    assert solution.endswith("#### 72")
    assert reward.reward(solution, "\\boxed{72}") == 0.0  # the finding: the whole solution never matches
    assert reward.reward("72", "\\boxed{72}") == 1.0
    assert reward.reward("72", "Let's think step-by-step ... so she sold \\boxed{72} clips.") == 1.0
    assert reward.reward("72", "\\boxed{73}") == 0.0
    assert reward.reward("1,080", "\\boxed{1080}") == 1.0  # the final number as the data step keeps it, comma and all
    assert reward.reward(72, "\\boxed{72}") == 0.0  # "\\boxed{" + 72 raises in NeMo RL too, and scores 0.0


def test_h200_as_shipped_earns_its_reward_on_gsm8ks_published_rows(capsys, specs):
    assert cli.main(check_data()) == 0
    out = capsys.readouterr().out
    said = re.search(r"^mean reward ([0-9.]+) over (\d+) rows", out, re.M)
    assert said and float(said[1]) >= 0.99 and said[2] == "20", out
    assert f"as {GSM8K}/train.jsonl publishes them, through the data step gsm8k-final-answer" in out
    assert "\\boxed{ANSWER}" in out and "math-verify 0.8.0" in out
    assert "# rlops train h200 --dry-run: nothing was sent" in out  # then the dry run goes on


def test_a_recipe_whose_gold_answers_score_0_is_refused_with_the_reason_and_an_example(capsys, specs):
    spec = specs / "h200.yaml"
    spec.write_text(as_the_seed_had_it(spec.read_text()))
    assert cli.main(check_data("--samples", "5")) == 2
    captured = capsys.readouterr()
    assert "mean reward 0.000 over 5 rows (0 of 5 earn 1.0)" in captured.out
    assert "nothing was sent" not in captured.out
    assert "refused: a mean below 0.9: the ground truth NeMo RL v0.5.0 builds is the whole `answer` field, a worked " \
           "solution ending in '#### 72', not its final answer 72" in captured.err
    assert "transform gsm8k-final-answer" in captured.err
    assert 'example, row 1: problem "Natalia sold clips' in captured.err
    assert 'answered "\\\\boxed{72}": reward 0.0' in captured.err


def test_check_data_refuses_what_it_cannot_follow_and_a_file_that_is_not_json_lines(capsys, specs, tmp_path):
    assert cli.main(["train", "b200-spot", "--recipe", "qwen25-72b-deepscaler", "--run", "x", "--dry-run",
                     "--check-data", str(SAMPLE)]) == 1
    assert "not checked: rlops follows how NeMo RL v0.4.0, v0.5.0 read and reward data; v0.7.0" in \
           capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n')
    assert cli.main(check_data()[:-1] + [str(broken)]) == 1
    assert "line 2 is a JSON list, not an object" in capsys.readouterr().err
    assert cli.main(check_data("--samples", "0")) == 1


def test_rows_without_the_keys_the_recipe_reads_are_refused_as_nemo_rl_would_fail_to_load_them():
    recipe = GEMMA.model_copy(update={"overrides": {**GEMMA.overrides, "+data.output_key": "solution"}})
    check = reward.check_for(V050, recipe, recipe.default_settings())
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    verdict = reward.score(check, check.sources[0], rows)
    assert not verdict.earnable() and "no row has solution" in verdict.reason() and "KeyError" in verdict.reason()


def test_the_reference_answer_is_gsm8ks_own_and_the_answer_takes_the_prompts_shape():
    assert reward.reference_answer("so 2 + 3 = 5\n#### 1,080") == "1080"  # grade_school_math/dataset.py
    assert reward.reference_answer(" 42 ") == "42" and reward.reference_answer(None) is None
    cot = (V050.root / "examples/prompts/cot.txt").read_text()
    assert reward.answer_shape(cot) == "\\boxed{%s}"
    assert reward.answer_shape((nemo_rl.tags()["v0.7.0"].root / "examples/prompts/gsm8k.txt").read_text()) == \
        "<answer>%s</answer>"
    recipe = GEMMA.model_copy(update={"overrides": {**GEMMA.overrides, "data.prompt_file": "/etc/my_prompt.txt"}})
    with pytest.raises(reward.Unchecked, match="cannot tell how it asks for the answer"):
        reward.check_for(V050, recipe, recipe.default_settings())


def test_the_prompt_files_are_the_tags_own_byte_for_byte():
    import hashlib

    for tag in nemo_rl.tags().values():
        prompts = json.loads((tag.root / "SOURCE.json").read_text())["prompts"]
        assert set(prompts) == tag.prompts and "examples/prompts/cot.txt" in prompts
        assert tag.prompts <= tag.examples
        for path, blob in prompts.items():
            content = (tag.root / path).read_bytes()
            assert hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest() == blob, path


def _gate_data(entrypoint: str) -> dict | None:
    words = shlex.split(entrypoint)
    gate_words = words[:words.index("&&")]
    return json.loads(gate_words[gate_words.index("--data") + 1]) if "--data" in gate_words else None


def test_every_attempt_runs_h200s_data_steps_and_the_check_before_it_waits_for_gpus():
    job = jobs.request("h200", "gemma3-27b-gsm8k", GEMMA, "r1", GEMMA.default_settings(), "me", 1, "/lustre",
                       tag=V050)
    words = shlex.split(job.entrypoint)
    assert words.index("--data") < words.index("--wait-for")
    plan = _gate_data(job.entrypoint)
    assert plan["steps"] == [{"source": f"{GSM8K}/{name}.jsonl", "path": f"/lustre/data/gsm8k/{name}.jsonl",
                              "transform": "gsm8k-final-answer"} for name in ("train", "test")]
    assert [source["role"] for source in plan["check"]["sources"]] == ["train", "validation"]
    assert plan["minimum"] == 0.9 and plan["samples"] == 64
    b200 = load_or_raise(ENVIRONMENTS / "b200-spot.yaml")
    qwen = b200.recipes["qwen25-72b-deepscaler"]
    unchecked = jobs.request("b200-spot", "q", qwen, "r1", qwen.default_settings(), "me", 1, "/lustre",
                             tag=nemo_rl.tag_for(b200.ray.image))
    assert _gate_data(unchecked.entrypoint) is None  # no data step, and a reading rlops does not follow


def _plan_from(text: str, tmp_path, samples: int = 64) -> dict:
    """The gate's plan for h200 read from `text`, with the sample standing for GSM8K's published files and a
    directory of tmp_path for /lustre."""
    spec = tmp_path / "h200.yaml"
    spec.write_text(text.replace(f"{GSM8K}/train.jsonl", str(SAMPLE)).replace(f"{GSM8K}/test.jsonl", str(SAMPLE)))
    recipe = load(spec).environment.recipes["gemma3-27b-gsm8k"]
    return reward.for_job(V050, recipe, recipe.default_settings(),
                          lambda path: jobs.on_lustre(path, str(tmp_path / "lustre")), samples)


def test_the_gate_writes_the_final_numbers_into_lustre_and_scores_the_real_data(tmp_path, capsys):
    plan = _plan_from((ENVIRONMENTS / "h200.yaml").read_text(), tmp_path)
    assert gate.main(["--run-dir", str(tmp_path / "run"), "--manifests", "no_such_module",
                      "--data", json.dumps(plan)]) == 0
    written = [json.loads(line) for line in (tmp_path / "lustre/data/gsm8k/train.jsonl").read_text().splitlines()]
    published = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert [row["question"] for row in written] == [row["question"] for row in published]
    assert [row["answer"] for row in written][:3] == ["72", "10", "5"] and "1,080" in [r["answer"] for r in written]
    lines = capsys.readouterr().out.splitlines()
    said = json.loads(next(line for line in lines if line.startswith(gate.DATA))[len(gate.DATA):])
    assert said["steps"][0] == {"path": str(tmp_path / "lustre/data/gsm8k/train.jsonl"), "rows": 20,
                                "transform": "gsm8k-final-answer"}
    assert [(c["role"], c["mean"], c["count"], c["earnable"]) for c in said["checks"]] == \
        [("train", 1.0, 20, True), ("validation", 1.0, 20, True)]
    assert lines[-1].startswith(gate.PREFIX) and not any(line.startswith(gate.REFUSED) for line in lines)


def test_the_gate_refuses_the_seeds_recipe_in_seconds_and_the_watcher_does_not_retry_it(tmp_path, capsys):
    plan = _plan_from(as_the_seed_had_it((ENVIRONMENTS / "h200.yaml").read_text()), tmp_path, samples=4)
    assert plan["steps"] == []
    assert gate.main(["--run-dir", str(tmp_path / "run"), "--manifests", "no_such_module", "--wait-for", "GPU=16",
                      "--data", json.dumps(plan)]) == gate.DATA_REFUSED  # before the GPU wait: no Ray here
    out = capsys.readouterr().out
    assert gate.PREFIX not in out and gate.WAITING not in out
    refusals = [json.loads(line.removeprefix(gate.REFUSED)) for line in out.splitlines()[-2:]]
    assert [(r["role"], r["mean"], r["count"]) for r in refusals] == [("train", 0.0, 4), ("validation", 0.0, 4)]
    refusal = refusals[0]
    assert "worked solution ending in '#### 72'" in refusal["reason"]
    assert refusal["example"]["response"] == "\\boxed{72}"
    # Ray's failure message carries the output's last lines: the watcher takes the attempt as final.
    job = JobView("rlops.h200.r.1", "FAILED", "Job entrypoint command failed with exit code 65, last available logs "
                  "(truncated to 20,000 chars):\n" + out)
    assert policy.failure_kind(job, [], gate_said=False) == "data"
    assert policy.failure_kind(JobView("j", "FAILED", "exit code 1"), [], gate_said=False) == "gate"
    assert "data" not in policy.RETRIED


def test_validate_keeps_data_steps_on_lustre_and_apart(capsys, specs):
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("path: /lustre/data/gsm8k/test.jsonl", "path: /tmp/test.jsonl").replace(
        "transform: gsm8k-final-answer\n    checkpoint_root", "transform: gsm8k-final-answer\n"
        "      - source: /data/more.jsonl\n        path: /lustre/data/gsm8k/train.jsonl\n"
        "        transform: gsm8k-final-answer\n    checkpoint_root"))
    assert cli.main(["validate", str(spec)]) == 2
    out = capsys.readouterr().out
    assert "recipes.gemma3-27b-gsm8k.data_steps[1].path: /tmp/test.jsonl is not on Lustre (/lustre)" in out
    assert "recipes.gemma3-27b-gsm8k.data_steps[2].path: an earlier data step writes /lustre/data/gsm8k/train.jsonl" \
        in out


def test_a_data_file_that_is_not_json_lines_is_refused_by_the_gate_not_retried(tmp_path, capsys):
    broken = tmp_path / "published.jsonl"
    broken.write_text('{"question": "1+1?", "answer": "1+1=2\\n#### 2"}\n{"question": \n')
    plan = {"steps": [{"source": str(broken), "path": str(tmp_path / "lustre/train.jsonl"),
                       "transform": "gsm8k-final-answer"}], "check": None, "unchecked": None, "samples": 64,
            "minimum": 0.9}
    assert gate.main(["--run-dir", str(tmp_path / "run"), "--data", json.dumps(plan)]) == gate.DATA_REFUSED
    refusal = json.loads(capsys.readouterr().out.splitlines()[-1].removeprefix(gate.REFUSED))
    assert refusal["reason"].startswith(f"{broken}: line 2 is not JSON")
    assert not (tmp_path / "lustre/train.jsonl").exists()
