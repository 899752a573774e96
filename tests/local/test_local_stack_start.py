"""How `rlops up local` waits for a Ray node to join: the head's state API, asked over HTTP as Ray's dashboard
answers it (a loopback server here), is "not yet" while it answers 5xx or nothing, and an error otherwise."""

import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fakes.jsonhttp import reply
from rlops.local.stack import _node_alive

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
    assert [_node_alive(dashboard, "ray-worker-0") for _ in range(3)] == [False, False, True]


def test_a_state_api_that_refuses_the_request_is_an_error_not_a_wait(dashboard):
    _StateApi.answers = [(404, {"msg": "no such route"})]
    with pytest.raises(urllib.error.HTTPError):
        _node_alive(dashboard, "ray-worker-0")


def test_no_answer_at_all_is_not_yet():
    assert _node_alive("http://127.0.0.1:9", "ray-worker-0") is False  # the discard port: nothing listens
