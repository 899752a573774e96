"""Adapters whose requests are written down instead of sent: what `apply --dry-run` prints.

The apply path runs over them as it would over the APIs: every request is answered as if it had
finished at once (a long-running operation done, without error), and the changing ones (not the
GETs that poll operations) are written down.
"""

import json
from urllib.parse import parse_qsl, urlencode, urlsplit

import httplib2
import requests
import requests.adapters
from google.auth.credentials import AnonymousCredentials

from rlops.cloud import adapters
from rlops.cloud.base import Connection, ResourceAdapter, Target

# An operation that has finished, in each API's words: Compute's and GKE's `status`, a long-running
# operation's `done` with its `response` (Lustre's is the instance; Service Networking reads only `done`).
# Each client ignores the fields that are not its own.
DONE = json.dumps({"name": "operation-recorded", "status": "DONE", "done": True,
                   "response": {"@type": "type.googleapis.com/google.cloud.lustre.v1.Instance"}}).encode()


def _line(method: str, url: str, body: str | bytes | None) -> str:
    parts = urlsplit(url)
    # `$alt=json;enum-encoding=int` is how the client wants answers, not what it asks for.
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in ("$alt", "alt")]
    if isinstance(body, bytes):
        body = body.decode()
    parsed = json.loads(body) if body else None
    target = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")
    return f"{method} {target}" + (f" {json.dumps(parsed, sort_keys=True)}" if parsed else "")


class _RecordingTransport(requests.adapters.BaseAdapter):
    def __init__(self, transcript: list[str]):
        super().__init__()
        self.transcript = transcript

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        # A prepared request has its method and URL; the clients send JSON (str or bytes), never a stream.
        method, url, body = str(request.method), str(request.url), request.body
        if method != "GET":
            self.transcript.append(_line(method, url, body if isinstance(body, (str, bytes)) else None))
        response = requests.Response()
        response.status_code = 200
        response._content = DONE
        response.headers["Content-Type"] = "application/json"
        response.request = request
        response.url = url
        return response

    def close(self) -> None:
        pass


class _RecordingHttp:
    """Enough of httplib2.Http for google-api-python-client."""

    def __init__(self, transcript: list[str]):
        self.transcript = transcript

    def request(self, uri: str, method: str = "GET", body: str | bytes | None = None,
                headers: dict[str, str] | None = None, **kwargs: object) -> tuple[httplib2.Response, bytes]:
        if method != "GET":
            self.transcript.append(_line(method, uri, body))
        return httplib2.Response({"status": "200", "content-type": "application/json"}), DONE


def recording_adapters(target: Target, transcript: list[str]) -> dict[str, ResourceAdapter]:
    by_kind = adapters(target, Connection(credentials=AnonymousCredentials()),
                       http_for_discovery=_RecordingHttp(transcript))
    transport = _RecordingTransport(transcript)
    for adapter in set(by_kind.values()):
        for client in vars(adapter).values():
            session = getattr(getattr(client, "_transport", None), "_session", None)
            if session is not None:
                session.mount("https://", transport)
                session.mount("http://", transport)
    return by_kind
