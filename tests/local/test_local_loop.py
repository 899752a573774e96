"""The local loop end to end on real parts: `rlops up local` (Ray head and a GPU-pool worker node,
fake-gcs-server, the Pub/Sub emulator, functions-framework), train messages, watch ticks, snapshots, an export, the
reaper, `rlops down local`. The commands run as a user runs them, in subprocesses. The stack is tests/local_stack.py's;
the preemptions, the late GPU nodes and the GKE paths on this Ray have modules of their own, each with its own stack.
"""

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from local_stack import (
    IDLE_TIMEOUT_SECONDS,
    RLOPS,
    TOKEN,
    no_planted_token,
    token_file_of,
    train_message,
    trained,
)

# One of the two groups of local-stack modules (tests/local_stack.py says why two).
pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("local-stack-a")]


def test_up_again_starts_nothing_and_reports_each_piece_running(local):
    before = {name: p.pid for name, p in local.registry().items()}
    assert set(before) >= {"storage", "pubsub", "ray-head", "ray-worker-0", "functions-train", "functions-watch"}
    out = local.up().stdout
    assert all(f"{name}: running (pid {pid})" in out for name, pid in before.items()), out
    assert {name: p.pid for name, p in local.registry().items()} == before



def test_a_run_goes_from_message_to_checkpoints_to_succeeded(local, first):
    assert "published to the emulator's rlops-train topic" in first
    record = local.record("first")
    assert record["step"] == 4 and record["last_checkpoint"] == 4
    assert [h["state"] for h in record["history"]][-1] == "SUCCEEDED"
    checkpoints = local.root / ".rlops/local/lustre/checkpoints/tiny-arith/first"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    logs = local.rlops("logs", "local", "first").stdout
    # The worker has the token as a file alone (issue 32, 3).
    assert "[rlops] step=4" in logs and "HF token file readable; HF_TOKEN not in the environment" in logs
    status = local.rlops("status", "local", "--run", "first").stdout
    assert status.splitlines()[1].split()[:5] == ["first", "SUCCEEDED", "1", "4/4", "4"]  # STEP is step/total
    events = local.events()
    assert {(e["type"], e.get("state")) for e in events if e.get("run") == "first"} >= {
        ("submitted", None), ("state-changed", "SUCCEEDED")}
    # The watcher kept the per-step series it read from the job's output, and drew the report when the run ended.
    folder = "rlops/environments/local/runs/first"
    series = json.loads(local.bucket().blob(f"{folder}/attempt-1.metrics.json").download_as_bytes())
    assert [point[0] for point in series["steps"]] == [1, 2, 3, 4] and [s[0] for s in series["saves"]] == [2, 4]
    assert series["steps"][-1][1] == pytest.approx(record["reward"]) and all(p[3] > 0 for p in series["steps"])
    assert record["report"] == f"{folder}/report/report.md"
    page = local.bucket().blob(record["report"]).download_as_text()
    assert f"| 4 | {series['steps'][-1][1]:.4f} |" in page and "![reward](reward.png)" in page
    assert re.search(r"^- cost: \d+\.\d\d GPU-hours running, .* `rlops cost local --run first`", page, re.M)
    assert local.bucket().blob(f"{folder}/report/reward.png").download_as_bytes().startswith(b"\x89PNG")
    ended = next(e for e in events if e.get("run") == "first" and e.get("state") == "SUCCEEDED")
    assert ended["report"] == record["report"]
    drawn = local.rlops("report", "local", "first", "--output", str(local.root / "first-report")).stdout
    assert f"report: {local.root / 'first-report' / 'report.md'}" in drawn and "reward.png" in drawn


