"""Cloud Storage's IAM in front of fake-gcs-server (which checks none): every JSON-API request is made as the
principal whose token it carries (tests/fakes/iam.py) and refused 403 unless its roles on the bucket or the
project grant what the method needs; allowed requests go to fake-gcs-server as they came.

What each request needs is Google's table for the JSON API (storage.* in the vendored methods.json), with the
one rule that depends on the bucket's content (cloud.google.com/storage/docs/access-control/iam-json, "objects
insert": storage.objects.create, "plus storage.objects.delete ... if the object already exists", the overwrite
an `ifGenerationMatch=0` rules out). `b/BUCKET/iam/testPermissions` is answered here from the policy, as Cloud
Storage answers it for any caller.
"""

import json
import re
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, quote, urlsplit

from fakes.iam import Denied, Iam, method_permissions
from fakes.jsonhttp import JsonServer, reply, request_body

_ROUTES = [  # (HTTP method, path under /storage/v1 or /upload/storage/v1 or /download/storage/v1, JSON API method)
    ("GET", r"/b", "storage.buckets.list"), ("POST", r"/b", "storage.buckets.insert"),
    ("GET", r"/b/(?P<bucket>[^/]+)", "storage.buckets.get"),
    ("GET", r"/b/(?P<bucket>[^/]+)/iam/testPermissions", "storage.buckets.testIamPermissions"),
    ("GET", r"/b/(?P<bucket>[^/]+)/o", "storage.objects.list"),
    ("POST", r"/b/(?P<bucket>[^/]+)/o", "storage.objects.insert"),
    ("GET", r"/b/(?P<bucket>[^/]+)/o/(?P<object>.+)", "storage.objects.get"),
    ("DELETE", r"/b/(?P<bucket>[^/]+)/o/(?P<object>.+)", "storage.objects.delete"),
    ("PATCH", r"/b/(?P<bucket>[^/]+)/o/(?P<object>.+)", "storage.objects.patch"),
    ("PUT", r"/b/(?P<bucket>[^/]+)/o/(?P<object>.+)", "storage.objects.update"),
]


class GcsIam:
    """A proxy on 127.0.0.1 to the fake-gcs-server at `upstream` (http://host:port), enforcing `iam` (None: every
    caller may do anything, as a project's owner; testPermissions still answered, which fake-gcs-server lacks)."""

    def __init__(self, iam: Iam | None, upstream: str):
        self.iam, self.upstream = iam, urlsplit(upstream)
        self._server = JsonServer(self._handle, "gcs-iam")

    @property
    def url(self) -> str:
        return self._server.url

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> "GcsIam":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        raw = request_body(http)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        path = re.sub(r"^/(upload/|download/)?storage/v1", "", parts.path)
        method = next(((m, found) for verb, pattern, m in _ROUTES if verb == http.command
                       and (found := re.fullmatch(pattern, path))), None)
        member = ""
        try:
            if self.iam is None:
                if method and method[0] == "storage.buckets.testIamPermissions":
                    self._answer_test(http, parts.query, method[1]["bucket"], lambda permission: True)
                    return
                self._forward(http, raw)
                return
            member = self.iam.caller(http.headers.get("Authorization"))
            if method is None:
                raise Denied(403, "PERMISSION_DENIED", f"{http.command} {parts.path} is not a method this fake knows",
                             [])
            name, found = method
            bucket = found.groupdict().get("bucket")
            resource = f"projects/_/buckets/{bucket}" if bucket else f"projects/{self.iam.project}"
            if name == "storage.buckets.testIamPermissions":
                self._answer_test(http, parts.query, bucket, lambda p: self.iam.holds(member, p, resource))
                return
            needed = method_permissions()[name]
            if name == "storage.objects.insert":
                needed = ("storage.objects.create",) + (
                    ("storage.objects.delete",) if self._exists(bucket, self._object_name(query, raw), query) else ())
            self.iam.check(member, needed, resource, "storage.googleapis.com")
        except Denied as denied:
            # Cloud Storage's wording: "EMAIL does not have storage.objects.delete access to the Google Cloud
            # Storage object. Permission 'storage.objects.delete' denied on resource (or it may not exist)."
            message = (f"{member.split(':', 1)[-1]} does not have {denied.details[0]['metadata']['permission']} "
                       f"access to the Google Cloud Storage bucket or object. {denied.message}"
                       if denied.details else denied.message)
            reply(http, denied.code, {"error": {"code": denied.code, "message": message, "errors": [
                {"message": message, "domain": "global",
                 "reason": "forbidden" if denied.code == 403 else "required"}]}})
            return
        self._forward(http, raw)

    def _answer_test(self, http: BaseHTTPRequestHandler, query: str, bucket: str, holds) -> None:
        """buckets.testIamPermissions: 404 for a bucket that does not exist, else the asked permissions held."""
        if self._status(f"/storage/v1/b/{bucket}") == 404:
            reply(http, 404, {"error": {"code": 404, "message": "The specified bucket does not exist.",
                                        "errors": [{"domain": "global", "reason": "notFound",
                                                    "message": "The specified bucket does not exist."}]}})
            return
        held = [p for p in parse_qs(query).get("permissions", []) if holds(p)]
        reply(http, 200, {"kind": "storage#testIamPermissionsResponse", **({"permissions": held} if held else {})})

    def _object_name(self, query: dict, raw: bytes) -> str | None:
        """An upload's object name: the `name` parameter, or the metadata part of a multipart upload."""
        if "name" in query:
            return query["name"]
        found = re.search(rb"\{.*?\}", raw, re.DOTALL)
        try:
            return json.loads(found[0]).get("name") if found else None
        except ValueError:
            return None

    def _exists(self, bucket: str, name: str | None, query: dict) -> bool:
        if name is None or query.get("ifGenerationMatch") == "0":
            return False
        return self._status(f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}") == 200

    def _status(self, path: str) -> int:
        connection = HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            connection.request("GET", path)
            answer = connection.getresponse()
            answer.read()
            return answer.status
        finally:
            connection.close()

    def _forward(self, http: BaseHTTPRequestHandler, raw: bytes) -> None:
        connection = HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in http.headers.items() if k.lower() not in ("host", "authorization",
                                                                                  "content-length")}
            connection.request(http.command, http.path, body=raw, headers=headers)
            answer = connection.getresponse()
            payload = answer.read()
        finally:
            connection.close()
        http.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                http.send_header(key, value)
        http.send_header("Content-Length", str(len(payload)))
        http.end_headers()
        http.wfile.write(payload)

