"""A fake GitHub (the parts the pipelines use) for the real urllib client and the real git, on 127.0.0.1.

The REST API: issue comments (list with pagination, create, edit, delete) and labels (paginated, 30
a page by default) of a pull request, the 65,536-character body limit, a bearer token it checks.
Private repositories over git's smart HTTP, served by git's own `git http-backend`: only with the
token as HTTP Basic credentials (`x-access-token:TOKEN`, what GitHub takes for app and personal
tokens); without it, 401 and `WWW-Authenticate`, as github.com answers for a private repository.
And a request log the tests read.
"""

import base64
import itertools
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fakes.jsonhttp import JsonServer, reply, request_body

LIMIT = 65_536


@dataclass
class Request:
    method: str
    path: str
    authorization: str
    body: dict | None
    status: int = 0


class FakeGitHub:
    def __init__(self, token: str):
        self.token = token
        self.comments: dict[int, dict] = {}   # id -> {"id", "pull", "body"}
        self.labels: dict[int, list[str]] = {}
        self.git_root: Path | None = None    # holds OWNER/NAME.git bare repositories, served to the token only
        self.requests: list[Request] = []
        self._ids = itertools.count(1001)
        self._server = None

    def __enter__(self) -> "FakeGitHub":
        self._server = JsonServer(self._handle, "fake-github")
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return self._server.url

    def comments_on(self, pull: int) -> list[str]:
        return [c["body"] for c in sorted(self.comments.values(), key=lambda c: c["id"]) if c["pull"] == pull]

    def clone_url(self, repository: str) -> str:
        return f"{self.url}/{repository}.git"

    def _handle(self, http) -> None:
        parts = urlsplit(http.path)
        if re.match(r"/[^/]+/[^/]+\.git/", parts.path):
            self._git(http, parts)
            return
        raw = request_body(http)
        body = json.loads(raw) if raw else None
        request = Request(http.command, parts.path, http.headers.get("Authorization", ""), body)
        self.requests.append(request)
        status, answer = self._route(request, {k: v[0] for k, v in parse_qs(parts.query).items()})
        request.status = status
        if status == 204:
            http.send_response(204)
            http.send_header("Content-Length", "0")
            http.end_headers()
            return
        reply(http, status, answer)

    def _route(self, request: Request, query: dict):
        if request.authorization != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}
        pull_path = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/(comments|labels)", request.path)
        comment_path = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", request.path)
        if pull_path and pull_path.group(2) == "labels" and request.method == "GET":
            size, page = int(query.get("per_page", 30)), int(query.get("page", 1))
            names = self.labels.get(int(pull_path.group(1)), [])
            return 200, [{"name": name} for name in names[(page - 1) * size: page * size]]
        if pull_path and request.method == "GET":
            pull = int(pull_path.group(1))
            size, page = int(query.get("per_page", 30)), int(query.get("page", 1))
            mine = [c for c in sorted(self.comments.values(), key=lambda c: c["id"]) if c["pull"] == pull]
            return 200, [{"id": c["id"], "body": c["body"]} for c in mine[(page - 1) * size: page * size]]
        if pull_path and request.method == "POST":
            if len(request.body["body"]) > LIMIT:
                return 422, {"message": "Validation Failed", "errors": [{"message": "body is too long (maximum is "
                                                                                    "65536 characters)"}]}
            comment = {"id": next(self._ids), "pull": int(pull_path.group(1)), "body": request.body["body"]}
            self.comments[comment["id"]] = comment
            return 201, {"id": comment["id"], "body": comment["body"]}
        if comment_path and int(comment_path.group(1)) in self.comments:
            comment = self.comments[int(comment_path.group(1))]
            if request.method == "PATCH":
                if len(request.body["body"]) > LIMIT:
                    return 422, {"message": "Validation Failed"}
                comment["body"] = request.body["body"]
                return 200, {"id": comment["id"], "body": comment["body"]}
            if request.method == "DELETE":
                del self.comments[comment["id"]]
                return 204, None
        return 404, {"message": "Not Found"}

    def _git(self, http, parts) -> None:
        """git's smart HTTP through `git http-backend` (CGI), for the token's holder only."""
        credentials = http.headers.get("Authorization", "")
        wanted = "Basic " + base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
        self.requests.append(Request(http.command, parts.path, credentials, None,
                                     401 if credentials != wanted else 200))
        if credentials != wanted:
            http.send_response(401)
            http.send_header("WWW-Authenticate", 'Basic realm="GitHub"')
            http.send_header("Content-Length", "0")
            http.end_headers()
            return
        if http.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(http.rfile.readline().strip() or b"0", 16):
                body += http.rfile.read(size)
                http.rfile.readline()
            http.rfile.readline()
        else:
            body = request_body(http)
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(self.git_root), "GIT_HTTP_EXPORT_ALL": "1",
               "PATH_INFO": parts.path, "QUERY_STRING": parts.query, "REQUEST_METHOD": http.command,
               "CONTENT_TYPE": http.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "GIT_PROTOCOL": http.headers.get("Git-Protocol", ""),
               "HTTP_CONTENT_ENCODING": http.headers.get("Content-Encoding", ""), "REMOTE_USER": "x-access-token"}
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        headers = [line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line]
        status = int(next((v.split()[0] for k, v in headers if k == "Status"), "200"))
        http.send_response(status)
        for key, value in headers:
            if key != "Status":
                http.send_header(key, value)
        http.send_header("Content-Length", str(len(payload)))
        http.end_headers()
        http.wfile.write(payload)
