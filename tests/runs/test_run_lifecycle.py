"""A run's life beyond train and watch (issue 39, point 1): `rlops cancel`, `rlops logs --follow`, a reused run name,
the train function's refusals kept where `rlops status` shows them; and `rlops --version`, `rlops environments`.

The control plane's paths run on `SimulatedRay` (tests/fakes/ray.py) on a simulated clock, with their state in
fake-gcs-server; the race of a cancel with the watcher's resubmission under the deterministic scheduler
(tests/fakes/interleave.py); cancel and follow also against a real Ray head, on real jobs of the local recipe.
"""

import base64
import json
import time
import tomllib
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ENVIRONMENTS, REPO, until
from fakes.interleave import MemoryBucket, Scheduler, phases, simulated_clock
from fakes.ray import Clock, SimulatedRay
from rlops import cli, logs, sites
from rlops.cli import runs as cli_runs
from rlops.cloud.ray_jobs import RayJobs, described, status_of
from rlops.endpoints import Endpoints
from rlops.reaper import reap
from rlops.runs import cancel, follow, jobs, message, report_writer, train, watch
from rlops.sites import Site
from rlops.spec.load import load_or_raise, load_text
from rlops.state import run_records
from rlops.state.bucket import client
from rlops.state.pool import PoolStatus

T0 = 1_790_000_000.0
LOCAL = load_or_raise(ENVIRONMENTS / "local.yaml")


def request_of(env, run: str, recipe: str = "tiny-arith", overrides: dict | None = None):
    """A train message for `run` in the local environment or h200 (as `env` is), parsed and checked as the train
    function does: (request, settings)."""
    request = message.parse(json.dumps({"environment": "h200" if env.provider == "gcp" else "local", "recipe": recipe,
                                        "run": run, "overrides": overrides or {}, "requested_by": "tests"}).encode())
    return request, message.settings(request, message.recipe_of(request, env))


@pytest.fixture
def simulated(gcs, monkeypatch, tmp_path):
    """The local environment on a simulated clock (every sleep moves it on): its Ray a `SimulatedRay` whose stops
    take 2 s to end a job, its state in a fresh bucket, its events in a list; the CLI's commands open this site."""
    clock = Clock(T0)
    endpoints = Endpoints.from_environment()
    bucket = client("rlops-local", endpoints).create_bucket(f"lifecycle-{uuid.uuid4().hex[:12]}")
    ray, events = SimulatedRay(clock, stop_seconds=2.0), []
    site = Site("local", LOCAL, endpoints, ray, bucket, events.append, lambda down: None, lambda scaled_down: None,
                str(tmp_path / "lustre"), {"gpu_pool": 1}, checkpoints_here=True, clock=clock)
    # Under cli.common.open_site, which every command module calls, and `rlops status`'s records.
    monkeypatch.setattr(sites, "open_site", lambda name, env, endpoints: site)
    monkeypatch.setattr(sites, "run_records", lambda name, env, endpoints: site.records)
    monkeypatch.setattr(logs, "_to_stderr", True)  # as in the CLI: its stdout is what the command prints
    return SimpleNamespace(site=site, clock=clock, ray=ray, events=events)


def submitted(sim, run: str, start: float, steps: list, end: float, status: str = "SUCCEEDED",
              error_type: str | None = None) -> None:
    """Run `run` submitted now by the train function, its job scripted (times from now)."""
    sim.ray.script(f"rlops.local.{run}.1", start, steps, end, status, error_type)
    assert train.accept(sim.site, *request_of(LOCAL, run)) == "submitted"


# -- cancel ----------------------------------------------------------------------------------------------------------


