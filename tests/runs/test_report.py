"""The run report, rendered for real with matplotlib into a temporary directory."""

import json

import pytest

from rlops.runs import readable, report_figures, report_page

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def two_attempts() -> tuple[dict, dict, list]:
    """Attempt 1 loses its node after step 6; attempt 2 resumes from the step-4 checkpoint and redoes 5 and 6."""
    record = {
        "environment": "h200-example", "recipe": "grpo-math", "run": "math-7b", "state": "SUCCEEDED",
        "step": 10, "reward": 0.8, "created_at": T0,
        "attempts": [
            {"attempt": 1, "submission_id": "rlops.h200-example.math-7b.1", "state": "FAILED",
             "submitted_at": T0, "ended_at": T0 + 600, "resumed_from": None, "first_step": 1,
             "failure": {"kind": "node-lost", "message": "node gke-a3 | gone"}},
            {"attempt": 2, "submission_id": "rlops.h200-example.math-7b.2", "state": "SUCCEEDED",
             "submitted_at": T0 + 700, "ended_at": T0 + 1300, "resumed_from": 4, "first_step": 5,
             "failure": None},
        ],
    }
    series = {
        1: {"steps": [[s, 0.1 * s, 1.0 / s, 10.0 + s] for s in range(1, 7)], "saves": [[2, 3.0], [4, 4.0]]},
        2: {"steps": [[s, 0.08 * s, 0.9 / s, 11.0 + s] for s in range(5, 11)], "saves": [[8, 5.0]]},
    }
    checkpoints = [{"step": 2, "bytes": 1_000_000_000, "verified": True},
                   {"step": 4, "bytes": 2_000_000_000, "verified": False},
                   {"step": 8, "bytes": None, "verified": None}]
    return record, series, checkpoints


def test_two_attempts_are_drawn_from_their_own_series_and_tabled(tmp_path):
    record, series, checkpoints = two_attempts()
    result = report_page.write(tmp_path / "a", record, series, checkpoints)

    assert [p.name for p in result.plots] == ["reward.png", "step-time.png", "checkpoints.png", "loss.png"]
    for plot in result.plots:
        data = plot.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5_000, plot

    # The same run renders the same bytes; a run with other numbers renders other bytes, so each image
    # depends on the series and not only on its axes and labels.
    again = report_page.write(tmp_path / "b", record, series, checkpoints)
    changed = {n: {"steps": [[s, -r, 2 * loss, 2 * t] for s, r, loss, t in d["steps"]],
                   "saves": [[s, 3 * t] for s, t in d["saves"]]} for n, d in series.items()}
    other = report_page.write(tmp_path / "c", record, changed, checkpoints)
    for plot, same, different in zip(result.plots, again.plots, other.plots, strict=True):
        assert plot.read_bytes() == same.read_bytes(), plot.name
        assert plot.read_bytes() != different.read_bytes(), plot.name
    assert result.markdown.read_text() == again.markdown.read_text()

    md = result.markdown.read_text()
    for name in ("reward.png", "step-time.png", "checkpoints.png", "loss.png"):
        assert f"({name})" in md
    assert "| attempt | state | submitted | ended | resumed from | failure |" in md
    assert "| 1 | FAILED | 2023-11-14 22:13:20 | 2023-11-14 22:23:20 | - | node-lost: node gke-a3 \\| gone |" in md
    assert "| 2 | SUCCEEDED | 2023-11-14 22:25:00 | 2023-11-14 22:35:00 | 4 | - |" in md

    # Step 10 exists only in attempt 2; step 5 exists in both, and attempt 2 redid it, so its numbers stand.
    steps_table = md[md.index("| step | reward | loss | seconds |"):]
    assert "| 10 | 0.8000 | 0.0900 | 21.00 |" in steps_table
    assert "| 5 | 0.4000 | 0.1800 | 16.00 |" in steps_table
    assert "| 5 | 0.5000 |" not in steps_table

    ckpt_table = md[md.index("| step | size | save seconds | written per second | verified |"):md.index("## Steps")]
    assert "| 2 | 954 MiB | 3.00 | 318 MiB/s | yes |" in ckpt_table
    assert "| 4 | 1.86 GiB | 4.00 | 477 MiB/s | NO |" in ckpt_table
    assert "| 8 | - | 5.00 | - | - |" in ckpt_table
    assert "Cost" not in md and "idle" not in md


