"""The run report, rendered for real with matplotlib into a temporary directory."""

from rlops.runs import report

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
    result = report.write(tmp_path / "a", record, series, checkpoints)

    assert [p.name for p in result.plots] == ["reward.png", "step-time.png", "checkpoints.png"]
    for plot in result.plots:
        data = plot.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5_000, plot

    # The same run renders the same bytes; a run with other numbers renders other bytes, so each image
    # depends on the series and not only on its axes and labels.
    again = report.write(tmp_path / "b", record, series, checkpoints)
    changed = {n: {"steps": [[s, -r, l, 2 * t] for s, r, l, t in d["steps"]],
                   "saves": [[s, 3 * t] for s, t in d["saves"]]} for n, d in series.items()}
    other = report.write(tmp_path / "c", record, changed, checkpoints)
    for plot, same, different in zip(result.plots, again.plots, other.plots):
        assert plot.read_bytes() == same.read_bytes(), plot.name
        assert plot.read_bytes() != different.read_bytes(), plot.name
    assert result.markdown.read_text() == again.markdown.read_text()

    md = result.markdown.read_text()
    for name in ("reward.png", "step-time.png", "checkpoints.png"):
        assert f"({name})" in md
    assert "| attempt | state | submitted | ended | resumed from | failure |" in md
    assert "| 1 | FAILED | 2023-11-14 22:13:20 | 2023-11-14 22:23:20 | - | node-lost: node gke-a3 \\| gone |" in md
    assert "| 2 | SUCCEEDED | 2023-11-14 22:25:00 | 2023-11-14 22:35:00 | 4 | - |" in md

    # Step 10 exists only in attempt 2; step 5 exists in both, and attempt 2 redid it, so its numbers stand.
    steps_table = md[md.index("| step | reward | loss | seconds |"):]
    assert "| 10 | 0.8000 | 0.0900 | 21.00 |" in steps_table
    assert "| 5 | 0.4000 | 0.1800 | 16.00 |" in steps_table
    assert "| 5 | 0.5000 |" not in steps_table

    ckpt_table = md[md.index("| step | size (GB) | save seconds | GB/s | verified |"):md.index("## Steps")]
    assert "| 2 | 1.00 | 3.00 | 0.33 | yes |" in ckpt_table
    assert "| 4 | 2.00 | 4.00 | 0.50 | NO |" in ckpt_table
    assert "| 8 | - | 5.00 | - | - |" in ckpt_table
    assert "Cost" not in md and "idle" not in md


def test_resume_line_is_labelled_with_the_lost_attempts_failure():
    record, _, _ = two_attempts()
    first, second = record["attempts"]
    assert report._boundary(second, first) == (5, "attempt 2 resumed from step 4 (node-lost)")
    assert report._boundary({**second, "first_step": None}, first)[0] == 4


def test_a_long_run_is_thinned_evenly_to_200_rows(tmp_path):
    record = {"environment": "e", "recipe": "r", "run": "long", "state": "SUCCEEDED", "step": 10_000,
              "reward": 0.5, "created_at": T0,
              "attempts": [{"attempt": 1, "submission_id": "s", "state": "SUCCEEDED", "submitted_at": T0,
                            "ended_at": T0 + 1, "failure": None, "resumed_from": None, "first_step": 1}]}
    series = {1: {"steps": [[s, s / 10_000, None, 1.5] for s in range(1, 10_001)], "saves": []}}
    md = report.write(tmp_path, record, series, []).markdown.read_text()

    table = md[md.index("| step | reward | loss | seconds |"):].splitlines()[2:]
    steps = [int(row.split(" | ")[0].lstrip("| ")) for row in table]
    assert len(steps) == 200
    assert steps[0] == 1 and steps[-1] == 10_000
    assert steps == sorted(set(steps))
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    assert max(gaps) - min(gaps) <= 1  # evenly, not the first 200
    assert "200 of 10000" in md
    assert "| 1 | 0.0001 | - | 1.50 |" in md


def test_a_run_without_rewards_writes_a_page_and_no_reward_plot(tmp_path):
    record = {"environment": "e", "recipe": "r", "run": "fresh", "state": "RUNNING", "step": None,
              "reward": None, "created_at": T0,
              "attempts": [{"attempt": 1, "submission_id": "s", "state": "RUNNING", "submitted_at": T0,
                            "ended_at": None, "failure": None, "resumed_from": None, "first_step": None}]}
    result = report.write(tmp_path / "new" / "dir", record, {}, [])

    assert result.plots == []
    assert list(result.markdown.parent.iterdir()) == [result.markdown]
    md = result.markdown.read_text()
    assert "- state: RUNNING" in md and "- last reward: -" in md
    assert "| 1 | RUNNING | 2023-11-14 22:13:20 | - | - | - |" in md
    assert ".png" not in md


def test_idle_before_reaped_and_the_runs_cost(tmp_path):
    record, series, checkpoints = two_attempts()
    ended = record["attempts"][-1]["ended_at"]

    md = report.write(tmp_path / "a", record, series, checkpoints,
                      pool={"scaled_down": True, "since": ended + 150},
                      cost="1.50 GPU-hours running").markdown.read_text()
    assert "- idle before reaped: 2.5 min" in md
    assert "- cost: 1.50 GPU-hours running" in md

    for pool in ({"scaled_down": False, "since": ended + 150}, {"scaled_down": True, "since": ended - 1},
                 {"scaled_down": True}, None):
        md = report.write(tmp_path / "b", record, series, checkpoints, pool=pool).markdown.read_text()
        assert "idle" not in md, pool
