"""The local loop end to end on real parts: `rlops up local` (Ray head and a GPU-pool worker node,
fake-gcs-server, the Pub/Sub emulator, functions-framework), train messages, watch ticks, a
preemption, `rlops down local`. The commands run as a user runs them, in subprocesses.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import REPO, until, workload_words
from rlops.cloud.base import Connection
from rlops.endpoints import Endpoints
from rlops.local import processes
from rlops.provision.plan import Plan
from rlops.provision.session import Session

pytestmark = pytest.mark.servers

RLOPS = str(Path(sys.executable).parent / "rlops")
TOKEN = "hf_PLANTEDlocalTOKEN0123456789abcdefXYZ"
LONG_RUN_STEPS = 120
IDLE_TIMEOUT_SECONDS = 3  # the local spec's idle timeout in this module


class Local:
    def __init__(self, root: Path):
        self.root = root
        self.published: list[dict] = []
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("STORAGE_EMULATOR", "PUBSUB_EMULATOR", "RLOPS_", "RAY_"))}
        self.env.update(RLOPS_ENVIRONMENTS=str(root / "environments"), RLOPS_LOCAL_TICK_SECONDS="0",
                        RLOPS_LOCAL_HF_TOKEN=TOKEN)

    def rlops(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([RLOPS, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"rlops {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def registry(self, env: str = "local") -> dict:
        return processes.Registry(self.root / ".rlops" / env).load()

    def port(self, piece: str, name: str, env: str = "local") -> int:
        return self.registry(env)[piece].ports[name]

    def ray_jobs(self) -> list:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(f"http://127.0.0.1:{self.port('ray-head', 'dashboard')}").list_jobs()

    def jobs_of(self, run: str) -> list:
        return [j for j in self.ray_jobs() if (j.metadata or {}).get("rlops-run") == run]

    def bucket(self, env: str = "local"):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        endpoint = f"http://127.0.0.1:{self.port('storage', 'http', env)}"
        return storage.Client(project="rlops-local", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": endpoint}).bucket(f"rlops-{env}-state")

    def record(self, run: str, env: str = "local") -> dict | None:
        blob = self.bucket(env).blob(f"rlops/environments/{env}/runs/{run}.json")
        return json.loads(blob.download_as_bytes()) if blob.exists() else None

    def tick_until(self, run: str, done, timeout: float = 240, env: str = "local") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.rlops("watch", env)
            record = self.record(run, env)
            if record and done(record):
                return record
            if record and record["state"] == "FAILED":
                raise AssertionError(f"run {run} failed for good: {json.dumps(record, indent=1)}")
            time.sleep(1)
        raise AssertionError(f"run {run} did not get there in {timeout}s: {self.record(run, env)}")

    def wait_past_idle_timeout(self, timeout: float = 60) -> None:
        """Until the reaper's idle timeout has passed since the last mark it measures from (policy.decide)."""
        deadline = time.monotonic() + timeout
        while True:
            blob = self.bucket().blob("rlops/environments/local/pool.json")
            state = json.loads(blob.download_as_bytes()) if blob.exists() else {}
            marks = [state.get("accepted_at"), state.get("woken_at") or state.get("created_at"),
                     *(j.end_time / 1000 for j in self.ray_jobs() if j.end_time)]
            if time.time() > max(m for m in marks if m) + IDLE_TIMEOUT_SECONDS:
                return
            assert time.monotonic() < deadline, f"the idle clock did not run out in {timeout}s: {state}"
            time.sleep(0.2)

    def post_train(self, data: bytes, envelope: dict | None = None) -> int:
        """What the push subscription does: a messagePublished CloudEvent to the train function."""
        body = json.dumps(envelope or {"message": {"data": base64.b64encode(data).decode(), "messageId": "1",
                                                   "publishTime": "2026-12-03T00:00:00Z"},
                                       "subscription": "projects/rlops-local/subscriptions/test"}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port('functions-train', 'http')}/", data=body, method="POST",
            headers={"Content-Type": "application/json", "ce-id": "1", "ce-specversion": "1.0",
                     "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
                     "ce-source": "//pubsub.googleapis.com/projects/rlops-local/topics/rlops-train"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status

    def events(self) -> list[dict]:
        """Every event published so far in this module, in the order pulled: the log subscription is pulled
        (and acknowledged) by whichever test asks first, so each test reads the whole history and picks its own."""
        import grpc
        from google.cloud import pubsub_v1
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        channel = grpc.insecure_channel(f"127.0.0.1:{self.port('pubsub', 'grpc')}")
        subscriber = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
        path = "projects/rlops-local/subscriptions/rlops-events-log"
        while True:
            response = subscriber.pull(request={"subscription": path, "max_messages": 100}, timeout=5)
            if not response.received_messages:
                return list(self.published)
            subscriber.acknowledge(request={"subscription": path,
                                            "ack_ids": [m.ack_id for m in response.received_messages]})
            self.published += [json.loads(m.message.data) for m in response.received_messages]


def train_message(run: str, recipe: str = "tiny-arith", **overrides) -> bytes:
    return json.dumps({"environment": "local", "recipe": recipe, "run": run, "overrides": overrides,
                       "requested_by": "tests"}).encode()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-loop")
    shutil.copytree(REPO / "environments", root / "environments")
    spec = root / "environments" / "local.yaml"
    text = spec.read_text()
    text = text.replace("max_steps: {type: int, min: 1, max: 50, default: 6}",
                        f"max_steps: {{type: int, min: 1, max: {LONG_RUN_STEPS}, default: 6}}\n"
                        "      pause_while: {type: str, pattern: '[a-z]+'}")
    text = text.replace("recipes:\n", "recipes:\n  broken:\n    runner: trl\n"
                        "    entrypoint: rlops.workloads.no_such_workload\n    model: tiny-from-config\n"
                        "    checkpoint_root: /lustre/checkpoints/broken\n    resume_budget: 2\n", 1)
    text = re.sub(r"timeout: 30s.*", f"timeout: {IDLE_TIMEOUT_SECONDS}s", text)  # the reaper test need not wait 30 s
    spec.write_text(text)
    stack = Local(root)
    try:
        stack.rlops("up", "local")
        yield stack
    finally:
        family = set()
        for process in stack.registry().values():
            family |= processes._family(process.pid) if process.alive() else set()
        down = stack.rlops("down", "local", check=False)
        left = [pid for pid in family if processes._stat(pid) and processes._stat(pid)[0] != "Z"]
        assert down.returncode == 0, down.stderr
        assert not left, f"processes of ours left after down: {left}"
        assert stack.registry() == {}


def test_up_again_starts_nothing_and_reports_each_piece_running(local):
    before = {name: p.pid for name, p in local.registry().items()}
    assert set(before) >= {"storage", "pubsub", "ray-head", "ray-worker-0", "functions-train", "functions-watch"}
    out = local.rlops("up", "local").stdout
    assert all(f"{name}: running (pid {pid})" in out for name, pid in before.items()), out
    assert {name: p.pid for name, p in local.registry().items()} == before


def trained(local: Local, run: str, steps: int = 4) -> str:
    """A run of the local recipe, from `rlops train` to SUCCEEDED; what the command said."""
    sent = local.rlops("train", "local", "--recipe", "tiny-arith", "--run", run, "--set", f"max_steps={steps}")
    local.tick_until(run, lambda r: r["state"] == "SUCCEEDED")
    return sent.stdout


@pytest.fixture(scope="module")
def first(local) -> str:
    """Run `first` (4 steps, checkpoints at 2 and 4), made by whichever test needs it first: its record, its
    checkpoints and its kept output are read by several tests, each of which must pass alone and in any order."""
    return trained(local, "first")


@pytest.fixture(scope="module")
def first_exported(local, first) -> str:
    """Step 4 of `first`, manifested and exported to the local bucket; the export's gs:// address."""
    if "4" not in (local.record("first") or {}).get("exports", {}):
        local.rlops("snapshot", "local")
        local.rlops("checkpoints", "export", "local", "first", "--step", "4")
    return "gs://rlops-local-state/rlops/environments/local/runs/first/exports/step-4"


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
        local.rlops("up", "zone-b")
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


def preempted_after_two_checkpoints(local, run: str) -> tuple[Path, int]:
    """A long run of the local recipe, its GPU-pool node stopped under it once checkpoint-4 is complete (the local
    stand-in for a Spot preemption); its checkpoint directory, its newest complete checkpoint's step, and how the
    set-aside list of the resumed attempt starts: the checkpoint the node was writing when it stopped, if any (the
    stop lands wherever the save is), torn."""
    from rlops.local.processes import stop
    from rlops.runs.progress import last_complete_checkpoint

    local.rlops("train", "local", "--recipe", "tiny-arith", "--run", run, "--set", f"max_steps={LONG_RUN_STEPS}")
    checkpoints = local.root / ".rlops/local/lustre/checkpoints/tiny-arith" / run
    deadline = time.monotonic() + 180
    while not (checkpoints / "checkpoint-4" / "trainer_state.json").is_file():
        assert time.monotonic() < deadline, "no checkpoint-4 in time"
        time.sleep(0.1)
    stop(local.registry()["ray-worker-0"])
    newest = last_complete_checkpoint(checkpoints)
    assert newest is not None and 4 <= newest < LONG_RUN_STEPS
    cut_off = sorted((int(p.name.removeprefix("checkpoint-")) for p in checkpoints.glob("checkpoint-*")
                      if int(p.name.removeprefix("checkpoint-")) > newest), reverse=True)
    return checkpoints, newest, [(step, "torn: its save never finished") for step in cut_off]


def test_a_preempted_run_is_resubmitted_and_resumes_from_its_last_checkpoint(local, first):
    _, saved, cut_off = preempted_after_two_checkpoints(local, "preempted")
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
    up = local.rlops("up", "local").stdout  # brings the node back, and says it had stopped
    assert "ray-worker-0 (pid" in up and "had stopped" in up
    # The attempt's gate chooses where it resumes on the node, as the attempt starts.
    record = local.tick_until("preempted", lambda r: r["attempts"][1]["resume_point"])
    point = record["attempts"][1]["resume_point"]
    assert point["step"] == saved and [(a["step"], a["reason"]) for a in point["set_aside"]] == cut_off
    assert record["waiting"] is None and "waiting" not in local.rlops("status", "local", "--run", "preempted").stdout
    record = local.tick_until("preempted", lambda r: r["state"] == "SUCCEEDED")
    second = record["attempts"][1]
    assert second["resumed_from"] == saved and second["first_step"] == saved + 1
    assert record["step"] == LONG_RUN_STEPS and record["last_checkpoint"] == LONG_RUN_STEPS
    assert len(local.jobs_of("preempted")) == 2
    # The first run's node is gone, and Ray's copy of its output with it; rlops kept one.
    kept = local.rlops("logs", "local", "first")
    assert "[rlops] step=4" in kept.stdout and "the copy kept" in kept.stderr


def test_a_preempted_run_whose_newest_checkpoint_was_corrupted_resumes_from_the_previous_verified_one(local):
    checkpoints, newest, cut_off = preempted_after_two_checkpoints(local, "corrupted")
    local.rlops("snapshot", "local")
    weights = checkpoints / f"checkpoint-{newest}" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped byte, after the manifest was written
    weights.write_bytes(bytes(data))
    local.tick_until("corrupted", lambda r: len(r["attempts"]) == 2)
    local.rlops("up", "local")
    point = local.tick_until("corrupted", lambda r: r["attempts"][1]["resume_point"])["attempts"][1]["resume_point"]
    assert point["step"] == newest - 2
    assert [(a["step"], a["reason"]) for a in point["set_aside"][:-1]] == cut_off
    aside = point["set_aside"][-1]
    assert aside["step"] == newest and "does not match its manifest: 1 changed (model.safetensors" in aside["reason"]
    assert (checkpoints / aside["moved_to"] / "model.safetensors").is_file()  # moved aside, not deleted
    said = [e for e in local.events() if e["type"] == "resumed" and e.get("run") == "corrupted"]
    assert [(e["attempt"], e["step"]) for e in said] == [(2, newest - 2)]
    record = local.tick_until("corrupted", lambda r: r["state"] == "SUCCEEDED")
    assert record["attempts"][1]["resumed_from"] == newest - 2 and record["step"] == LONG_RUN_STEPS


def test_a_preempted_run_whose_newest_checkpoint_is_torn_sets_it_aside_and_resumes_from_the_previous_one(local):
    checkpoints, newest, cut_off = preempted_after_two_checkpoints(local, "torn")
    (checkpoints / f"checkpoint-{newest}" / "trainer_state.json").unlink()  # its save cut off with the node
    local.rlops("snapshot", "local")  # a torn checkpoint gets no manifest
    local.tick_until("torn", lambda r: len(r["attempts"]) == 2)
    local.rlops("up", "local")
    point = local.tick_until("torn", lambda r: r["attempts"][1]["resume_point"])["attempts"][1]["resume_point"]
    assert point["step"] == newest - 2
    assert [(a["step"], a["reason"]) for a in point["set_aside"]] == cut_off + [
        (newest, "torn: its save never finished")]
    record = local.tick_until("torn", lambda r: r["state"] == "SUCCEEDED")
    assert record["attempts"][1]["resumed_from"] == newest - 2 and record["step"] == LONG_RUN_STEPS


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


def gpu_pool_node_stopped(local: Local) -> float:
    """Stop the GPU-pool node (as a preemption or a reap does), once Ray has it; when Ray says it died."""
    from rlops.local.processes import stop

    dashboard = f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}"
    stop(local.registry()["ray-worker-0"])
    until(lambda: not [n for n in ray_nodes(dashboard) if not n.get("is_head_node") and n["state"] == "ALIVE"],
          "Ray to see the GPU-pool node gone", timeout=60)
    return time.time()