def test_resume_line_is_labelled_with_the_lost_attempts_failure():
    record, _, _ = two_attempts()
    first, second = record["attempts"]
    assert report_figures._boundary(second, first) == (5, "attempt 2 resumed from step 4 (node-lost)")
    assert report_figures._boundary({**second, "first_step": None}, first)[0] == 4


def test_a_long_run_is_thinned_evenly_to_200_rows(tmp_path):
    record = {"environment": "e", "recipe": "r", "run": "long", "state": "SUCCEEDED", "step": 10_000,
              "reward": 0.5, "created_at": T0,
              "attempts": [{"attempt": 1, "submission_id": "s", "state": "SUCCEEDED", "submitted_at": T0,
                            "ended_at": T0 + 1, "failure": None, "resumed_from": None, "first_step": 1}]}
    series = {1: {"steps": [[s, s / 10_000, None, 1.5] for s in range(1, 10_001)], "saves": []}}
    md = report_page.write(tmp_path, record, series, []).markdown.read_text()

    table = md[md.index("| step | reward | loss | seconds |"):].splitlines()[2:]
    steps = [int(row.split(" | ")[0].lstrip("| ")) for row in table]
    assert len(steps) == 200
    assert steps[0] == 1 and steps[-1] == 10_000
    assert steps == sorted(set(steps))
    gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
    assert max(gaps) - min(gaps) <= 1  # evenly, not the first 200
    assert "200 of 10000" in md
    assert "| 1 | 0.0001 | - | 1.50 |" in md


def test_a_run_without_rewards_writes_a_page_and_no_reward_plot(tmp_path):
    record = {"environment": "e", "recipe": "r", "run": "fresh", "state": "RUNNING", "step": None,
              "reward": None, "created_at": T0,
              "attempts": [{"attempt": 1, "submission_id": "s", "state": "RUNNING", "submitted_at": T0,
                            "ended_at": None, "failure": None, "resumed_from": None, "first_step": None}]}
    result = report_page.write(tmp_path / "new" / "dir", record, {}, [])

    assert result.plots == []
    assert list(result.markdown.parent.iterdir()) == [result.markdown]
    md = result.markdown.read_text()
    assert "- state: RUNNING" in md and "- last reward: -" in md
    assert "| 1 | RUNNING | 2023-11-14 22:13:20 | - | - | - |" in md
    assert ".png" not in md


def test_idle_before_reaped_and_the_runs_cost(tmp_path):
    record, series, checkpoints = two_attempts()
    ended = record["attempts"][-1]["ended_at"]

    md = report_page.write(tmp_path / "a", record, series, checkpoints,
                      pool={"scaled_down": True, "since": ended + 150},
                      cost="1.50 GPU-hours running").markdown.read_text()
    assert "- idle before reaped: 2.5 min" in md
    assert "- cost: 1.50 GPU-hours running" in md

    for pool in ({"scaled_down": False, "since": ended + 150}, {"scaled_down": True, "since": ended - 1},
                 {"scaled_down": True}, None):
        md = report_page.write(tmp_path / "b", record, series, checkpoints, pool=pool).markdown.read_text()
        assert "idle" not in md, pool


# -- issue 39, 4: metadata, every logged metric, smoothing, comparison, sizes and numbers --------------------------

TRL_METRICS = {"entropy": 0.61234567891234, "completions/mean_length": 7.25, "grad_norm": 1.2345678e-5}


def with_metrics() -> tuple[dict, dict, list]:
    """`two_attempts`, each step also carrying the numbers TRL logs (the local recipe's metrics line)."""
    record, series, checkpoints = two_attempts()
    record.update(requested_by="ana", settings={"max_steps": 10, "learning_rate": 0.003, "note": "a|b"})
    for data in series.values():
        data["metrics"] = [[row[0], {name: value * row[0] for name, value in TRL_METRICS.items()}]
                           for row in data["steps"]]
    return record, series, checkpoints