def test_cancel_stops_the_running_attempt_and_nothing_starts_the_run_again(simulated, capsys):
    sim = simulated
    submitted(sim, "r1", 5, [(10 * i, i) for i in range(1, 40)], 500)
    sim.clock.now = T0 + 45
    watch.tick(sim.site)
    assert sim.site.records.get("r1")[0].state == "RUNNING"

    assert cli.main(["cancel", "local", "r1", "--requested-by", "ana"]) == 0
    assert capsys.readouterr().out == \
        "run r1 of local cancelled (it was RUNNING); attempt 1's job rlops.local.r1.1: STOPPED\n"
    assert sim.ray.stops == ["rlops.local.r1.1"]
    record = sim.site.records.get("r1")[0]
    assert record.state == "CANCELLED" and (record.history[-1].state, record.history[-1].at) == ("CANCELLED", T0 + 45)
    assert [e for e in sim.events if e["type"] == "run-cancelled"] == [
        {"type": "run-cancelled", "environment": "local", "run": "r1", "attempt": 1,
         "submission_id": "rlops.local.r1.1", "state_before": "RUNNING", "requested_by": "ana", "at": T0 + 45}]

    # The watcher ends the attempt as Ray ended it (2 s after the stop) and keeps its output up to then.
    changes = watch.tick(sim.site)
    assert [(c["run"], c["attempt"], c["state"], c["reason"]) for c in changes] == [
        ("r1", 1, "STOPPED", "the run was cancelled")]
    attempt = sim.site.records.get("r1")[0].current
    assert (attempt.state, attempt.ended_at, attempt.failure.kind) == ("STOPPED", T0 + 47, "stopped")
    kept = sim.site.records.log("r1", 1)
    assert "[rlops] step=4 " in kept and "[rlops] step=5 " not in kept
    # Nothing starts it again: not the watcher, tick after tick, nor the same train message delivered again; and
    # the reaper counts it as ended.
    for _ in range(3):
        sim.clock.now += 600
        assert watch.tick(sim.site) == []
    assert train.accept(sim.site, *request_of(LOCAL, "r1")) == "duplicate"
    assert list(sim.ray.jobs) == ["rlops.local.r1.1"] and sim.site.records.get("r1")[0].state == "CANCELLED"
    assert reap.picture(sim.site, sim.site.pool.read()[0], sim.clock.now, []).open_runs == 0


def test_a_run_whose_node_went_away_is_not_resumed_once_cancelled(simulated):
    """Both runs' jobs fail with their node; only the one nobody cancelled is resumed."""
    sim = simulated
    for run in ("kept", "cancelled"):
        submitted(sim, run, 5, [(10, 1)], 50, "FAILED", "JOB_SUPERVISOR_ACTOR_DIED")
        sim.ray.script(f"rlops.local.{run}.2", 5, [], 10**6)
    sim.clock.now = T0 + 30
    watch.tick(sim.site)
    sim.clock.now = T0 + 60  # the nodes went away at +50; the watcher has not looked since

    done = cancel.cancel(sim.site, "cancelled", "ana")
    assert (done.cancelled, done.before, done.job) == (True, "RUNNING", "FAILED") and sim.ray.stops == []
    watch.tick(sim.site)
    assert "rlops.local.kept.2" in sim.ray.jobs, "the watcher resumes a run whose node went away"
    assert "rlops.local.cancelled.2" not in sim.ray.jobs
    record = sim.site.records.get("cancelled")[0]
    assert record.state == "CANCELLED"
    assert [(a.attempt, a.state, a.failure.kind, a.ended_at) for a in record.attempts] == [
        (1, "FAILED", "node-lost", T0 + 50)]


def test_a_resubmission_that_raced_the_cancel_is_stopped_and_recorded_by_the_next_tick(monkeypatch, tmp_path):
    """The watcher resubmits a run whose node went away, then the cancel writes the record before the watcher does:
    the watcher's write loses, and Ray has an attempt 2 no record names. The next tick stops it and records it."""
    scheduler = Scheduler(phases(("watch", "write rlops/environments/local/runs/r1.json"), ("cancel", None),
                                 ("watch", None)))
    ray = SimulatedRay(scheduler.time, stop_seconds=2.0)
    site = Site("local", LOCAL, Endpoints(), ray, MemoryBucket(scheduler), lambda event: None, lambda down: None,
                lambda scaled_down: None, str(tmp_path / "lustre"), {"gpu_pool": 1}, checkpoints_here=True,
                clock=simulated_clock(scheduler))
    monkeypatch.setattr(report_writer, "publish", lambda site, record: None)  # plots: not what races
    assert site.pool.write(PoolStatus(created_at=scheduler.clock - 3600), 0)
    ray.script("rlops.local.r1.1", 5, [(60, 1)], 300, "FAILED", "JOB_SUPERVISOR_ACTOR_DIED")
    ray.script("rlops.local.r1.2", 5, [], 10**6)
    now, scheduler.clock = scheduler.clock, scheduler.clock - 600
    assert train.accept(site, *request_of(LOCAL, "r1")) == "submitted"
    scheduler.clock = now

    outcomes = scheduler.run({"watch": lambda: watch.tick(site), "cancel": lambda: cancel.cancel(site, "r1", "ana")})
    assert outcomes["watch"].error is None and outcomes["cancel"].result.cancelled
    record = site.records.get("r1")[0]
    assert "rlops.local.r1.2" in ray.jobs and record.state == "CANCELLED" and len(record.attempts) == 1, \
        "the tick resubmitted, and its record write lost to the cancel's"

    scheduler.choose = lambda ready: next(iter(ready))
    assert scheduler.run({"next tick": lambda: watch.tick(site)})["next tick"].error is None
    assert ray.stops == ["rlops.local.r1.2"]
    scheduler.clock += 60
    changes = scheduler.run({"a tick later": lambda: watch.tick(site)})["a tick later"].result
    assert [(c["attempt"], c["state"]) for c in changes] == [(2, "STOPPED")]
    record = site.records.get("r1")[0]
    assert record.state == "CANCELLED"
    assert [(a.attempt, a.state, a.failure.kind) for a in record.attempts] == [(1, "FAILED", "node-lost"),
                                                                                (2, "STOPPED", "stopped")]
    assert sorted(ray.jobs) == ["rlops.local.r1.1", "rlops.local.r1.2"]


