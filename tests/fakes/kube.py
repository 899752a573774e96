"""A fake Kubernetes API server for the official kubernetes client, over HTTP on 127.0.0.1.

It serves the kinds rlops applies: get, list (with label selectors), create (409 when present),
delete (404 when absent), server-side apply (PATCH application/apply-patch+yaml with a field
manager: the applied fields replace what that manager applied before, the rest is kept),
resourceVersion and generation (bumped only when the object changes), the status subresource
(so a test can play the controller: `set_status`), the service proxy
(`/api/v1/namespaces/NS/services/NAME:PORT/proxy/...`, forwarded to what `services` maps the
service to: a test points the Ray head's dashboard service at a real local Ray) and a request log.
"""

import base64
import copy
import itertools
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from fakes.jsonhttp import JsonServer, reply

# plural -> (kind, api group/version, namespaced)
RESOURCES = {
    "secrets": ("Secret", "v1", True),
    "serviceaccounts": ("ServiceAccount", "v1", True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1", True),
    "persistentvolumes": ("PersistentVolume", "v1", False),
    "daemonsets": ("DaemonSet", "apps/v1", True),
    "rayclusters": ("RayCluster", "ray.io/v1", True),
    "gkenetworkparamsets": ("GKENetworkParamSet", "networking.gke.io/v1", False),
    "networks": ("Network", "networking.gke.io/v1", False),
}


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    body: object
    status: int = 0


class FakeKube:
    def __init__(self, controller_delay: float | None = None):
        # Set: play the controllers too; a DaemonSet or RayCluster reports ready this long after its last change.
        self.controller_delay = controller_delay
        self._ready_at: dict[tuple[str, str, str], float] = {}
        self.objects: dict[tuple[str, str, str], dict] = {}   # (plural, namespace or "", name) -> object
        self.applied: dict[tuple[str, str, str], dict[str, dict]] = {}  # per object: field manager -> its last apply
        self.requests: list[Request] = []
        self.services: dict[tuple[str, str], str] = {}  # (namespace, "name:port") -> the URL it proxies to
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self._server = None

    # -- lifecycle and test hooks -----------------------------------------------------------
    def start(self) -> "FakeKube":
        self._server = JsonServer(self._handle, "fake-kube")
        return self

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        return self._server.url

    def get(self, plural: str, name: str, namespace: str = "") -> dict | None:
        with self._lock:
            found = self.objects.get((plural, namespace, name))
            return copy.deepcopy(found)

    def put(self, obj: dict, plural: str) -> None:
        """Create an object as another tool would (no field manager of rlops's)."""
        with self._lock:
            key = (plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            self.objects[key] = self._stamp(copy.deepcopy(obj), None)

    def set_status(self, plural: str, name: str, status: dict, namespace: str = "") -> None:
        """What a controller would write: the DaemonSet's ready counts, the RayCluster's state."""
        with self._lock:
            self.objects[(plural, namespace, name)]["status"] = status

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method in ("POST", "PUT", "PATCH", "DELETE") and 200 <= r.status < 300]

    # -- HTTP -------------------------------------------------------------------------------
    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        length = int(http.headers.get("Content-Length") or 0)
        raw = http.rfile.read(length) if length else b""
        content_type = http.headers.get("Content-Type", "")
        segments = parts.path.split("/")
        if segments[1:4] == ["api", "v1", "namespaces"] and segments[5:6] == ["services"] and segments[7:8] == ["proxy"]:
            self.requests.append(Request(http.command, parts.path, {}, content_type, None))
            self._proxy(http, segments[4], segments[6], "/" + "/".join(segments[8:]), parts.query, raw)
            return
        body = json.loads(raw) if raw.strip() else None  # JSON is what the client sends, also for apply-patch+yaml
        request = Request(http.command, parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}, content_type, body)
        self.requests.append(request)
        with self._lock:
            status, answer = self._route(request)
        request.status = status
        reply(http, status, answer)

    def _proxy(self, http: BaseHTTPRequestHandler, namespace: str, service: str, path: str, query: str,
               raw: bytes) -> None:
        """The API server's service proxy: the request, as it came, to the service; its answer, as it came."""
        import urllib.error
        import urllib.request

        upstream = self.services.get((namespace, service))
        if upstream is None:
            reply(http, 404, _status(404, "NotFound", f'services "{service.split(":")[0]}" not found')[1])
            return
        request = urllib.request.Request(upstream + path + (f"?{query}" if query else ""), data=raw or None,
                                         method=http.command,
                                         headers={"Content-Type": http.headers.get("Content-Type", "application/json")})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, body, kind = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            status, body, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        except OSError as error:
            reply(http, 503, _status(503, "ServiceUnavailable", f"error trying to reach service: {error}")[1])
            return
        http.send_response(status)
        http.send_header("Content-Type", kind or "application/octet-stream")
        http.send_header("Content-Length", str(len(body)))
        http.end_headers()
        http.wfile.write(body)

    def _route(self, request: Request) -> tuple[int, dict]:
        parts = [p for p in request.path.split("/") if p]
        # /api/v1/... or /apis/GROUP/VERSION/...
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES:
            return _status(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        plural, name, subresource = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if name is None:
            if request.method == "GET":
                return 200, self._list(plural, namespace, request.query.get("labelSelector", ""))
            if request.method == "POST":
                return self._create(plural, namespace, request.body)
        key = (plural, namespace, name)
        if request.method == "GET":
            self._play_controller(key)
            found = self.objects.get(key)
            return (200, found) if found else _status(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "DELETE":
            if self.objects.pop(key, None) is None:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            self.applied.pop(key, None)
            return _status(200, "Success", "deleted")
        if request.method == "PATCH" and subresource is None and request.content_type.startswith(
                "application/json-patch+json"):
            return self._json_patch(key, request.body)
        if request.method == "PATCH" and subresource is None:
            return self._apply(plural, namespace, name, request)
        if request.method in ("PUT", "PATCH") and subresource == "status" and key in self.objects:
            self.objects[key]["status"] = (request.body or {}).get("status", {})
            return 200, self.objects[key]
        return _status(405, "MethodNotAllowed", f"{request.method} {request.path}")

    def _json_patch(self, key: tuple[str, str, str], operations: list[dict]) -> tuple[int, dict]:
        """RFC 6902 `replace` (what the reaper sends): every path must exist, or nothing changes (422)."""
        current = self.objects.get(key)
        if current is None:
            return _status(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        patched = copy.deepcopy(current)
        for operation in operations:
            *parents, last = [int(p) if p.isdigit() else p for p in operation["path"].strip("/").split("/")]
            target = patched
            try:
                for part in parents:
                    target = target[part]
                target[last]  # noqa: B018 - replace needs the member to exist
            except (KeyError, IndexError, TypeError):
                return _status(422, "Invalid", f"the server rejected our request: {operation['path']} does not exist")
            if operation["op"] != "replace":
                return _status(422, "Invalid", f"unsupported op {operation['op']}")
            target[last] = operation["value"]
        self.objects[key] = self._stamp(patched, current)
        return 200, self.objects[key]

    def _list(self, plural: str, namespace: str, selector: str) -> dict:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        kind, version, _ = RESOURCES[plural]
        items = [obj for (p, ns, _), obj in self.objects.items()
                 if p == plural and (not namespace or ns == namespace)
                 and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        return {"apiVersion": version, "kind": f"{kind}List", "metadata": {"resourceVersion": str(next(self._versions))},
                "items": items}

    def _create(self, plural: str, namespace: str, body: dict) -> tuple[int, dict]:
        key = (plural, namespace, body["metadata"]["name"])
        if key in self.objects:
            return _status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
        self.objects[key] = self._stamp(body, None)
        return 201, self.objects[key]

    def _apply(self, plural: str, namespace: str, name: str, request: Request) -> tuple[int, dict]:
        if request.content_type.split(";")[0] != "application/apply-patch+yaml":
            return _status(415, "UnsupportedMediaType", f"this fake only takes server-side apply, not {request.content_type}")
        manager = request.query.get("fieldManager")
        if not manager:
            return _status(422, "Invalid", "fieldManager is required for apply patch")
        key = (plural, namespace, name)
        body = _as_stored(plural, request.body)
        if body["metadata"].get("name") != name:
            return _status(400, "BadRequest", "the name of the object does not match the name on the URL")
        current = self.objects.get(key)
        others = {m: fields for m, fields in self.applied.get(key, {}).items() if m != manager}
        if current is not None and not others and manager not in self.applied.get(key, {}):
            # An object someone else created: what they set stays, ours is merged over it.
            merged = _merge(_without_server_fields(current), body)
        else:
            merged = _merge(*[fields for fields in others.values()], body) if others else copy.deepcopy(body)
        self.applied.setdefault(key, {})[manager] = copy.deepcopy(body)
        if current is not None and _without_server_fields(current) == _without_server_fields(merged):
            return 200, current  # nothing changed: no new resourceVersion
        merged = self._stamp(merged, current)
        self.objects[key] = merged
        if self.controller_delay is not None and plural in ("daemonsets", "rayclusters"):
            self._ready_at[key] = time.monotonic() + self.controller_delay
        return (200 if current else 201), merged

    def _play_controller(self, key: tuple[str, str, str]) -> None:
        if key in self._ready_at and time.monotonic() >= self._ready_at[key] and key in self.objects:
            del self._ready_at[key]
            self.objects[key]["status"] = ({"state": "ready"} if key[0] == "rayclusters"
                                           else {"desiredNumberScheduled": 2, "numberReady": 2})

    def _stamp(self, obj: dict, previous: dict | None) -> dict:
        metadata = obj.setdefault("metadata", {})
        metadata["resourceVersion"] = str(next(self._versions))
        metadata["generation"] = (previous or {}).get("metadata", {}).get("generation", 0) + 1
        metadata.setdefault("uid", f"uid-{metadata['resourceVersion']}")
        if previous and "status" in previous:
            obj["status"] = previous["status"]
        return obj


def _as_stored(plural: str, body: dict) -> dict:
    """A Secret's stringData is write-only: the API server keeps it base64-encoded in data."""
    if plural != "secrets" or "stringData" not in body:
        return body
    stored = {k: v for k, v in body.items() if k != "stringData"}
    stored["data"] = dict(body.get("data") or {}, **{k: base64.b64encode(v.encode()).decode()
                                                       for k, v in body["stringData"].items()})
    return stored


def _without_server_fields(obj: dict) -> dict:
    clean = copy.deepcopy(obj)
    clean.pop("status", None)
    for field in ("resourceVersion", "generation", "uid", "managedFields", "creationTimestamp"):
        clean.get("metadata", {}).pop(field, None)
    return clean


def _merge(*objects: dict) -> dict:
    merged: dict = {}
    for obj in objects:
        for key, value in obj.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


def _status(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Success" if code < 300 else "Failure",
                  "message": message, "reason": reason, "code": code}
