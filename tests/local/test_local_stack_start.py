"""How `rlops up local` waits for a Ray node to join: the head's state API, asked over HTTP as Ray's dashboard
answers it (a loopback server here), is "not yet" while it answers 5xx or nothing, and an error otherwise; a worker
whose `ray start` gave up because the head did not register it in time is started again."""

import os
import signal
import stat
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ENVIRONMENTS
from fakes.jsonhttp import reply
from rlops.errors import Failure
from rlops.local import processes
from rlops.local.readiness import node_alive
from rlops.local.stack import NODE_START_ATTEMPTS, Stack
from rlops.spec.load import load_or_raise

pytestmark = pytest.mark.servers


class _StateApi(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict]] = []

    def do_GET(self):
        reply(self, *self.answers.pop(0))

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StateApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def nodes(*named: str) -> dict:
    return {"data": {"result": {"result": [{"state": "ALIVE", "labels": {"rlops-node": name}} for name in named]}}}


def test_a_state_api_that_answers_500_while_the_head_starts_is_not_yet_then_the_node_is_seen(dashboard):
    _StateApi.answers = [(500, {"msg": "Failed to get cluster status"}), (200, nodes("ray-head")),
                         (200, nodes("ray-head", "ray-worker-0"))]
    assert [node_alive(dashboard, "ray-worker-0") for _ in range(3)] == [False, False, True]


def test_a_state_api_that_refuses_the_request_is_an_error_not_a_wait(dashboard):
    _StateApi.answers = [(404, {"msg": "no such route"})]
    with pytest.raises(urllib.error.HTTPError):
        node_alive(dashboard, "ray-worker-0")


def test_no_answer_at_all_is_not_yet():
    assert node_alive("http://127.0.0.1:9", "ray-worker-0") is False  # the discard port: nothing listens


# -- a worker that misses Ray's window to register -------------------------------------------------------------------

# What Ray 2.60's `ray start` of a worker does when its head does not register the node within 30 s
# (`raylet_start_wait_time_s` in ray/_private/node.py): it prints this and exits 1, its raylet left running. Each
# start is counted; the first {misses} miss the window, a later one joins (its node then listed alive) and blocks.
STAND_IN_RAY = """#!/bin/sh
echo started >> {starts}
if [ "$(wc -l < {starts})" -le {misses} ]; then
  sleep 600 &
  echo $! >> {left_behind}
  echo "{message}"
  exit 1
fi
touch {joined}
exec sleep 600
"""
MISSED = ("Exception: The current node timed out during startup. This could happen because some of the raylet "
          "failed to startup or the GCS has become overloaded.")


class _JoiningStateApi(BaseHTTPRequestHandler):
    joined: Path

    def do_GET(self):
        reply(self, 200, nodes("ray-head", *(["ray-worker-0"] if self.joined.exists() else [])))

    def log_message(self, *args):
        pass


@pytest.fixture
def worker_start(tmp_path, monkeypatch):
    """A Stack of the local spec whose head is a stand-in process and a loopback state API, and whose `ray` is the
    stand-in above; `start(misses, message)` starts its worker. Every process is stopped by its PID."""
    monkeypatch.setenv("RLOPS_LOCAL_DIR", str(tmp_path / "state"))
    _JoiningStateApi.joined = tmp_path / "joined"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JoiningStateApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lines: list[str] = []
    stack = Stack("local", load_or_raise(ENVIRONMENTS / "local.yaml"), lines.append)
    head = processes.start("ray-head", ["sleep", "600"], tmp_path / "head.log", dict(os.environ),
                           {"gcs": processes.free_port(), "dashboard": server.server_address[1]})
    stack.registry.save({"ray-head": head})

    def start(misses: int, message: str = MISSED):
        stack.ray = str(tmp_path / "ray")
        Path(stack.ray).write_text(STAND_IN_RAY.format(starts=tmp_path / "starts", misses=misses, message=message,
                                                       left_behind=tmp_path / "left-behind",
                                                       joined=_JoiningStateApi.joined))
        Path(stack.ray).chmod(stat.S_IRWXU)
        return stack._start_worker("ray-worker-0")

    try:
        yield start, stack, lines, tmp_path
    finally:
        stack.down()
        for pid in _left_behind(tmp_path):
            if _running(pid):  # only when the test failed
                os.kill(pid, signal.SIGKILL)
        server.shutdown()
        server.server_close()


def _left_behind(tmp: Path) -> list[int]:
    return [int(pid) for pid in (tmp / "left-behind").read_text().split()] if (tmp / "left-behind").exists() else []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_that_missed_rays_window_to_register_is_started_again_and_what_it_left_is_stopped(worker_start):
    start, stack, lines, tmp = worker_start
    worker = start(misses=NODE_START_ATTEMPTS - 1)
    assert worker.alive() and stack.processes()["ray-worker-0"] == worker
    assert len((tmp / "starts").read_text().splitlines()) == NODE_START_ATTEMPTS
    left_behind = _left_behind(tmp)
    assert len(left_behind) == NODE_START_ATTEMPTS - 1 and not any(_running(pid) for pid in left_behind)
    assert [line for line in lines if "starting it again" in line] == [
        f"ray-worker-0: did not register with the Ray head within Ray's 30 s (a busy machine); starting it again "
        f"({attempt} of {NODE_START_ATTEMPTS})" for attempt in range(2, NODE_START_ATTEMPTS + 1)]


def test_a_worker_that_misses_the_window_every_time_fails_with_its_log_after_the_last_attempt(worker_start):
    start, stack, lines, tmp = worker_start
    with pytest.raises(Failure, match="ray-worker-0 exited while starting(.|\\n)*timed out during startup"):
        start(misses=NODE_START_ATTEMPTS)
    assert len((tmp / "starts").read_text().splitlines()) == NODE_START_ATTEMPTS


def test_a_worker_that_fails_for_another_reason_is_not_started_again(worker_start):
    start, stack, lines, tmp = worker_start
    with pytest.raises(Failure, match="Failed to connect to GCS"):
        start(misses=1, message="ConnectionError: Failed to connect to GCS at address 127.0.0.1:1")
    assert len((tmp / "starts").read_text().splitlines()) == 1