def test_the_page_carries_the_runs_metadata_and_every_logged_metric(tmp_path):
    record, series, checkpoints = with_metrics()
    about = {"image": "nvcr.io/nvidia/nemo-rl:v0.5.0", "spec commit": "not recorded",
             "W&B": "https://wandb.ai/acme/math/runs/math-7b-1a2b3c4d"}
    result = report_page.write(tmp_path, record, series, checkpoints, about=about)

    names = [p.name for p in result.plots]
    assert names[4:] == ["metric-completions-mean_length.png", "metric-entropy.png", "metric-grad_norm.png"]
    md = result.markdown.read_text()
    head = md[:md.index("## Settings")]
    assert ("- requested by: ana\n- image: nvcr.io/nvidia/nemo-rl:v0.5.0\n- spec commit: not recorded\n"
            "- W&B: https://wandb.ai/acme/math/runs/math-7b-1a2b3c4d\n- state: SUCCEEDED\n") in head
    settings = md[md.index("## Settings"):md.index("![")]
    assert '| learning_rate | 0.003 |\n| max_steps | 10 |\n| note | "a\\|b" |' in settings
    for name in names:
        assert f"![{name[:-4]}]({name})" in md
    # Each metric's last value is the resumed attempt's step 10; min and max over the run; rounded to 4 digits.
    table = md[md.index("## Metrics"):md.index("## Attempts")]
    assert "| entropy | 6.123 | 0.6123 | 6.123 | 10 |" in table
    assert "| grad_norm | 0.0001235 | 1.235e-05 | 0.0001235 | 10 |" in table
    assert "| completions/mean_length | 72.5 | 7.25 | 72.5 | 10 |" in table
    assert "0.61234567" not in md

    # A metric's plot depends on its own numbers.
    series[2]["metrics"][-1][1]["entropy"] = -1.0
    again = report_page.write(tmp_path / "b", record, series, checkpoints, about=about)
    changed = {p.name for p, q in zip(result.plots, again.plots, strict=True) if p.read_bytes() != q.read_bytes()}
    assert changed == {"metric-entropy.png"}


def test_a_record_without_settings_or_metrics_says_so(tmp_path):
    record, series, checkpoints = two_attempts()
    md = report_page.write(tmp_path, record, series, checkpoints).markdown.read_text()
    assert "- requested by: -" in md and "## Settings\n\nnone\n" in md and "## Metrics" not in md


def test_smoothing_is_tensorboards_debiased_moving_average():
    assert report_figures.SMOOTHING == 0.6 and "weight 0.6" in report_figures.SMOOTHED
    # Debiased: a constant stays itself from the first point on, not pulled towards zero.
    assert report_figures.smoothed([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0], abs=1e-12)
    first, second, third = report_figures.smoothed([0.0, 1.0, 1.0])
    assert first == 0.0
    assert abs(second - 0.4 / 0.64) < 1e-12           # (0.6*0 + 0.4*1) / (0.6*0.4 + 0.4)
    assert abs(third - 0.64 / 0.784) < 1e-12          # (0.6*0.4 + 0.4*1) / (0.6*0.64 + 0.4)
    assert report_figures.smoothed([0.0, 1.0], weight=0.0) == [0.0, 1.0]


def test_sizes_and_numbers_read_as_a_person_reads_them():
    sizes = (None, 0, 812, 1024, 812 * 1024, 9.5 * 2**20, 10**9, 1.25 * 2**30, 3 * 2**40)
    assert [readable.size(n) for n in sizes] == [
        "-", "0 B", "812 B", "1.00 KiB", "812 KiB", "9.50 MiB", "954 MiB", "1.25 GiB", "3.00 TiB"]
    assert [readable.number(v) for v in (None, 0.1234567891234567, 1.2345678e-05, 1234.5678, 123456.0, 3, -0.5)] == [
        "-", "0.1235", "1.235e-05", "1235", "123456", "3", "-0.5"]
    aside = report_page.set_aside_said([{"attempt": 1, "resume_point": {"kept": [2, 812 * 1024]}}])
    assert aside == "set aside: 2 checkpoint(s), 812 KiB"
    # `rlops checkpoints list`: a manifest's metrics as JSON keeps every digit; the table rounds them.
    from rlops.cli import checkpoints as cli_checkpoints

    assert cli_checkpoints._metrics('{"reward": 0.41234567890123456, "loss": 1e-07, "total_steps": 6}') == \
        "reward=0.4123 loss=1e-07 total_steps=6"
    assert cli_checkpoints._metrics("-") == "-"


def run_record(run: str, state: str, steps: int, requested_by: str = "ana"):
    from rlops.state.run_records import new

    record = new({"environment": "local", "recipe": "tiny-arith", "run": run, "requested-by": requested_by,
                  "settings": json.dumps({"max_steps": steps}), "checkpoint-dir": f"/lustre/{run}", "attempt": "1"},
                 f"rlops.local.{run}.1", T0)
    record.state, record.step = state, steps
    record.current.started_at, record.current.ended_at, record.current.state = T0 + 10, T0 + 10 + 30 * steps, state
    return record