def test_cancel_of_an_unknown_or_ended_run_changes_nothing(simulated, capsys):
    sim = simulated
    assert cli.main(["cancel", "local", "ghost"]) == 1
    assert capsys.readouterr().err == "rlops cancel: no run ghost in local\n"

    submitted(sim, "done", 1, [(2, 1)], 10)
    sim.clock.now = T0 + 5
    watch.tick(sim.site)
    sim.clock.now = T0 + 20  # Ray ended it; the watcher has not recorded that yet
    for said in ("RUNNING", "SUCCEEDED"):
        assert sim.site.records.get("done")[0].state == said
        assert cli.main(["cancel", "local", "done"]) == 0
        assert capsys.readouterr().out == "run done of local had already ended (SUCCEEDED); nothing to cancel\n"
        watch.tick(sim.site)
    assert sim.ray.stops == [] and not [e for e in sim.events if e["type"] == "run-cancelled"]
    assert cli.main(["cancel", "local", "dnoe"]) == 1  # a typo of a run that exists: named
    assert capsys.readouterr().err == "rlops cancel: no run dnoe in local (did you mean 'done'?)\n"


# -- logs --follow ---------------------------------------------------------------------------------------------------


def test_logs_follow_writes_each_new_part_of_the_output_once_until_the_job_ends(simulated, capsys):
    sim = simulated
    submitted(sim, "r1", 3, [(5 * i, i) for i in range(1, 6)], 30)
    parts = []
    assert follow.follow(sim.site, "r1", sim.site.records.get("r1")[0].current, parts.append) == "SUCCEEDED"
    assert "".join(parts) == sim.ray.logs("rlops.local.r1.1")
    assert len(parts) == 6 and all(parts), parts  # the gate's line, then each step as Ray had it

    # The command: the whole output on stdout, its exit code from how the job ended.
    submitted(sim, "fails", 3, [(5, 1)], 10, "FAILED", "JOB_ENTRYPOINT_COMMAND_FAILED")
    assert cli.main(["logs", "local", "fails", "--follow"]) == 1
    captured = capsys.readouterr()
    assert captured.out == sim.ray.logs("rlops.local.fails.1") and "step=1" in captured.out
    assert captured.err.endswith("(attempt 1 of fails ended: FAILED)\n")

    # A job Ray no longer knows (its head restarted): the copy the watcher kept when it ended.
    sim.clock.now += 60
    watch.tick(sim.site)
    del sim.ray.jobs["rlops.local.r1.1"]
    parts = []
    assert follow.follow(sim.site, "r1", sim.site.records.get("r1")[0].current, parts.append) == "SUCCEEDED"
    assert parts == [sim.site.records.log("r1", 1)] and "step=5" in parts[0]


