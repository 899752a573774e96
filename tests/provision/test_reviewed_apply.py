"""Reviewed applies: `apply` shows its plan and asks on a terminal (a real pty), refuses off one without --yes, and
applies a plan saved with `plan --out` only while nothing it was made from moved (Terraform's `plan -out` and
`apply PLANFILE`), against the fake GCP and cluster."""

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from apply_support import applied
from rlops import cli
from rlops.cli import common
from rlops.cloud import base
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.provision.saved import SavedPlan

PROMPT = b"Type the environment name (h200) to apply it: "


@pytest.fixture
def fake(cloud_fakes, specs, monkeypatch):
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    return cloud_fakes[0]


def on_a_terminal(argv: list[str], answer: str, timeout: float = 180) -> tuple[int, str, str]:
    """`rlops ARGV` with its standard streams on a pseudo-terminal: everything it wrote up to its prompt, then `answer`
    typed, then everything after, and its exit code."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "rlops", *argv], stdin=terminal, stdout=terminal,
                               stderr=terminal, env=dict(os.environ), close_fds=True)
    os.close(terminal)
    deadline = time.monotonic() + timeout

    def read_until(done) -> bytes:
        seen = b""
        while not done(seen):
            assert time.monotonic() < deadline, f"no prompt within {timeout}s; it said:\n{seen.decode()}"
            if not select.select([controller], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the process ended and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        return seen

    try:
        asked = read_until(lambda seen: PROMPT in seen)
        os.write(controller, answer.encode() + b"\n")
        rest = read_until(lambda seen: False)
        return process.wait(timeout=max(1.0, deadline - time.monotonic())), asked.decode(), rest.decode()
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()


def test_on_a_terminal_apply_shows_the_plan_and_its_cost_then_asks_and_changes_nothing_unless_told(fake):
    code, asked, said = on_a_terminal(["apply", "h200", "--skip-doctor"], "no")
    assert code == 1 and "apply not confirmed; nothing was changed" in said
    assert "Plan for environment h200: 20 to create" in asked and "+ node_pool/gpu-pool" in asked
    assert "Cost at list prices" in asked and "+$169.61/h" in asked
    assert not fake.mutations() and not applied("h200")

    code, asked, said = on_a_terminal(["apply", "h200", "--skip-doctor"], "h200")
    assert code == 0, said
    assert "Apply complete for h200: 20 to create" in said and applied("h200")


def test_a_pending_plan_is_a_value_left_unchanged_until_carried_out_and_only_under_its_lock(fake):
    """What the CLI inspects before it asks: the plan under the lock. Left, nothing changed and the lock is free for
    the next apply; carried out after its `with` block (its lock released), it is refused, not applied unlocked."""
    from rlops.provision.session import Session

    _, env = common.load_gcp("h200")
    endpoints = Endpoints.from_environment()
    session = Session(env, base.Connection.to(endpoints), common.bucket(env, endpoints), lambda line: None,
                      lock_timeout=0)
    with session.planned_apply() as pending:
        assert pending.asks and pending.verb == "apply" and pending.plan.summary().startswith("20 to create")
    assert not fake.mutations() and not applied("h200")
    with pytest.raises(Failure, match="this apply plan was left already"):
        pending.carry_out()
    with session.planned_apply() as pending:  # lock_timeout 0: the lock was released
        assert pending.carry_out() is pending.plan
        with pytest.raises(Failure, match="this apply plan was carried out already"):
            pending.carry_out()
    assert applied("h200")
    with session.planned_apply() as pending:
        assert not pending.asks and not pending.plan.has_changes  # nothing to ask about


@pytest.mark.parametrize("verb", ["apply", "destroy"])
def test_off_a_terminal_without_yes_it_refuses_before_reading_or_locking_anything(fake, capsys, verb):
    assert not sys.stdin.isatty()  # pytest's stdin: what CI's is
    assert cli.main([verb, "h200"]) == 1
    err = capsys.readouterr().err
    assert f"{verb} shows its plan and asks before changing anything, and this is not a terminal: pass --yes" in err
    assert "nothing was changed" in err and "Traceback" not in err
    assert not fake.mutations() and not fake.requests  # not even a read: no lock taken, no plan made


def test_a_saved_plan_is_applied_as_reviewed_without_asking(fake, tmp_path, capsys):
    saved = tmp_path / "h200.plan"
    assert cli.main(["plan", "h200", "--out", str(saved)]) == 0
    out, err = capsys.readouterr()
    assert "Plan for environment h200: 20 to create" in out and f"saved to {saved}" in err
    assert not fake.mutations()
    document = json.loads(saved.read_text())
    assert document["format"] == "rlops-plan/1" and document["environment"] == "h200"
    assert len(document["spec_sha256"]) == len(document["live_sha256"]) == 64
    assert document["plan"]["summary"]["create"] == 20 and document["text"] == out
    assert "hf_Planted" not in saved.read_text()  # a plan file holds no secret value

    assert cli.main(["apply", "h200", "--plan", str(saved)]) == 0  # off a terminal, no --yes: the plan was reviewed
    assert applied("h200") and "Apply complete for h200: 20 to create" in capsys.readouterr().out


def test_a_saved_plan_is_refused_once_the_spec_moved(fake, specs, tmp_path, capsys):
    saved = tmp_path / "h200.plan"
    assert cli.main(["plan", "h200", "--out", str(saved)]) == 0
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("shm_size: 240Gi", "shm_size: 200Gi"))
    capsys.readouterr()
    assert cli.main(["apply", "h200", "--plan", str(saved), "--skip-doctor"]) == 1
    err = capsys.readouterr().err
    assert "is not what an apply would do now; nothing was changed" in err
    assert "the spec's ray.shm_size: \"240Gi\" when planned, \"200Gi\" now" in err
    assert not fake.mutations() and not applied("h200")


def test_a_saved_plan_is_refused_once_the_live_state_moved(fake, specs, tmp_path, capsys):
    assert cli.main(["apply", "--yes", "h200"]) == 0
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("autoscaling: {min_nodes: 0, max_nodes: 2}",
                                             "autoscaling: {min_nodes: 0, max_nodes: 3}"))
    saved = tmp_path / "h200.plan"
    assert cli.main(["plan", "h200", "--out", str(saved)]) == 0
    assert "~ node_pool/gpu-pool" in capsys.readouterr().out
    pool = fake.resources("node_pool")["gpu-pool"]  # someone scales the pool in the console meanwhile
    pool["autoscaling"]["maxNodeCount"] = 5
    fake.put("node_pool", "gpu-pool", pool)
    before = len(fake.mutations())
    assert cli.main(["apply", "h200", "--plan", str(saved), "--skip-doctor"]) == 1
    err = capsys.readouterr().err
    assert "node_pool/gpu-pool: max_nodes 2 -> 5" in err and "nothing was changed" in err
    assert len(fake.mutations()) == before

    assert cli.main(["plan", "h200", "--out", str(saved)]) == 0  # planned again, it applies
    assert cli.main(["apply", "h200", "--plan", str(saved), "--skip-doctor"]) == 0
    assert fake.resources("node_pool")["gpu-pool"]["autoscaling"]["maxNodeCount"] == 3


def test_a_plan_file_edited_or_not_a_plan_is_refused_saying_which_file(tmp_path, capsys):
    text = SavedPlan("h200", "2026-01-01 00:00:00 UTC", {"a": 1}, {}, [], {}, "plan\n").to_json()
    assert SavedPlan.from_json(text, "p.json").spec == {"a": 1}
    with pytest.raises(Failure, match="p.json: the saved plan was edited after it was made"):
        SavedPlan.from_json(text.replace('"a": 1', '"a": 2'), "p.json")
    with pytest.raises(Failure, match=r"p.json: not a saved plan \(line 1"):
        SavedPlan.from_json("{oops", "p.json")
    assert cli.main(["plan", "h200", "b200-spot", "--out", str(tmp_path / "x")]) == 1
    assert "--out saves one environment's plan against the live cloud" in capsys.readouterr().err
    assert cli.main(["apply", "h200", "--plan", str(tmp_path / "missing")]) == 1
    assert f"--plan {tmp_path / 'missing'}: No such file or directory" in capsys.readouterr().err