def test_runs_compared_share_a_figure_per_metric_and_a_table_of_final_values(tmp_path):
    a, b = run_record("lr-high", "SUCCEEDED", 4), run_record("lr-low", "FAILED", 3, "bo")
    series_a = {1: {"steps": [[s, 0.2 * s, 1.0 / s, 2.0] for s in range(1, 5)], "saves": [],
                    "metrics": [[s, {"entropy": 1.0 - 0.1 * s}] for s in range(1, 5)]}}
    series_b = {1: {"steps": [[s, 0.3 if s == 2 else 0.1, None, 3.0] for s in range(1, 4)], "saves": [],
                    "metrics": [[s, {"entropy": 0.5, "clip_ratio/low_mean": 0.01 * s}] for s in range(1, 4)]}}
    result = report_page.compare(tmp_path, [(a, series_a), (b, series_b)], now=T0 + 10_000)

    assert [p.name for p in result.plots] == ["reward.png", "step-time.png", "loss.png",
                                              "metric-clip_ratio-low_mean.png", "metric-entropy.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in result.plots)
    md = result.markdown.read_text()
    assert md.startswith("# Comparing lr-high, lr-low\n")
    assert "| lr-high | tiny-arith | SUCCEEDED | 4/4 | 2023-11-14 22:13:30 | 2m00s | ana |" in md
    assert "| lr-low | tiny-arith | FAILED | 3/3 | 2023-11-14 22:13:30 | 1m30s | bo |" in md
    finals = md[md.index("| metric | lr-high | lr-low |"):]
    assert "| reward | 0.8 (best 0.8) | 0.1 (best 0.3) |" in finals           # higher is better
    assert "| loss | 0.25 (best 0.25) | - |" in finals                        # lower is better; b logged none
    assert "| seconds per step | 2 (best 2) | 3 (best 3) |" in finals
    assert "| entropy | 0.6 (0.6 to 0.9) | 0.5 (0.5 to 0.5) |" in finals      # no better direction: the range
    assert "| clip_ratio/low_mean | - | 0.03 (0.01 to 0.03) |" in finals


def test_the_wandb_run_is_named_from_what_the_recipes_config_and_the_run_say():
    """W&B's run id is the one rlops gives every attempt (jobs.wandb_run_id); the URL needs the entity and project,
    which only the recipe's composed config (or the run's settings) can give."""
    from conftest import ENVIRONMENTS
    from rlops.runs import jobs, report_writer
    from rlops.spec.load import load_or_raise
    from rlops.state.run_records import new

    def record(env: str, recipe: str, settings: dict):
        return new({"environment": env, "recipe": recipe, "run": "r1", "requested-by": "ana", "attempt": "1",
                    "settings": json.dumps(settings), "checkpoint-dir": "/lustre/checkpoints/r1"}, "s", T0)

    h200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
    run_id = jobs.wandb_run_id("h200", "r1")
    recipe = h200.recipes["gemma3-27b-gsm8k"]
    # The v0.5.0 config, composed through its defaults chain, names the project (nemo-rl) and no entity.
    said = report_writer.wandb_said(h200, record("h200", "gemma3-27b-gsm8k", recipe.default_settings()))
    assert said == (f"run id {run_id} in project nemo-rl (the recipe's config names no entity: the W&B key's default "
                    f"one; https://wandb.ai/ENTITY/nemo-rl/runs/{run_id})")
    off = {**recipe.default_settings(), "logger.wandb_enabled": False}
    assert report_writer.wandb_said(h200, record("h200", "gemma3-27b-gsm8k", off)) is None

    # An image rlops has no configs for: the run's own logger settings are all it knows.
    unknown = h200.model_copy(update={"ray": h200.ray.model_copy(update={"image": "nvcr.io/nvidia/nemo-rl:v9.9.9"})})
    named = {"logger.wandb_enabled": True, "logger.wandb.entity": "acme", "logger.wandb.project": "math"}
    assert report_writer.wandb_said(unknown, record("h200", "gemma3-27b-gsm8k", named)) == \
        f"https://wandb.ai/acme/math/runs/{run_id}"
    assert report_writer.wandb_said(unknown, record("h200", "gemma3-27b-gsm8k", {})) is None

    local = load_or_raise(ENVIRONMENTS / "local.yaml")  # TRL with report_to="none"
    assert report_writer.wandb_said(local, record("local", "tiny-arith", {"max_steps": 6})) is None