def test_the_cli_finds_the_local_emulators_without_writing_its_environment(local, first, monkeypatch, capsys):
    """In this process, as the command line runs: the stack says where its emulators are, the endpoints carry
    them to the clients, and os.environ is read, never written."""
    from rlops import cli

    for name in list(os.environ):
        if name.startswith(("STORAGE_EMULATOR", "PUBSUB_EMULATOR", "RLOPS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(local.root / "environments"))
    monkeypatch.chdir(local.root)
    before = dict(os.environ)
    assert cli.main(["status", "local", "--run", "first"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["first", "SUCCEEDED"]
    # Ray sets RAY_CLIENT_MODE itself (ray/_private/client_mode_hook.py); every other variable is as it was.
    after = {k: v for k, v in os.environ.items() if k != "RAY_CLIENT_MODE"}
    assert after == {k: v for k, v in before.items() if k != "RAY_CLIENT_MODE"}


def test_snapshot_ticks_write_each_complete_checkpoints_manifest_once_even_at_the_same_time(local):
    trained(local, "snapped")
    run_dir = local.root / ".rlops/local/lustre/checkpoints/tiny-arith/snapped"
    (run_dir / "checkpoint-6").mkdir()  # a save in progress: no trainer_state.json yet
    ticks = [subprocess.Popen([RLOPS, "snapshot", "local"], cwd=local.root, env=local.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [tick.communicate(timeout=120) for tick in ticks]
    assert [tick.returncode for tick in ticks] == [0, 0, 0], outputs
    written = [line for out, _ in outputs for line in out.splitlines() if line.startswith("snapped: manifest of")]
    assert sorted(written) == ["snapped: manifest of step 2 written (rlops/environments/local/runs/snapped/"
                               "manifests/step-2.json)", "snapped: manifest of step 4 written (rlops/environments/"
                               "local/runs/snapped/manifests/step-4.json)"]
    assert "no new complete checkpoints" in local.rlops("snapshot", "local").stdout
    blobs = sorted(b.name.rsplit("/", 1)[1] for b in local.bucket().list_blobs(
        prefix="rlops/environments/local/runs/snapped/manifests/"))
    assert blobs == ["step-2.json", "step-4.json"]
    assert set(local.record("snapped")["manifests"]) == {"2", "4"}
    listing = local.rlops("checkpoints", "list", "local", "snapped").stdout.splitlines()
    assert [line.split()[0] for line in listing[1:]] == ["2", "4"] and all(" yes " in line for line in listing[1:])
    (run_dir / "checkpoint-2" / "scheduler.pt").write_bytes(b"changed")
    assert "NO: 1 changed" in local.rlops("checkpoints", "list", "local", "snapped").stdout
    # Exported to the bucket and verified there object by object; an altered checkpoint is not exported.
    exported = local.rlops("checkpoints", "export", "local", "snapped").stdout
    destination = "gs://rlops-local-state/rlops/environments/local/runs/snapped/exports/step-4/"
    assert "exported step 4 of snapped: " in exported and destination in exported and "verified: " in exported
    assert local.record("snapped")["exports"]["4"]["destination"] == destination
    refused = local.rlops("checkpoints", "export", "local", "snapped", "--step", "2", check=False)
    assert refused.returncode == 1 and "does not match its manifest (1 changed (scheduler.pt" in refused.stderr
    events = local.events()
    checkpoint_events = [e for e in events if e["type"] == "checkpoint" and e.get("run") == "snapped"]
    assert sorted(e["step"] for e in checkpoint_events) == [2, 4]
    assert [e["step"] for e in events if e["type"] == "checkpoint-exported" and e.get("run") == "snapped"] == [4]


def test_an_export_imported_into_a_second_local_environment_verifies_and_a_run_there_resumes_from_it(
        local, first_exported):
    """A second local environment (its own Ray, bucket emulator and /lustre) as another zone: `checkpoints import`
    reads the export of `first` from the first environment's bucket, verifies it object by object, copies it into
    the run's directory here and verifies it on disk; the run started here resumes from it through its gate."""
    spec = (local.root / "environments" / "local.yaml").read_text()
    (local.root / "environments" / "zone-b.yaml").write_text(
        spec.replace("bucket: rlops-local-state", "bucket: rlops-zone-b-state")
        .replace(".rlops/local/lustre", ".rlops/zone-b/lustre"))
    source = first_exported
    try:
        local.up("zone-b")
        refused = local.rlops("checkpoints", "import", "zone-b", "first", "--recipe", "tiny-arith",
                              "--from", source.replace("-4", "-2"), check=False)
        assert refused.returncode == 1 and "no manifest at gs://rlops-local-state/" in refused.stderr
        out = local.rlops("checkpoints", "import", "zone-b", "first", "--recipe", "tiny-arith", "--from", source).stdout
        target = local.root / ".rlops/zone-b/lustre/checkpoints/tiny-arith/first/checkpoint-4"
        assert f"imported step 4 into {target}" in out and "verified on Lustre" in out
        again = local.rlops("checkpoints", "import", "zone-b", "first", "--recipe", "tiny-arith", "--from", source,
                            check=False)
        assert again.returncode == 1 and "exists already" in again.stderr
        local.rlops("train", "zone-b", "--recipe", "tiny-arith", "--run", "first", "--set", "max_steps=6")
        record = local.tick_until("first", lambda r: r["state"] == "SUCCEEDED", env="zone-b")
        attempt = record["attempts"][0]
        assert attempt["resume_point"] == {"step": 4, "set_aside": [], "verified": True}
        assert attempt["resumed_from"] == 4 and attempt["first_step"] == 5 and record["step"] == 6
    finally:
        assert local.rlops("down", "zone-b", check=False).returncode == 0


def test_the_same_message_three_times_at_once_and_again_later_makes_one_job(local):
    data = train_message("dup", max_steps=2)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(local.post_train(data))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200, 200, 200]
    local.tick_until("dup", lambda r: r["state"] == "SUCCEEDED")
    assert local.post_train(data) == 200
    again = local.rlops("train", "local", "--recipe", "tiny-arith", "--run", "dup", "--set", "max_steps=2").stdout
    assert "already submitted with these settings (SUCCEEDED, attempt 1); nothing sent" in again  # nothing to wait for
    assert len(local.jobs_of("dup")) == 1
    # A restarted Ray head forgets its jobs, and so their ids: the run record still makes a replay a no-op.
    from ray.job_submission import JobSubmissionClient

    JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}").delete_job("rlops.local.dup.1")
    assert local.post_train(data) == 200
    assert local.jobs_of("dup") == []


def hostile_messages() -> list[bytes]:
    import random

    rng = random.Random(5)
    good = json.loads(train_message("ok"))
    cases = [b"", b"not json", b"\xff\xfe\x00", b"[]", b"null", b"42", b'"text"', b"[" * 50_000,
             b"{" + b" " * (70 * 1024) + b"}", json.dumps({**good, "run": "x" * 100_000}).encode()]
    bad_values = ["../../etc/passwd", "$(touch /tmp/pwned)", "`id`", "a;b", "a b", "A", "", "-x", "x" * 64,
                  "\u00e9", "a\nb", None, 1, 1.5, True, [], {}, "/abs/path", "..", "%2e%2e"]
    bad_requesters = ["", "a b", "a\nb", "$(id)", "`id`", "a;b", "x" * 300, None, 1, [], {}]
    for field in ("environment", "recipe", "run", "requested_by"):
        for value in bad_requesters if field == "requested_by" else bad_values:
            cases.append(json.dumps({**good, field: value}).encode())
        cases.append(json.dumps({k: v for k, v in good.items() if k != field}).encode())
    for key, value in [("max_steps", 0), ("max_steps", 10**9), ("max_steps", -1), ("max_steps", "4"),
                       ("max_steps", 2.5), ("max_steps", True), ("max_steps", None), ("learning_rate", 1.0),
                       ("learning_rate", "NaN"), ("seed", -1), ("save_steps", 1), ("checkpoint_root", "/"),
                       ("../x", 1), ("$(id)", 1), ("max_steps; rm -rf /", 1), ("", 1)]:
        cases.append(json.dumps({**good, "overrides": {key: value}}).encode())
    cases.append(json.dumps({**good, "overrides": {f"k{i}": i for i in range(100)}}).encode())
    cases.append(json.dumps({**good, "extra": "field"}).encode())
    cases.append(json.dumps({**good, "environment": "nowhere"}).encode())
    cases.append(json.dumps({**good, "recipe": "nope"}).encode())
    cases.append(json.dumps({**good, "overrides": [1, 2]}).encode())
    cases.append(b'{"environment": "local", "learning_rate": NaN}')
    while len(cases) < 220:  # random bytes and random cuts of a good message
        raw = json.dumps(good).encode()
        cut = raw[:rng.randrange(len(raw))] + bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
        cases.append(cut if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(rng.randrange(64))))
    return cases


def test_hostile_messages_are_acknowledged_logged_with_a_reason_and_never_submitted(local):
    log = local.root / ".rlops/local/logs/functions-train.log"
    jobs_before = len(local.ray_jobs())
    refused_before = log.read_text().count('"train message refused"')
    cases = hostile_messages()
    assert len(cases) >= 200
    assert [local.post_train(data) for data in cases] == [200] * len(cases)
    envelopes = [{"message": {"data": "%%% not base64"}}, {"message": {"data": 7}}, {"message": "x"},
                 {"subscription": "projects/p/subscriptions/s"}]
    assert [local.post_train(b"", envelope) for envelope in envelopes] == [200] * len(envelopes)
    lines = [json.loads(line) for line in log.read_text().splitlines() if '"train message refused"' in line]
    assert len(lines) - refused_before == len(cases) + len(envelopes)
    assert all(line["reason"] for line in lines)
    assert len(local.ray_jobs()) == jobs_before
    assert not list((local.root / "pwned").parent.glob("pwned")) and not Path("/tmp/pwned").exists()


def test_a_training_code_failure_is_recorded_and_not_resubmitted(local):
    local.rlops("train", "local", "--recipe", "broken", "--run", "crashes")
    record = local.tick_until("crashes", lambda r: r["state"] == "FAILED")
    assert record["attempts"][-1]["failure"]["kind"] == "code"
    local.rlops("watch", "local")
    assert len(local.jobs_of("crashes")) == 1 and len(local.record("crashes")["attempts"]) == 1



@pytest.fixture(scope="module")
def reaped_and_woken(local) -> dict:
    """The idle GPU pool reaped, then woken by a train message (run `after-reap`), once in this module: what each
    step said and what was alive after it, for the reaper's test to check and for the cost report's reaped time."""
    seen = {}
    if "first look" in local.rlops("reap", "local", "--dry-run").stdout:
        local.rlops("reap", "local")  # no train message yet: the first look starts the idle clock
    local.wait_past_idle_timeout()
    seen["dry run"] = local.rlops("reap", "local", "--dry-run").stdout
    worker = local.registry()["ray-worker-0"]
    seen["alive after the dry run"] = worker.alive()
    seen["reap"] = local.rlops("reap", "local").stdout
    seen["registered after the reap"] = "ray-worker-0" in local.registry()
    seen["alive after the reap"] = worker.alive()
    seen["reap again"] = local.rlops("reap", "local").stdout
    again = local.up()  # as `apply` on GKE, `up` leaves a reaped pool down
    seen["up"] = again.stdout + again.stderr
    seen["registered after up"] = "ray-worker-0" in local.registry()
    seen["events"] = local.events()
    local.rlops("train", "local", "--recipe", "tiny-arith", "--run", "after-reap", "--set", "max_steps=2")
    seen["woken run"] = local.tick_until("after-reap", lambda r: r["state"] == "SUCCEEDED")
    woken = local.registry()["ray-worker-0"]
    seen["alive after the wake"] = woken.alive()
    # The train function woke it, with no secret source in its environment: the token comes from what `up` kept.
    seen["woken worker has the token"] = token_file_of(woken.pid) == TOKEN
    seen["kept token's mode"] = (local.root / ".rlops/local/secrets/HF_TOKEN").stat().st_mode & 0o777
    return seen


def test_an_idle_pool_is_reaped_and_a_train_message_brings_it_back(local, reaped_and_woken):
    seen = reaped_and_woken
    dry = seen["dry run"]
    assert dry.startswith("would scale down: idle for") and "stop Ray worker node ray-worker-0 (gpu_pool)" in dry
    assert f"(timeout: idle.timeout {IDLE_TIMEOUT_SECONDS}s)" in dry
    assert seen["alive after the dry run"], "a dry run changed something"
    assert seen["reap"].startswith("scaled down:")
    assert not seen["registered after the reap"] and not seen["alive after the reap"]
    assert seen["reap again"].startswith("keeping the GPU pool: already scaled down")
    assert "ray-worker-0: not started: the reaper scaled the GPU pool down" in seen["up"]
    assert not seen["registered after up"]
    assert any(e["type"] == "scaled-down" for e in seen["events"])
    assert seen["woken run"]["step"] == 2 and seen["alive after the wake"]
    assert seen["woken worker has the token"] and seen["kept token's mode"] == 0o600
    # While a run is live the pool stays, however long ago the timeout started. The run holds after its
    # first step until the test removes the gate, so it is live for as long as the test looks.
    gate = local.root / ".rlops/local/lustre/checkpoints/tiny-arith/busy/hold"
    gate.parent.mkdir(parents=True)
    gate.touch()
    local.rlops("train", "local", "--recipe", "tiny-arith", "--run", "busy", "--set", "max_steps=4",
                "--set", "pause_while=hold")
    local.tick_until("busy", lambda r: r["state"] == "RUNNING")
    local.wait_past_idle_timeout()
    assert "job(s) pending or running" in local.rlops("reap", "local").stdout
    assert local.registry()["ray-worker-0"].alive()
    gate.unlink()
    record = local.tick_until("busy", lambda r: r["state"] == "SUCCEEDED")
    assert record["step"] == 4


def test_rlops_cost_shows_each_runs_gpu_hours_the_idle_and_the_reaped_time_and_a_timeline(local, first,
                                                                                          reaped_and_woken):
    """After a run and a reap: the local worker counted as one a3-ultragpu-8g (8 GPUs) at its list
    price; every run's used GPU-hours from its attempts' running time; the pool's idle and reaped time from its
    transitions; a PNG timeline."""
    out = local.rlops("cost", "local").stdout
    lines = out.splitlines()
    assert "list prices as of 2026-" in lines[0] and "scale-downs" in lines[1]
    pool = next(line for line in lines if line.startswith("gpu-pool "))
    assert "on-demand" in pool and "1 x 8" in pool
    first = next(line.split() for line in lines if line.startswith("first "))
    assert first[1] == "SUCCEEDED" and float(first[2]) > 0 and first[4].startswith("$")
    timeline = local.root / "reports/local/cost-timeline.png"
    assert f"timeline: {timeline.relative_to(local.root)}" in out
    assert timeline.read_bytes().startswith(b"\x89PNG")
    report = json.loads(local.rlops("cost", "local", "--format", "json").stdout)
    (gpu_pool,) = report["pools"]
    assert gpu_pool["gpu_hours"]["idle"] > 0 and gpu_pool["gpu_hours"]["reaped"] > 0 and report["reaps"]
    runs = {row["run"]: row for row in report["runs"]}
    assert runs["first"]["gpu_hours"]["used"] == pytest.approx(float(first[2]), abs=0.01)
    # A run's row alone: the pool's rows still count every run.
    alone = json.loads(local.rlops("cost", "local", "--run", "first", "--format", "json").stdout)
    assert [row["run"] for row in alone["runs"]] == ["first"]
    assert alone["pools"][0]["gpu_hours"]["used"] == pytest.approx(gpu_pool["gpu_hours"]["used"], abs=0.01)
    refused = local.rlops("cost", "local", "--since", "last tuesday", check=False)
    assert refused.returncode == 1 and "--since last tuesday: expected a date" in refused.stderr
    md = local.rlops("cost", "local", "--format", "markdown").stdout
    assert "| pool | capacity |" in md and "![timeline](" in md



def test_the_planted_token_is_in_no_job_log_record_or_event(local, first):
    # Every job, record and log line made so far in this module is searched: at least `first`'s, and all of
    # them when the module runs whole.
    no_planted_token(local, lost=set())