def gpu_pool_node_joined(local: Local, timeout: float) -> float:
    """When the next GPU-pool node Ray has alive started, by Ray's clock (it joined then)."""
    dashboard = f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}"
    alive = lambda: [n for n in ray_nodes(dashboard) if not n.get("is_head_node") and n["state"] == "ALIVE"]  # noqa: E731
    until(alive, "the GPU-pool node to join", timeout=timeout, poll=0.5)
    return alive()[0]["start_time_ms"] / 1000


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
        up = local.rlops("up", "local").stdout
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
        local.rlops("up", "local")
        record = local.tick_until(run, lambda r: "gate waits" in (r["waiting"] or ""))
        assert record["attempts"][1]["resume_point"] is None
        joined = gpu_pool_node_joined(local, timeout=REPLACEMENT_JOIN_SECONDS + 60)
        assert joined - resubmitted >= REPLACEMENT_JOIN_SECONDS
        record = local.tick_until(run, lambda r: r["state"] == "SUCCEEDED", timeout=180)
    second = record["attempts"][1]
    assert second["resume_point"]["step"] == saved and second["resume_point"]["set_aside"] == [], record
    assert second["resumed_from"] == saved and second["first_step"] == saved + 1 and record["step"] == 8
    assert record["waiting"] is None and len(local.jobs_of(run)) == 2


