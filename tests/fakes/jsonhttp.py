"""What the fakes share: a JSON-over-HTTP server on 127.0.0.1 that the real client libraries can hammer."""

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonServer:
    """Serves every request with `handle(handler)`; stopped by `stop()` (its own thread, never a kill by name)."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler], None], name: str):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as the clients expect
            disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK stall

            def log_message(self, *args):
                pass

            def serve(self):
                try:
                    handle(self)
                except Incomplete:
                    self.close_connection = True

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = serve

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # the default backlog of 5 drops a parallel plan's connects

            def handle_error(self, request, client_address):
                pass  # a client killed mid-request (the crash tests do that) is not the fake's error

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True, name=name)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class Incomplete(Exception):
    """The client closed its connection before sending the body its Content-Length announced (a process killed
    mid-request): "the recipient MUST consider the message to be incomplete and close the connection" (RFC 9112,
    section 6.3), so no server acts on it."""


def request_body(http: BaseHTTPRequestHandler) -> bytes:
    """The request's body, whole, or `Incomplete`."""
    length = int(http.headers.get("Content-Length") or 0)
    raw = http.rfile.read(length) if length else b""
    if len(raw) < length:
        raise Incomplete
    return raw


def reply(http: BaseHTTPRequestHandler, status: int, answer: dict) -> None:
    payload = json.dumps(answer).encode()
    http.send_response(status)
    http.send_header("Content-Type", "application/json; charset=UTF-8")
    http.send_header("Content-Length", str(len(payload)))
    http.end_headers()
    http.wfile.write(payload)