def test_ctrl_c_stops_following_quietly_with_130_and_leaves_the_run_alone(simulated, capsys, monkeypatch):
    sim = simulated
    submitted(sim, "long", 1, [(5, 1)], 10**6)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.site, "clock", SimpleNamespace(time=sim.clock, monotonic=sim.clock, sleep=interrupted))
    capsys.readouterr()
    assert cli.main(["logs", "local", "long", "--follow"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "(attempt 1 of long, rlops.local.long.1; Ctrl-C stops following, not the run)\n"
    assert sim.ray.stops == []


# -- a run name used again; refused messages -------------------------------------------------------------------------


@pytest.fixture
def h200(state_buckets, specs, monkeypatch):
    """The h200 seed's state bucket (in fake-gcs-server), and what `rlops train` publishes to its train topic."""
    from rlops.cloud import pubsub

    published = []

    def publish(endpoints, project, topic, payload, **attributes) -> str:
        published.append(payload)
        return str(len(published))

    monkeypatch.setattr(pubsub, "publish", publish)
    env = sites.load_environment("h200")
    return SimpleNamespace(env=env, records=sites.run_records("h200", env, Endpoints.from_environment()),
                           published=published)


def started(h200, run: str, overrides: dict) -> None:
    """The record the train function writes for a run it submitted."""
    request, settings = request_of(h200.env, run, "gemma3-27b-gsm8k", overrides)
    job = jobs.request("h200", request.recipe, h200.env.recipes[request.recipe], run, settings, "tests", 1, "/lustre")
    assert h200.records.create(run_records.new(described(job), job.submission_id, time.time()))


def test_rlops_train_with_a_run_name_taken_sends_nothing(h200, capsys):
    started(h200, "r1", {"grpo.max_num_steps": 20})
    command = ["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "r1"]
    assert cli.main([*command, "--set", "grpo.max_num_steps=20"]) == 0
    assert capsys.readouterr().out == ("run r1 of h200: already submitted with these settings (PENDING, attempt 1); "
                                       "nothing sent\nfollow it with: rlops status h200 --run r1 --follow\n")
    for other, said in (("--set=grpo.max_num_steps=30", "grpo.max_num_steps=20 (this message: 30)"),
                        ("--set=grpo.seed=3", "grpo.max_num_steps=20 (this message: 10), grpo.seed=unset (this "
                                              "message: 3)")):
        assert cli.main([*command, other]) == 1
        assert capsys.readouterr().err == (f"rlops train: not sent: run r1 exists with {said}; one run name is one "
                                           "run: pick a new name to train again\n")
    assert h200.published == []
    assert cli.main(["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "r2", "--set",
                     "grpo.max_num_steps=20"]) == 0
    assert [payload["run"] for payload in h200.published] == ["r2"]


def test_a_refused_message_is_kept_by_run_and_message_id_and_status_shows_it_and_stops(h200, capsys, monkeypatch):
    from cloudevents.http import CloudEvent

    import main

    def deliver(content: dict, message_id: str) -> None:
        data = base64.b64encode(json.dumps(content).encode()).decode()
        main.train(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//tests"},
                              {"message": {"data": data, "messageId": message_id}}))

    body = {"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "ghost",
            "overrides": {"grpo.max_num_steps": 0}, "requested_by": "tests"}
    deliver(body, "41")
    deliver(body, "41")  # Pub/Sub delivers it again
    deliver({**body, "recipe": "nope", "overrides": {}}, "42")
    deliver({**body, "environment": "nowhere"}, "43")  # no environment of that name: nowhere to keep it
    deliver({**body, "run": "../ghost"}, "44")  # no run name to keep it by
    refusals = h200.records.refusals("ghost")
    assert [(r.run, r.message) for r in refusals] == [("ghost", "41"), ("ghost", "42")]
    assert refusals[0].reason == "overrides.grpo.max_num_steps: 0 is below the minimum 1"
    assert refusals[1].reason.startswith("recipe: environment h200 has no recipe 'nope'")
    assert len(list(h200.records.bucket.list_blobs(prefix=h200.records.layout.folder))) == 2

    def no_wait(seconds: float) -> None:
        raise AssertionError("status --follow waited for a run whose message was refused")

    records = run_records.RunRecords(h200.records.bucket, h200.env.state.prefix, "h200",
                                     SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=no_wait))
    monkeypatch.setattr(sites, "run_records", lambda name, env, endpoints: records)
    capsys.readouterr()
    for follows in ([], ["--follow"]):
        assert cli.main(["status", "h200", "--run", "ghost", *follows]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(" refused at ")[0] for line in lines] == ["ghost: train message 41",
                                                                      "ghost: train message 42"]
        assert lines[0].endswith(": overrides.grpo.max_num_steps: 0 is below the minimum 1")


def test_a_different_message_for_a_run_is_refused_kept_and_shown_beside_the_run(simulated, h200, capsys):
    sim = simulated
    submitted(sim, "r1", 5, [(10, 1)], 20)
    for _delivery in range(2):
        assert train.accept(sim.site, *request_of(LOCAL, "r1", overrides={"max_steps": 7}), "99") == "refused"
    (refusal,) = sim.site.records.refusals("r1")
    assert refusal.message == "99" and refusal.reason == (
        "run r1 exists with max_steps=6 (this message: 7); one run name is one run: pick a new name to train again")
    assert list(sim.ray.jobs) == ["rlops.local.r1.1"]

    # `rlops status --run` shows a refusal that came after the run started beside it, and one from before it not.
    h200.records.refuse(run_records.Refusal("r3", "1", "an earlier message, refused", time.time() - 60))
    started(h200, "r3", {})
    h200.records.refuse(run_records.Refusal("r3", "2", "a later message, refused", time.time() + 1))
    assert cli.main(["status", "h200", "--run", "r3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "ATTEMPT", "STEP", "CHECKPOINT", "REWARD", "STARTED", "DURATION",
                                "ETA"]
    assert lines[1].split()[:2] == ["r3", "PENDING"]
    assert [line.split(" refused at ")[0] for line in lines[2:]] == ["r3: train message 2"]
    assert lines[2].endswith(": a later message, refused")
    # The same as data: `--format json`, what scripts and dashboards read.
    assert cli.main(["status", "h200", "--run", "r3", "--format", "json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["state"], r["attempt"]) for r in said["runs"]] == [("r3", "PENDING", 1)]
    assert [(f["message"], f["reason"]) for f in said["refusals"]] == [("2", "a later message, refused")]


# -- --version, environments -----------------------------------------------------------------------------------------


def test_version_is_the_packages_own(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"rlops {version}\n"


def test_environments_lists_each_spec_where_it_runs_and_its_gpu_pools(specs, capsys):
    (specs / "draft.yaml").write_text("provider: gcp\n")  # being written: listed, as invalid
    assert cli.main(["environments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ENVIRONMENT", "WHERE", "GPU", "POOLS"]
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[1:]}
    assert rows == {
        "b200-spot": "rlops-b200-example/us-east1 a4-pool: a4-highgpu-8g x 8 (64 GPUs at most), spot",
        "draft": f"- invalid (10 problem(s)): rlops validate {specs / 'draft.yaml'}",
        "h200": "rlops-h200-example/us-central1 gpu-pool: a3-ultragpu-8g x 2 (16 GPUs at most), reservation "
                "h200-reservation",
        "local": "local gpu-pool: 1 Ray worker node(s) with the gpu_pool resource, counted as a3-ultragpu-8g",
        "a100": "rlops-a100-example/us-central1 a100-pool: a2-ultragpu-8g x 1 (8 GPUs at most), spot",
        "h100": "rlops-h100-tcpx-example/us-central1 a3-pool: a3-highgpu-8g x 2 (16 GPUs at most), reservation "
                "a3-high-reservation",
        "h100-mega": "rlops-h100-example/us-east4 h100-pool: a3-megagpu-8g x 2 (16 GPUs at most), spot"}

    assert cli.main(["environments", "--format", "json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert listed["h200"] == {"name": "h200", "provider": "gcp", "where": "rlops-h200-example/us-central1",
                              "file": str(specs / "h200.yaml"),
                              "gpu_pools": [{"name": "gpu-pool", "machine_type": "a3-ultragpu-8g", "nodes": 2,
                                             "gpus": 16, "capacity": "reservation h200-reservation"}]}
    assert listed["local"]["gpu_pools"][0]["counts_as"] == "a3-ultragpu-8g" and listed["local"]["where"] == "local"
    assert len(listed["draft"]["problems"]) == 10


# -- against a real Ray head -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A Ray head of its own, started as `rlops up` starts one (free ports, its own temp dir), no worker: a job's
    driver runs on the head. Stopped by its PID."""
    from rlops.local.stack import Stack

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLOPS_LOCAL_DIR", str(tmp_path_factory.mktemp("ray")))
        stack = Stack("lifecycle", LOCAL, lambda line: None)
    try:
        stack._start_head("ray-head")  # the head alone: neither the rest of the stack nor a GPU-pool worker
        yield stack.dashboard_url()
    finally:
        stack.down()


@pytest.fixture(scope="module")
def real(ray_head, gcs, tmp_path_factory):
    """The local environment on that head, its recipe allowed to pause after each step while a file exists."""
    text = (ENVIRONMENTS / "local.yaml").read_text()
    allowed = "max_steps: {type: int, min: 1, max: 50, default: 6}"
    assert allowed in text
    env = load_text(text.replace(allowed, f"{allowed}\n      pause_while: {{type: str, pattern: '[a-z]+'}}"),
                    "local", "local.yaml").environment
    endpoints = Endpoints.from_environment()
    bucket = client("rlops-local", endpoints).create_bucket(f"lifecycle-ray-{uuid.uuid4().hex[:12]}")
    events = []
    site = Site("local", env, endpoints, RayJobs(ray_head), bucket, events.append, lambda down: None,
                lambda scaled_down: None, str(tmp_path_factory.mktemp("lustre")), {}, checkpoints_here=True)
    return SimpleNamespace(site=site, events=events)


def held_run(real, run: str, max_steps: int) -> Path:
    """Run `run` submitted, holding after each step while the file this returns exists."""
    directory = Path(jobs.checkpoint_dir(real.site.env.recipes["tiny-arith"], run, real.site.lustre_root))
    directory.mkdir(parents=True)
    (directory / "hold").touch()
    request, settings = request_of(real.site.env, run, overrides={"max_steps": max_steps, "pause_while": "hold"})
    assert train.accept(real.site, request, settings) == "submitted"
    return directory / "hold"


def test_logs_follow_prints_a_real_jobs_output_while_it_runs(real, monkeypatch):
    """The job holds after its first step until the test sees that step's line come through: it ends only if the
    output was printed while it ran."""
    hold = held_run(real, "followed", 2)
    parts = []

    def write(text: str) -> None:
        parts.append(text)
        if "paused after step=1" in "".join(parts) and hold.exists():
            hold.unlink()

    deadline = time.monotonic() + 120

    def sleep(seconds: float) -> None:
        assert time.monotonic() < deadline, f"the job did not end; printed so far: {''.join(parts)[-2000:]}"
        time.sleep(seconds)

    site = replace(real.site, clock=SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=sleep))
    attempt = site.records.get("followed")[0].current
    assert follow.follow(site, "followed", attempt, write, interval=0.2) == "SUCCEEDED"
    printed = "".join(parts)
    assert printed == real.site.ray.logs(attempt.submission_id)
    assert not hold.exists() and "[rlops] done step=2" in printed and len(parts) > 1


def test_cancel_stops_a_real_ray_job_and_the_watcher_records_its_end(real):
    hold = held_run(real, "cancelled", 4)
    submission = "rlops.local.cancelled.1"
    until(lambda: "paused after step=1" in real.site.ray.logs(submission), "first step", timeout=120, poll=0.2)

    done = cancel.cancel(real.site, "cancelled", "ana")
    assert (done.cancelled, done.before, done.job) == (True, "PENDING", "STOPPED")
    job = real.site.ray.find(submission)
    assert status_of(job) == "STOPPED" and hold.exists(), "stopped, not finished"
    assert [e["run"] for e in real.events if e["type"] == "run-cancelled"] == ["cancelled"]

    changes = [c for c in watch.tick(real.site) if c["run"] == "cancelled"]
    assert [(c["attempt"], c["state"]) for c in changes] == [(1, "STOPPED")]
    record = real.site.records.get("cancelled")[0]
    assert record.state == "CANCELLED" and record.current.ended_at == job.end_time / 1000
    assert record.current.failure.kind == "stopped"
    assert "paused after step=1" in real.site.records.log("cancelled", 1)
    assert [c for c in watch.tick(real.site) if c["run"] == "cancelled"] == []
    assert [j.submission_id for j in real.site.ray.all() if (j.metadata or {}).get("rlops-run") == "cancelled"] == [
        submission]


def test_the_tick_and_checkpoint_commands_report_as_json_for_a_program(simulated, capsys):
    """Issue 39, 3: `--format json` on every command that reports, one document each."""
    sim = simulated
    submitted(sim, "done", 1, [(2, 1)], 10)
    capsys.readouterr()
    sim.clock.now = T0 + 5
    assert cli.main(["watch", "local", "--format", "json"]) == 0
    changes = json.loads(capsys.readouterr().out)
    assert changes["environment"] == "local"
    assert [(c["run"], c["attempt"], c["state"]) for c in changes["changes"]] == [("done", 1, "RUNNING")]
    assert cli.main(["snapshot", "local", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"environment": "local", "manifests": []}
    assert cli.main(["reap", "local", "--dry-run", "--format", "json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision == {"environment": "local", "scale_down": False, "dry_run": True,
                        "reason": "1 job(s) pending or running", "actions": []}
    assert cli.main(["checkpoints", "list", "local", "done", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"environment": "local", "run": "done", "checkpoints": []}


def test_status_says_step_of_total_when_it_started_how_long_it_ran_and_the_time_left(simulated, monkeypatch):
    """Issue 39, 4: while RUNNING, the step out of the recipe's total, the start, the duration and an ETA at the
    attempt's pace so far; once ended, the duration to its end and no ETA."""
    from rlops.runs.pace import Progress, progress

    sim = simulated
    submitted(sim, "eta", 10, [(20, 1), (30, 2), (40, 3)], 70)  # 6 steps (the local recipe's max_steps)
    sim.clock.now = T0 + 45
    watch.tick(sim.site)
    record = sim.site.records.get("eta")[0]
    assert record.current.started_at == T0 + 10 and record.step == 3
    assert progress(record, T0 + 45) == Progress(total=6, started_at=T0 + 10, seconds=35, eta_seconds=35)
    header, row = cli_runs._table([record], T0 + 45).splitlines()
    assert row.split()[3:] == ["3/6", "-", str(record.reward), time.strftime("%m-%d", time.gmtime(T0 + 10)),
                               time.strftime("%H:%M", time.gmtime(T0 + 10)), "35s", "35s"]
    sim.clock.now = T0 + 80
    watch.tick(sim.site)
    record = sim.site.records.get("eta")[0]
    assert record.state == "SUCCEEDED"
    assert progress(record, T0 + 500) == Progress(total=6, started_at=T0 + 10, seconds=60, eta_seconds=None)


def test_report_of_one_run_carries_its_metadata_and_of_several_compares_them(simulated, capsys, tmp_path):
    """Issue 39, 4: `rlops report ENV RUN` draws the run's page as before, now with who asked, the image, the spec
    commit (honestly unknown here) and every metric it logged; `rlops report ENV RUN1 RUN2` compares the runs."""
    from rlops.runs import progress

    sim = simulated
    submitted(sim, "high", 1, [(2, 1), (3, 2), (4, 3)], 10)
    submitted(sim, "low", 1, [(2, 1), (3, 2)], 10)
    for now in (T0 + 5, T0 + 20):
        sim.clock.now = now
        watch.tick(sim.site)
    for run, entropy in (("high", 0.7), ("low", 0.9)):  # what the local recipe's metrics lines give the series
        sim.site.records.add_metrics(run, 1, lambda old, e=entropy: progress.merged(
            old, {"metrics": [[1, {"entropy": e}], [2, {"entropy": e - 0.1}]]}))
    capsys.readouterr()

    assert cli.main(["report", "local", "high", "--output", str(tmp_path / "one")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"report: {tmp_path / 'one' / 'report.md'}"
    assert f"plot: {tmp_path / 'one' / 'metric-entropy.png'}" in printed
    page = (tmp_path / "one" / "report.md").read_text()
    assert "- requested by: tests\n- image: local (the Ray head of this machine)\n- spec commit: not recorded" in page
    assert "W&B" not in page and "| entropy | 0.6 | 0.6 | 0.7 | 2 |" in page and "| max_steps | 6 |" in page

    assert cli.main(["report", "local", "high", "low", "high", "--output", str(tmp_path / "both")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"report: {tmp_path / 'both' / 'report.md'}"
    assert [Path(line.removeprefix("plot: ")).name for line in printed[1:]] == [
        "reward.png", "step-time.png", "loss.png", "metric-entropy.png"]
    page = (tmp_path / "both" / "report.md").read_text()
    assert page.startswith("# Comparing high, low\n")
    assert "| high | tiny-arith | SUCCEEDED | 3/6 |" in page and "| low | tiny-arith | SUCCEEDED | 2/6 |" in page
    assert "| entropy | 0.6 (0.6 to 0.7) | 0.8 (0.8 to 0.9) |" in page

    assert cli.main(["report", "local", "high", "hgih"]) == 1
    assert capsys.readouterr().err == "rlops report: no run hgih in local (did you mean 'high'?)\n"