def jobs_of_run(local: Local, run: str) -> list[str]:
    """The submission ids of a run's jobs, its attempts in order."""
    return sorted((j.submission_id for j in local.jobs_of(run)), key=lambda i: int(i.rsplit(".", 1)[1]))


def test_the_planted_token_is_in_no_job_log_record_or_event(local, first):
    # Every job, record and log line made so far in this module is searched: at least `first`'s, and all of
    # them when the module runs whole.
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    jobs = client.list_jobs()
    assert jobs
    logs_read = 0
    for job in jobs:
        assert TOKEN not in json.dumps(job.model_dump(), default=str)
        try:
            logs = client.get_job_logs(job.submission_id)
        except RuntimeError as error:  # a job whose node was lost (the preemption test): its logs went with it
            assert "Cannot connect" in str(error)
            continue
        logs_read += 1
        assert TOKEN not in logs
    assert logs_read >= 1
    kept = {blob.name for blob in local.bucket().list_blobs() if blob.name.endswith(".log")}
    # Every ended attempt's output was kept by the watcher, but those whose node was lost under them (the three
    # preemption tests' first attempts): their output went with the node.
    lost = {f"rlops.local.{run}.1" for run in ("preempted", "corrupted", "torn")}
    for job in jobs:  # this environment's: the GKE tests' jobs on this Ray keep their output in their own bucket
        if job.submission_id.startswith("rlops.local.") and job.submission_id not in lost \
                and str(job.status.value) in ("SUCCEEDED", "FAILED", "STOPPED"):
            _, _, run, attempt = job.submission_id.split(".")
            assert f"rlops/environments/local/runs/{run}/attempt-{attempt}.log" in kept, job.submission_id
    for blob in local.bucket().list_blobs():  # records, logs, series, manifests, reports and their PNGs
        assert TOKEN.encode() not in blob.download_as_bytes(), blob.name
    for log in (local.root / ".rlops/local/logs").iterdir():
        assert TOKEN not in log.read_text(errors="replace"), log.name
    assert all(TOKEN not in json.dumps(event) for event in local.events())
    worker = local.registry()["ray-worker-0"]
    assert token_file_of(worker.pid) == TOKEN  # where it belongs: a file the worker is pointed at


def token_file_of(pid: int) -> str | None:
    """The token in the file a Ray node's HF_TOKEN_PATH names; none (and the test fails) if its environment holds the
    token itself."""
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert TOKEN.encode() not in environ
    path = dict(entry.split(b"=", 1) for entry in environ.split(b"\0") if b"=" in entry).get(b"HF_TOKEN_PATH")
    return Path(path.decode()).read_text() if path else None


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
    again = local.rlops("up", "local")  # as `apply` on GKE, `up` leaves a reaped pool down
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


