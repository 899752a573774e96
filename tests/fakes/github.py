"""A fake GitHub REST API (the parts the plan pipeline uses) for the real urllib client, on 127.0.0.1.

Issue comments (list with pagination, create, edit, delete) and labels of one pull request, the
65,536-character body limit, a bearer token it checks, and a request log the tests read.
"""

import itertools
import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from fakes.jsonhttp import JsonServer, reply

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

    def _handle(self, http) -> None:
        parts = urlsplit(http.path)
        length = int(http.headers.get("Content-Length") or 0)
        body = json.loads(http.rfile.read(length)) if length else None
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
            return 200, [{"name": name} for name in self.labels.get(int(pull_path.group(1)), [])]
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
