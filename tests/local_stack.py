"""The local environment as the local-loop tests meet it, and what those test modules share: `rlops up local` in a
folder of its own (a Ray head and a GPU-pool worker node, fake-gcs-server, the Pub/Sub emulator, functions-framework),
once for each test module that asks for `local`. tests/conftest.py loads this file as a plugin, so its module-scoped
fixtures are one per module. `make test` (`--dist loadgroup`) runs the four such modules in two `xdist_group`s, two
modules one after the other on each of two workers: a module starts its stack once, and no more than two stacks run at
once. Four at once on two cores starved Ray: a node starting then missed the 30 s Ray gives it to register with its
head (`raylet_start_wait_time_s` in ray/_private/node.py), and the late-GPU test's three minutes took nine.
"""

import base64
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import REPO, until
from rlops.local import processes

RLOPS = str(Path(sys.executable).parent / "rlops")
TOKEN = "hf_PLANTEDlocalTOKEN0123456789abcdefXYZ"
LONG_RUN_STEPS = 120
IDLE_TIMEOUT_SECONDS = 3  # the local spec's idle timeout in these modules


class Local:
    def __init__(self, root: Path, start_lock: Path):
        self.root, self.start_lock = root, start_lock
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

    def up(self, env: str = "local") -> subprocess.CompletedProcess:
        """`rlops up ENV`, while no other xdist worker starts Ray nodes (a starting node has 30 s to register with its
        head, see above). The lock file is in the folder that holds every worker's temporary folder."""
        with open(self.start_lock, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self.rlops("up", env)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

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
    stack = Local(root, tmp_path_factory.getbasetemp().parent / "local-stack-start.lock")
    try:
        stack.up()
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



def jobs_of_run(local: Local, run: str) -> list[str]:
    """The submission ids of a run's jobs, its attempts in order."""
    return sorted((j.submission_id for j in local.jobs_of(run)), key=lambda i: int(i.rsplit(".", 1)[1]))



def token_file_of(pid: int) -> str | None:
    """The token in the file a Ray node's HF_TOKEN_PATH names; none (and the test fails) if its environment holds the
    token itself."""
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert TOKEN.encode() not in environ
    path = dict(entry.split(b"=", 1) for entry in environ.split(b"\0") if b"=" in entry).get(b"HF_TOKEN_PATH")
    return Path(path.decode()).read_text() if path else None



def no_planted_token(local: Local, lost: set[str]) -> None:
    """The planted token is in no job (its entrypoint, metadata or log), run record, kept log, event or log file of
    this module's stack, and where it belongs: in the file the GPU-pool worker is pointed at. `lost`: the attempts
    whose node was stopped under them (their output went with it, so none was kept)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    jobs = client.list_jobs()
    assert jobs
    logs_read = 0
    for job in jobs:
        assert TOKEN not in json.dumps(job.model_dump(), default=str)
        try:
            logs = client.get_job_logs(job.submission_id)
        except RuntimeError as error:  # a job whose node was lost (a preemption test's): its logs went with it
            assert "Cannot connect" in str(error)
            continue
        logs_read += 1
        assert TOKEN not in logs
    assert logs_read >= 1
    kept = {blob.name for blob in local.bucket().list_blobs() if blob.name.endswith(".log")}
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
    # its data steps write them on GKE, from a file the gate's check reads (tests/spec/test_reward_check.py runs the
    # steps).
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