@pytest.fixture
def h200_on_local_ray(local, cloud_fakes, specs, monkeypatch):
    """The h200 environment applied to the fake GCP and fake cluster, whose API server proxies the Ray head's
    dashboard service to this module's real Ray head; its events topic on the emulator."""
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    from rlops import cli

    gcp, kube = cloud_fakes
    # This Ray has no GPUs: an attempt's gate waits seconds for them, not the recipe's 30 minutes, unless a test
    # lends it some (`gpu_node`).
    spec = specs / "h200.yaml"
    text = spec.read_text().replace("    resume_budget: 3\n", "    resume_budget: 3\n    gpu_wait: 3s\n", 1)
    # Nothing here reaches GSM8K's files, and this /lustre is the machine's own: the recipe reads the sample's rows as
    # its data steps write them on GKE, from a file the gate's check reads (tests/test_reward_check.py runs the steps).
    from rlops.spec.nemo_rl_reward import TRANSFORMS

    final = specs / "gsm8k-final.jsonl"
    final.write_text("".join(json.dumps(TRANSFORMS["gsm8k-final-answer"](json.loads(line))) + "\n"
                             for line in (REPO / "tests/data/gsm8k-sample.jsonl").read_text().splitlines()))
    text = re.sub(r"    data_steps:\n(      .*\n)+", "", text)
    spec.write_text(text.replace("/lustre/data/gsm8k/train.jsonl", str(final)).replace(
        "/lustre/data/gsm8k/test.jsonl", str(final)))
    assert cli.main(["apply", "--yes", "h200"]) == 0
    kube.services[("default", "ray-cluster-head-svc:dashboard")] = \
        f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}"
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{local.port('pubsub', 'grpc')}")
    try:
        pubsub_v1.PublisherClient().create_topic(name=H200_EVENTS)
    except exceptions.AlreadyExists:
        pass
    return gcp, kube


H200_EVENTS = "projects/rlops-h200-example/topics/rlops-events"


@contextmanager
def gpu_node(local: Local, gpus: int = 16):
    """A Ray node that says it has `gpus` GPUs (Ray takes --num-gpus as given) and no CPU, joined to this module's
    Ray: the GPU nodes of a GKE environment as its Ray sees them. Stopped by its PID on exit."""
    from rlops.local import processes, stack

    ports = {key: processes.free_port() for key in ("agent_http", "agent_grpc", "metrics", "runtime_env_agent",
                                                      "node_manager", "object_manager")}
    temp = f"/tmp/rlops-ray-{hashlib.sha256(str(local.root / '.rlops' / 'local').encode()).hexdigest()[:12]}"
    command = [stack._ray(), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
               f"--address=127.0.0.1:{local.port('ray-head', 'gcs')}", "--num-cpus=0", f"--num-gpus={gpus}",
               "--object-store-memory=80000000", f"--temp-dir={temp}", *stack._node_ports(ports)]
    node = processes.start("gpu-node", command, local.root / "gpu-node.log",
                           {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, ports, cwd=local.root)
    try:
        dashboard = f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}"
        until(lambda: any(n.get("resources_total", {}).get("GPU") == gpus and n.get("state") == "ALIVE"
                           for n in ray_nodes(dashboard)), f"a node with {gpus} GPUs to join Ray")
        yield node
    finally:
        processes.stop(node)


def forget_jobs(local: Local, *runs: str) -> None:
    """Once they have ended, these h200 runs' jobs deleted from this module's Ray: a later test's fresh state
    bucket would otherwise have its watcher rebuild their records from Ray (as after a lost record) and act on
    them, and the reaper would count them."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    mine = lambda: [j for j in client.list_jobs() if (j.metadata or {}).get("rlops-environment") == "h200"  # noqa: E731
                    and (j.metadata or {}).get("rlops-run") in runs]
    until(lambda: all(str(j.status.value) in ("SUCCEEDED", "FAILED", "STOPPED") for j in mine()),
           f"the jobs of {', '.join(runs)} to end", timeout=120)
    for job in mine():
        client.delete_job(job.submission_id)


def ray_nodes(dashboard: str) -> list[dict]:
    from rlops.cloud.ray_jobs import nodes

    return nodes(dashboard)


def test_a_gke_environment_reaches_its_ray_head_through_the_api_servers_service_proxy(local, h200_on_local_ray):
    """The train and watch paths a GKE environment takes."""
    from google.cloud import pubsub_v1

    from conftest import PLANTED_TOKENS
    from rlops import sites
    from rlops.runs import jobs, train, watch

    gcp, kube = h200_on_local_ray
    events = "projects/rlops-h200-example/subscriptions/rlops-events-log"
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": events, "topic": H200_EVENTS})

    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-1", "overrides": {},
                       "requested_by": "tests"}).encode()
    with gpu_node(local):  # the recipe's 2 x 8 GPUs, until the watcher has recorded how the job ended
        assert train.handle(data, Endpoints.from_environment()) == "submitted"
        assert train.handle(data, Endpoints.from_environment()) == "duplicate"
        proxied = [r for r in kube.requests if "/services/ray-cluster-head-svc:dashboard/proxy/api/jobs/" in r.path]
        assert {r.method for r in proxied} >= {"GET", "POST"}
        job = next(j for j in local.ray_jobs() if j.submission_id == "rlops.h200.gke-1.1")
        assert " ".join(workload_words(job.entrypoint, "/lustre/checkpoints/gemma3-27b-gsm8k/gke-1")).startswith(
            "cd /opt/nemo-rl && uv run python examples/run_grpo_math.py --config examples/")
        assert "'checkpointing.checkpoint_dir=\"/lustre/" in job.entrypoint
        h200 = sites.load_environment("h200")  # its GPU workers' settings (issue 32, 2)
        actors = jobs.actor_env(h200, h200.recipes["gemma3-27b-gsm8k"])
        assert actors["LD_LIBRARY_PATH"].startswith("/usr/local/gib/lib64:") and actors["NCCL_NET"] == "gIB"
        assert job.runtime_env["env_vars"] == {**actors, "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                               "WANDB_RUN_ID": jobs.wandb_run_id("h200", "gke-1"),
                                               "WANDB_RESUME": "allow", "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "10"}

        # Neither uv nor NeMo RL is here: the job fails in its own code, which the watcher records and does not retry.
        env = sites.load_environment("h200")
        deadline = time.monotonic() + 120
        while True:
            watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
            record, _ = sites.open_site("h200", env, Endpoints.from_environment()).records.get("gke-1")
            if record.state == "FAILED" or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert record.state == "FAILED" and record.attempts[0].failure.kind == "code"
    assert len(record.attempts) == 1
    # The gate ran first, with rlops shipped as a py_module (the image need not have it): nothing to resume from.
    assert record.attempts[0].resume_point == {"step": None, "set_aside": [], "verified": True}
    # A running job's progress comes from the end of its output, read on the driver's node through the proxy.
    ray = sites.open_site("h200", env, Endpoints.from_environment()).ray
    whole = ray.logs(job.submission_id)
    # The gate's three lines (the data check; it had the GPUs; where it resumes), the shell's three.
    assert whole.count("\n") == 6 and '"earnable": true' in whole
    assert ray.tail(job.submission_id, job.driver_node_id, 2) == "".join(whole.splitlines(keepends=True)[-2:])
    assert any(r.path.endswith("/proxy/api/v0/logs/file") for r in kube.requests)
    received = subscriber.pull(request={"subscription": events, "max_messages": 20}, timeout=10).received_messages
    published = [json.loads(m.message.data) for m in received]
    assert {(e["type"], e.get("state")) for e in published} >= {("submitted", None), ("state-changed", "FAILED")}
    for token in PLANTED_TOKENS.values():
        assert token not in json.dumps(job.model_dump(), default=str)
        assert token not in json.dumps(record.to_json()) and token not in json.dumps(published)
    forget_jobs(local, "gke-1")  # its GPU node is gone: a later watcher would take the job for a preempted one


def test_a_gke_attempt_waits_in_its_gate_for_gpus_that_join_late_and_one_that_never_gets_them_is_retried(
        local, h200_on_local_ray, specs):
    """Issue 32, 1: NeMo RL's driver, on the CPU-only head, gives up after about a minute without its GPUs; nodes
    woken after a reap or a preemption take minutes. The attempt's gate waits for the GPUs first (the recipe's
    gpu_wait; 3 s in this module, 60 s here): a node that joins while it waits lets the workload start. An
    attempt that never gets them ends before its workload and is resubmitted (failure kind capacity, its gate backing
    off first), never final."""
    from rlops import sites
    from rlops.runs import jobs, policy, train, watch

    env = sites.load_environment("h200")
    site = sites.open_site("h200", env, Endpoints.from_environment())
    recipe = env.recipes["gemma3-27b-gsm8k"]
    site.env = env.model_copy(update={"recipes": {"gemma3-27b-gsm8k": recipe.model_copy(update={"gpu_wait": "60s"})}})
    request = jobs.for_site(site, "gemma3-27b-gsm8k", "late-gpus", dict(recipe.default_settings()), "tests", 1)
    assert "--wait-for GPU=16 --wait-seconds 60" in request.entrypoint
    assert site.ray.submit_once(request)
    logs = lambda: site.ray.logs(request.submission_id)  # noqa: E731
    until(lambda: '"have": 0.0' in logs(), "the gate to say it waits for the GPUs")
    assert "[rlops-resume]" not in logs(), "the workload must not start without its GPUs"
    with gpu_node(local):
        until(lambda: str(site.ray.client.get_job_status(request.submission_id).value) in ("SUCCEEDED", "FAILED"),
               "the job to end", timeout=120)
    said = logs()
    assert '"got": true' in said and "[rlops-resume]" in said  # the gate had them, then chose where to resume
    assert "can't cd to /opt/nemo-rl" in said  # the workload's command started (no NeMo RL image here)

    # No GPU ever comes (gpu_wait 3 s): the attempt fails in its gate and is resubmitted as a capacity failure.
    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "no-gpus", "overrides": {},
                       "requested_by": "tests"}).encode()
    assert train.handle(data, Endpoints.from_environment()) == "submitted"
    deadline = time.monotonic() + 120
    while True:
        watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
        record, _ = sites.open_site("h200", env, Endpoints.from_environment()).records.get("no-gpus")
        if (record and len(record.attempts) >= 2) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert record.attempts[0].failure.kind == "capacity" and record.attempts[0].resume_point is None
    assert len(record.attempts) >= 2, "a capacity failure is resubmitted within the resume budget"
    second = next(j for j in local.ray_jobs() if j.submission_id == record.attempts[1].submission_id)
    assert f"--hold {policy.BACKOFF_SECONDS} " in second.entrypoint  # its gate backs off before it looks again
    site.ray.stop(second.submission_id)  # its backoff is not this test's to wait out
    forget_jobs(local, "late-gpus", "no-gpus")


def test_a_gke_run_waiting_for_its_gpu_workers_says_the_planted_cause_until_they_are_up(local, h200_on_local_ray,
                                                                                        tmp_path, capsys):
    """A NeMo RL driver runs on the head and waits for its GPU actors: Ray says RUNNING, no step comes. The
    watcher reads why from the fake cluster and GKE (here: the reservation is used up by other VMs), keeps it
    in the record, publishes a `waiting` event and `rlops status` shows it; once the workers are up it clears."""
    import dataclasses

    from google.cloud import pubsub_v1

    from rlops import cli, sites
    from rlops.runs import jobs, watch

    gcp, kube = h200_on_local_ray
    events = "projects/rlops-h200-example/subscriptions/rlops-events-waiting"
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": events, "topic": H200_EVENTS})
    env = sites.load_environment("h200")
    site = sites.open_site("h200", env, Endpoints.from_environment())
    hold = tmp_path / "hold"
    hold.touch()
    request = jobs.for_site(site, "gemma3-27b-gsm8k", "gke-wait", {}, "tests", 1)
    waits = f"python -c 'import os, time\nwhile os.path.exists(\"{hold}\"): time.sleep(0.1)'"
    assert site.ray.submit_once(dataclasses.replace(request, entrypoint=waits))
    kube.grant_gpu_nodes(0)
    gcp.put_reservation("rlops-h200-example", "us-central1-b", "h200-reservation", "a3-ultragpu-8g",
                        "nvidia-h200-141gb", 8, count=4, in_use=4)

    def ticked() -> "RunRecord":  # noqa: F821 - rlops.state.run_records.RunRecord
        watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
        return sites.open_site("h200", env, Endpoints.from_environment()).records.get("gke-wait")[0]

    cause = "2 of 2 GPU nodes not up: reservation h200-reservation has 0 unused of 4"
    deadline = time.monotonic() + 60
    while (record := ticked()).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.state == "RUNNING" and record.waiting == cause
    assert cli.main(["status", "h200"]) == 0
    assert f"gke-wait: waiting: {cause}" in capsys.readouterr().out
    kube.grant_gpu_nodes(None)
    assert ticked().waiting is None
    assert cli.main(["status", "h200", "--run", "gke-wait"]) == 0
    assert "waiting:" not in capsys.readouterr().out
    hold.unlink()
    deadline = time.monotonic() + 60
    while (record := ticked()).state != "SUCCEEDED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.state == "SUCCEEDED"
    received = subscriber.pull(request={"subscription": events, "max_messages": 20}, timeout=10).received_messages
    said = [json.loads(m.message.data) for m in received]
    assert [e["cause"] for e in said if e["type"] == "waiting"] == [cause]


def test_rlops_train_publishes_a_gke_environments_message_to_its_train_topic(local, specs, state_buckets, monkeypatch,
                                                                           capsys):
    from google.cloud import pubsub_v1

    from rlops import cli

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{local.port('pubsub', 'grpc')}")
    topic = "projects/rlops-h200-example/topics/rlops-train"
    subscription = "projects/rlops-h200-example/subscriptions/train-test"
    pubsub_v1.PublisherClient().create_topic(name=topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    assert cli.main(["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "gke-2",
                     "--requested-by", "ana@example.com"]) == 0
    assert "published to rlops-train" in capsys.readouterr().out
    received = subscriber.pull(request={"subscription": subscription, "max_messages": 5}, timeout=10)
    assert [json.loads(m.message.data) for m in received.received_messages] == [
        {"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-2", "overrides": {},
         "requested_by": "ana@example.com"}]
    assert cli.main(["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "Bad_Name"]) == 1
    assert "not sent: run:" in capsys.readouterr().err


def test_a_tick_for_every_environment_covers_the_applied_gcp_ones_only(h200_on_local_ray, specs, capsys, monkeypatch):
    """Cloud Scheduler's tick names no environment: the example specs never applied and the local one are skipped,
    not reported as errors every minute."""
    import base64

    from cloudevents.http import CloudEvent

    import main
    from rlops import logs

    monkeypatch.setattr(logs, "_to_stderr", False)  # the functions log to stdout, as on Cloud Run
    capsys.readouterr()
    main.watch(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//tests"},
                          {"message": {"data": base64.b64encode(b"{}").decode(), "messageId": "1"}}))
    captured = capsys.readouterr()
    logged = [json.loads(line) for line in (captured.out + captured.err).splitlines() if line.startswith("{")]
    never_applied = sorted(path.stem for path in specs.glob("*.yaml") if path.stem not in ("h200", "local"))
    assert "b200-spot" in never_applied
    assert [e["environment"] for e in logged if e["message"] == "watch tick"] == ["h200"]
    assert sorted(e["environment"] for e in logged if e["message"].startswith("tick skips")) == never_applied
    assert not [e for e in logged if e["severity"] == "ERROR"], logged
    # Deployed in the B200 environment's project, the same tick leaves the H200 one to its own project's deployment.
    monkeypatch.setenv("RLOPS_PROJECT", "rlops-b200-example")
    main.reap(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//tests"},
                         {"message": {"data": base64.b64encode(b"{}").decode(), "messageId": "2"}}))
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted((e["environment"], e["message"]) for e in logged) == sorted(
        [("b200-spot", "tick skips an environment with no cloud resources (never applied, or destroyed)")]
        + [(name, "tick skips an environment of another project") for name in never_applied + ["h200"]
           if name != "b200-spot"])


def test_a_gke_environments_idle_pool_is_reaped_at_once_and_woken_by_a_train_message(local, h200_on_local_ray, specs,
                                                                                     capsys):
    from rlops import cli, sites
    from rlops.kube.gke_cluster import ScaleFailed
    from rlops.reaper.reap import reap
    from rlops.runs import train

    gcp, kube = h200_on_local_ray
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("timeout: 30m", "timeout: 1s\n  scale_reserved: true"))
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    assert not reap(site)[0].scale_down  # the first look starts the clock
    time.sleep(1.5)
    assert cli.main(["reap", "h200", "--dry-run"]) == 0
    assert "node pool gpu-pool: resize to 0 nodes" in capsys.readouterr().out
    assert not [r for r in gcp.requests if r.path.endswith(":setSize")]

    gcp.fail_next(1, status=403, match=":setSize")  # the scale-down stops after the RayCluster, before the pool
    with pytest.raises(Exception, match="setSize|permission"):
        reap(site)
    decision, actions = reap(site)  # the next tick finishes it
    assert decision.reason == "finishing a scale-down that stopped part way"
    assert "node pool gpu-pool: resize to 0 nodes" in actions
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]] == [0]
    resizes = [r for r in gcp.requests if r.path.endswith(":setSize") and 200 <= r.status < 300]
    assert len(resizes) == 1 and not (resizes[0].body or {}).get("nodeCount")
    assert reap(site)[0].reason == "already scaled down"
    captured = capsys.readouterr()  # the CLI above sent log lines to stderr from then on
    logged = [json.loads(line) for line in (captured.out + captured.err).splitlines() if line.startswith("{")]
    (savings,) = [e["savings"] for e in logged if e["message"] == "GPU pool scaled down"]  # once it finished
    assert "reservation h200-reservation is billed whether" in savings[0]
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, "a reaped pool must not be drift"

    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "after-reap", "overrides": {},
                       "requested_by": "tests"}).encode()
    # The wake's resize is accepted, then its operation ends in a stockout: the message is delivered again.
    gcp.fail_operations(1, "SET_NODE_POOL_SIZE", 8, "GCE_STOCKOUT: The zone 'projects/rlops-h200-example/zones/"
                        "us-central1-b' does not have enough resources available to fulfill the request.")
    with pytest.raises(ScaleFailed, match="node pool gpu-pool: resize to 2 nodes failed: GCE_STOCKOUT"):
        train.handle(data, Endpoints.from_environment())
    state, _ = site.pool.read()
    assert state.scaled is False and "GCE_STOCKOUT" in state.error
    assert train.handle(data, Endpoints.from_environment()) == "submitted"
    state, _ = site.pool.read()
    assert state.scaled is True and state.error is None
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]] == [2]
    assert [(r.body or {}).get("nodeCount") for r in gcp.requests
            if r.path.endswith(":setSize") and 200 <= r.status < 300] == [None, 2, 2]
    forget_jobs(local, "after-reap")


def applied_without_asking(session: Session) -> Plan:
    with session.planned_apply() as pending:
        return pending.carry_out()


def test_the_reaper_and_apply_take_turns_on_the_environments_lock(h200_on_local_ray, specs):
    """workerGroupSpecs is an atomic list: an apply that read replicas before a scale-down and applied after it
    would undo it. Both ways of the race: apply holds the lock and the tick waits its turn; the reaper holds it and
    apply waits, then plans again and keeps what the reaper did."""
    from concurrent.futures import ThreadPoolExecutor

    from rlops import sites
    from rlops.provision.service import CloudEnvironment
    from rlops.reaper.reap import reap
    from rlops.state.lock import Lock

    gcp, kube = h200_on_local_ray
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("timeout: 30m", "timeout: 1s\n  scale_reserved: true"))
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    assert not reap(site)[0].scale_down  # the first look starts the clock
    time.sleep(1.5)  # the idle timeout itself
    replicas = lambda: [g["replicas"] for g in kube.get("rayclusters", "ray-cluster", "default")["spec"]  # noqa: E731
                        ["workerGroupSpecs"]]
    resizes = lambda: [r for r in gcp.requests if r.path.endswith(":setSize") and 200 <= r.status < 300]  # noqa: E731

    applying_elsewhere = Lock(site.bucket, site.env.state.prefix, "h200", operation="apply")
    applying_elsewhere.acquire(0)  # what `rlops apply h200` takes first
    with applying_elsewhere:
        decision, actions = reap(site)
        assert not decision.scale_down and decision.reason.startswith("not this tick: environment h200 is locked")
        assert "(apply since" in decision.reason and actions == []
        assert replicas() == [2] and not resizes()

    said: list[str] = []
    session = Session(CloudEnvironment("h200", site.env), Connection.to(Endpoints.from_environment()), site.bucket,
                      said.append)
    with ThreadPoolExecutor(2) as threads:
        with gcp.holding_operations():  # the reaper's resize drains nodes for a while, under the lock
            reaping = threads.submit(reap, site)
            until(lambda: replicas() == [0] and resizes(), "the reaper to patch the RayCluster and resize")
            applying = threads.submit(applied_without_asking, session)
            until(lambda: any(line.startswith("waiting for the lock on h200") for line in said), "apply to wait")
            assert not reaping.done()
        assert reaping.result(timeout=60)[0].scale_down
        applying.result(timeout=120)
    assert replicas() == [0], "apply undid the reaper's scale-down"
    assert site.pool.read()[0].scaled is True


def test_a_gke_environment_hashes_its_checkpoints_in_a_ray_job_where_they_are(local, h200_on_local_ray, tmp_path,
                                                                              monkeypatch):
    """The snapshot tick of a GKE environment: a CPU-only Ray job (rlops shipped as a py_module) prints the
    manifests on the cluster; the next tick stores them. Here the cluster's Ray is this module's, through the proxy."""
    from rlops import sites
    from rlops.checkpoints import manifest
    from rlops.runs import snapshot
    from rlops.state.run_records import new

    run_dir = tmp_path / "lustre" / "gke-snap"
    subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(run_dir), "max_steps=4",
                    "save_steps=4"], check=True, capture_output=True, timeout=300)
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    site.records.create(new({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-snap",
                             "requested-by": "tests", "settings": "{}", "checkpoint-dir": str(run_dir),
                             "attempt": "1"}, "rlops.h200.gke-snap.1", time.time()))
    assert snapshot.tick(site) == []  # starts the job
    # A second tick that, racing the first, also found no scan running: the same checkpoints, the same job.
    started = time.time()
    with monkeypatch.context() as later:
        later.setattr(snapshot.time, "time", lambda: started + 61)
        snapshot._start_cluster_scan(site)
    assert len([j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "snapshot"]) == 1
    deadline = time.monotonic() + 120
    while any((j.metadata or {}).get("rlops-kind") == "snapshot" and str(j.status.value) in ("PENDING", "RUNNING")
              for j in local.ray_jobs()):
        assert time.monotonic() < deadline, "the snapshot job did not finish"
        time.sleep(0.5)
    events = snapshot.tick(site)
    assert [(e["run"], e["step"]) for e in events] == [("gke-snap", 4)]
    stored = json.loads(site.bucket.blob(events[0]["manifest"]).download_as_bytes())
    assert not any(manifest.verify(run_dir / "checkpoint-4", stored).values())
    assert site.records.get("gke-snap")[0].manifests["4"]["digest"] == stored["digest"]
    assert not [j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "snapshot"
                and str(j.status.value) == "SUCCEEDED"], "collected jobs are deleted"


def test_a_gke_checkpoint_is_exported_by_the_lustre_api_verified_and_imported_for_another_run(local, h200_on_local_ray):
    """GKE: the Lustre API's exportData (the fake's, which copies the instance's files into fake-gcs-server) of a
    manifested checkpoint, verified by listing; the recipe's `export: every 1` followed over two snapshot ticks;
    an import into another run: a Ray job on the cluster (this module's Ray) makes the directory importData needs,
    and the run's checkpoint gate verifies what arrived. /lustre here is the fake instance's directory."""
    from rlops import sites
    from rlops.checkpoints import gate, manifest
    from rlops.errors import Failure
    from rlops.runs import checkpoint_transfers, jobs, progress
    from rlops.spec.model import ExportPolicy
    from rlops.state.bucket import write_json_if
    from rlops.state.run_records import new

    gcp, _ = h200_on_local_ray
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    root = gcp.lustre_files(site.env.lustre.name)
    recipe = site.env.recipes["gemma3-27b-gsm8k"]
    site.env = site.env.model_copy(update={
        "ray": site.env.ray.model_copy(update={"lustre_mount": str(root)}),
        "recipes": {"gemma3-27b-gsm8k": recipe.model_copy(update={"export": ExportPolicy(when="every", every=1)})}})
    site.lustre_root = str(root)
    run_dir = Path(jobs.checkpoint_dir(site.env.recipes["gemma3-27b-gsm8k"], "gke-x", site.lustre_root))
    subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(run_dir), "max_steps=4",
                    "save_steps=4"], check=True, capture_output=True, timeout=300)
    site.records.create(new({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-x",
                             "requested-by": "tests", "settings": "{}", "checkpoint-dir": str(run_dir),
                             "attempt": "1"}, "rlops.h200.gke-x.1", time.time()))
    content = manifest.build(run_dir / "checkpoint-4", "gke-x")  # what the cluster's scan job would print
    assert write_json_if(site.bucket.blob(site.records.layout.manifest("gke-x", 4)), content, 0)

    # The instance runs one transfer at a time: while another one runs, the policy's export waits for a later tick.
    other = checkpoint_transfers._transfers(site).export("/checkpoints/", f"gs://{site.bucket.name}/elsewhere/")
    assert checkpoint_transfers.tick(site) == [] and "4" not in site.records.get("gke-x")[0].exports
    deadline = time.monotonic() + 60
    while not checkpoint_transfers._transfers(site).state(other).done:
        assert time.monotonic() < deadline, "the other transfer did not finish"
        time.sleep(0.1)
    assert checkpoint_transfers.tick(site) == []  # the policy's export started: an operation, followed by the next tick
    started = site.records.get("gke-x")[0].exports["4"]
    assert started["operation"] and "verified_at" not in started
    assert [r for r in gcp.mutations() if r.path.endswith(":exportData")]
    deadline = time.monotonic() + 60
    while not (events := checkpoint_transfers.tick(site)):
        assert time.monotonic() < deadline, "the export did not finish"
        time.sleep(0.2)
    assert [(e["type"], e["step"], e["objects"]) for e in events] == [("checkpoint-exported", 4, len(content["files"]))]
    assert site.records.get("gke-x")[0].exports["4"]["verified_at"]
    destination = events[0]["destination"]
    assert destination == f"gs://{site.bucket.name}/{site.records.layout.exports('gke-x')}/step-4/"
    assert checkpoint_transfers.tick(site) == []  # once

    # The command's export, waited for with its counters; one the Lustre API fails part way is said, not recorded
    # as verified.
    said = []
    done = checkpoint_transfers.export_checkpoint(site, "gke-x", 4, (site.bucket, "elsewhere/gke-x"), said.append)
    assert done["destination"] == f"gs://{site.bucket.name}/elsewhere/gke-x/step-4/" and done["verified_at"]
    assert said[-1].startswith("exportData ") and f"{len(content['files'])}/{len(content['files'])} objects" in said[-1]
    gcp.fail_transfers(1, copied=2)
    with pytest.raises(Failure, match=r"export of step 4 of gke-x failed: .*2/\d+ objects.*failed"):
        checkpoint_transfers.export_checkpoint(site, "gke-x", 4, (site.bucket, "broken/gke-x"))
    assert "2/" in site.records.get("gke-x")[0].exports["4"]["error"]

    said = []
    done = checkpoint_transfers.import_checkpoint(site, "gke-y", "gemma3-27b-gsm8k",
                                     (site.bucket, destination.removeprefix(f"gs://{site.bucket.name}/")), said.append)
    target = Path(done["directory"])
    assert target == Path(jobs.checkpoint_dir(site.env.recipes["gemma3-27b-gsm8k"], "gke-y", site.lustre_root)) / \
        "checkpoint-4"
    assert not any(manifest.verify(target, content).values())
    assert [r for r in gcp.mutations() if r.path.endswith(":importData")]
    assert not [j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "import"], "collected"
    shipped = {step: json.loads(blob.download_as_bytes())
               for step, blob in site.records.manifest_objects("gke-y").items()}
    assert list(shipped) == [4]
    gate.stage(root.parent / "shipped", shipped)
    out = subprocess.run([sys.executable, "-m", "rlops.checkpoints.gate", "--run-dir", str(target.parent)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(root.parent / "shipped"), os.environ.get("PYTHONPATH", "")])}).stdout
    said = progress.resume_point(out)
    assert said.pop("at") and said == {"step": 4, "set_aside": [], "verified": True}


def test_a_pod_template_change_waits_for_the_live_ray_job_and_reaches_every_pod_after_it(local, h200_on_local_ray,
                                                                                         specs, tmp_path, capsys):
    """A new image restarts every pod of the RayCluster: while a job runs on its head (the real Ray head, through
    the API server's proxy) apply holds that change, does the rest and fails saying why; once the job has ended
    the next apply makes it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from rlops import cli
    from rlops.spec.images import cached

    gcp, kube = h200_on_local_ray
    ray = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    gate = tmp_path / "hold"
    gate.touch()
    job = ray.submit_job(entrypoint=f"python -c 'import os, time\nwhile os.path.exists(\"{gate}\"): time.sleep(0.1)'")
    until(lambda: ray.get_job_status(job) == JobStatus.RUNNING, f"job {job} to run")
    pods = {p["metadata"]["name"] for p in kube.pods("ray-cluster")}

    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("image: nvcr.io/nvidia/nemo-rl:v0.5.0",
                                          "image: nvcr.io/nvidia/nemo-rl:v0.5.1"))
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert "held, not applied: RayCluster/default/ray-cluster" in err and job in err
    live = kube.get("rayclusters", "ray-cluster", "default")["spec"]["headGroupSpec"]["template"]["spec"]
    assert live["containers"][0]["image"] == cached("nvcr.io/nvidia/nemo-rl:v0.5.0", "rlops-h200-example",
                                                    "us-central1")
    assert {p["metadata"]["name"] for p in kube.pods("ray-cluster")} == pods

    gate.unlink()
    until(lambda: not any(j.status in (JobStatus.PENDING, JobStatus.RUNNING) for j in ray.list_jobs()),
           "every job on the head to end")
    assert ray.get_job_status(job) == JobStatus.SUCCEEDED
    assert cli.main(["apply", "--yes", "h200"]) == 0
    after = kube.pods("ray-cluster")
    assert not pods & {p["metadata"]["name"] for p in after}
    pulled = cached("nvcr.io/nvidia/nemo-rl:v0.5.1", "rlops-h200-example", "us-central1")  # ray.image_cache's path
    assert all(c["image"] == pulled for p in after for c in p["spec"]["containers"])
