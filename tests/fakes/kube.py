"""A fake Kubernetes API server for the official kubernetes client, over HTTP on 127.0.0.1.

It behaves as the real one does for the kinds rlops sends (the rules and their sources are in
`kube_ssa` and `kube_rules`): discovery of the group-versions it serves (a CRD's kinds only once
it is installed: `uninstall("ray.io/v1")`), get, list by label selector, create, server-side apply
with managed fields per manager, conflicts and `force`, `dryRun=All`, updates by JSON patch or PUT
that move field ownership to their manager, defaulting and quantity canonicalization, the
immutability and resize rules of PV/PVC/DaemonSet/Secret, deletion held by finalizers, and
resourceVersion/generation (generation moves only with the spec). Namespaces with their lifecycle: the
built-in ones always there, a write into a namespace that does not exist refused (404) and a create into
one being terminated too (403), by the NamespaceLifecycle admission (kube_rules); a deleted namespace is
Terminating until the namespace controller has deleted what is in it. Controllers are played on each
request: the namespace controller, the PV binder, the PV/PVC protection controllers, KubeRay's pod
controller and its status writer, by the rules of the release `kuberay` plays (fakes.kuberay; its pods pass
the ServiceAccount admission), and (with `controller_delay`) the DaemonSet status writer. Also the service proxy
(`/api/v1/namespaces/NS/services/NAME:PORT/proxy/...`, `_proxy`: a RayCluster's head service, forwarded to
what `services` maps to), bearer tokens with an expiry when a test asks for them (`issue_token`), and a
request log.
"""

import copy
import datetime
import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from fakes import kube_rules, kube_scheduling, kube_ssa, kuberay
from fakes.jsonhttp import JsonServer, reply, request_body

# plural -> (kind, api group/version, namespaced)
RESOURCES = {
    "namespaces": ("Namespace", "v1", False),
    "secrets": ("Secret", "v1", True),
    "serviceaccounts": ("ServiceAccount", "v1", True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1", True),
    "persistentvolumes": ("PersistentVolume", "v1", False),
    "daemonsets": ("DaemonSet", "apps/v1", True),
    "rayclusters": ("RayCluster", "ray.io/v1", True),
    "gkenetworkparamsets": ("GKENetworkParamSet", "networking.gke.io/v1", False),
    "networks": ("Network", "networking.gke.io/v1", False),
    "pods": ("Pod", "v1", True),  # read and deleted only; the fake KubeRay makes them (fakes.kuberay)
    "events": ("Event", "v1", True),  # read only; the scheduler and the autoscaler record them (fakes.kube_scheduling)
    "nodes": ("Node", "v1", False),  # read only; the node pool's nodes, as they come up (fakes.kube_scheduling)
}
# The fields a list may select on besides metadata.name and metadata.namespace, per kind (the registry's
# GetAttrs: pkg/registry/core/event/strategy.go ToSelectableFields; others: pkg/apis/core/v1/conversion.go).
SELECTABLE_FIELDS = {"events": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                                "involvedObject.uid", "involvedObject.apiVersion", "reason", "type"},
                     "pods": {"spec.nodeName", "status.phase"}}
# plural -> its name in GKE's IAM permissions (container.NAME.VERB); custom resources are thirdPartyObjects.
_GKE_IAM_NAMES = {"namespaces": "namespaces", "secrets": "secrets", "serviceaccounts": "serviceAccounts",
                  "persistentvolumeclaims": "persistentVolumeClaims", "persistentvolumes": "persistentVolumes",
                  "daemonsets": "daemonSets", "pods": "pods", "events": "events", "services": "services",
                  "nodes": "nodes"}
CONTROLLER_MANAGER = "kube-controller-manager"
DASHBOARD_PORT = 8265  # the head service's port `dashboard` (KubeRay utils/constant.go DefaultDashboardPort)
SERVER_FIELDS = ("resourceVersion", "generation", "uid", "managedFields", "creationTimestamp", "deletionTimestamp")


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    body: object
    status: int = 0
    token: str = ""  # the bearer token it carried


@dataclass
class Owner:
    operation: str            # Apply or Update
    fields: set


class FakeKube:
    def __init__(self, controller_delay: float | None = None, gpu_nodes: int | None = None,
                 kuberay: str = "v1.7.0"):
        # Set: play the controllers too; a DaemonSet or RayCluster reports ready this long after its last change.
        self.controller_delay = controller_delay
        self.scheduling = kube_scheduling.Scheduling(gpu_nodes)  # GPU nodes granted, what the autoscaler says
        self.kuberay = kuberay          # the release whose RayCluster CRD and pod controller are played
        # The Ray add-on being upgraded to this release: the operator is down (no pods made, no status written)
        # until the next RayCluster write lands, and the new release's first reconcile sees that spec.
        self.kuberay_pending: str | None = None
        self.served = {kind[1] for kind in RESOURCES.values()}
        self.storage_classes: dict[str, bool] = {}   # name -> allowVolumeExpansion; "" names none
        self._ready_at: dict[tuple[str, str, str], float] = {}
        self.objects: dict[tuple[str, str, str], dict] = {}   # (plural, namespace or "", name) -> object
        self.owners: dict[tuple[str, str, str], dict[str, Owner]] = {}  # per object: field manager -> its fields
        self.requests: list[Request] = []
        self.services: dict[tuple[str, str], str] = {}  # (namespace, "name:port") -> the URL it proxies to
        # (namespace, RayCluster) whose head pod runs but fails its readiness probe, its dashboard not answering.
        self.unready_heads: set[tuple[str, str]] = set()
        # (namespace, RayCluster) whose worker pods run but fail their readiness probes (raylets starting).
        self.unready_workers: set[tuple[str, str]] = set()
        # KubeRay's ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE: a ClusterIP head service, which hides an unready head pod.
        self.head_service_cluster_ip = False
        # Bearer tokens the server accepts, each until its expiry by `clock` (naive UTC); None: no authentication.
        self.tokens: dict[str, datetime.datetime] | None = None
        # GKE's IAM authorizer (tests/fakes/iam.py): a Google token's principal needs container.RESOURCE.VERB on the
        # project (cloud.google.com/kubernetes-engine/docs/reference/api-permissions); None: RBAC lets all through.
        self.iam = None
        self.clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC).replace(
            tzinfo=None)
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self._server = None
        for name in kube_rules.BUILT_IN_NAMESPACES:
            self._write(("namespaces", "", name), {"metadata": {"name": name}}, "kube-apiserver")

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
            self._reconcile()
            found = self.objects.get((plural, namespace, name))
            return copy.deepcopy(found)

    def put(self, obj: dict, plural: str, manager: str = "kubectl-create") -> None:
        """Create an object as another tool would (an Update by `manager`, never rlops)."""
        with self._lock:
            key = (plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            status, answer = self._write(key, copy.deepcopy(obj), manager)
            assert status < 300, answer

    def edit(self, plural: str, name: str, change, namespace: str = "", manager: str = "kubectl-edit") -> dict:
        """What `kubectl edit` does: read, change (a function of the object), PUT back as `manager`."""
        with self._lock:
            key = (plural, namespace, name)
            edited = copy.deepcopy(self.objects[key])
            change(edited)
            status, answer = self._write(key, edited, manager)
            assert status < 300, answer
            return copy.deepcopy(answer)

    def pods(self, cluster: str, namespace: str = "default") -> list[dict]:
        """The pods KubeRay runs for a RayCluster, head first."""
        with self._lock:
            self._reconcile()
            found = kuberay.pods_of(self.objects, namespace, cluster).values()
            return copy.deepcopy(sorted(found, key=lambda pod: (
                pod["metadata"]["labels"][kuberay.NODE_TYPE_LABEL] != "head", pod["metadata"]["name"])))

    @property
    def gpu_nodes(self) -> int | None:
        return self.scheduling.gpu_nodes

    def grant_gpu_nodes(self, count: int | None) -> None:
        """The GPU nodes the cloud has granted change (Spot capacity came or went): the pods are placed again and
        KubeRay recounts its workers on the next request."""
        with self._lock:
            self.scheduling.gpu_nodes = count

    def set_status(self, plural: str, name: str, status: dict, namespace: str = "") -> None:
        """What a controller would write: the DaemonSet's ready counts, the RayCluster's state."""
        with self._lock:
            self.objects[(plural, namespace, name)]["status"] = status

    def uninstall(self, group_version: str) -> None:
        """The CRD (or the add-on) is not there: its kinds are not served and their objects are gone."""
        with self._lock:
            self.served.discard(group_version)
            for key in [k for k in self.objects if RESOURCES[k[0]][1] == group_version]:
                self.objects.pop(key)
                self.owners.pop(key, None)

    def install(self, group_version: str) -> None:
        with self._lock:
            self.served.add(group_version)

    def managers(self, plural: str, name: str, namespace: str = "") -> dict[str, set]:
        with self._lock:
            return {m: set(o.fields) for m, o in self.owners.get((plural, namespace, name), {}).items()}

    def issue_token(self, lifetime: datetime.timedelta = datetime.timedelta(hours=1)) -> tuple[str, datetime.datetime]:
        """A bearer token the server accepts from now on until `lifetime` has passed on its clock, and that expiry:
        what Google's token endpoint gives (an access token, `expires_in` 3600) and GKE's API server checks.
        From the first, every request must carry a token."""
        with self._lock:
            self.tokens = {} if self.tokens is None else self.tokens
            token, expiry = f"ya29.fake-{secrets.token_hex(8)}", self.clock() + lifetime
            self.tokens[token] = expiry
            return token, expiry

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method in ("POST", "PUT", "PATCH", "DELETE") and 200 <= r.status < 300
                and r.query.get("dryRun") != "All"]

    # -- HTTP -------------------------------------------------------------------------------
    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        raw = request_body(http)
        content_type = http.headers.get("Content-Type", "")
        segments = parts.path.split("/")
        token = http.headers.get("Authorization", "").removeprefix("Bearer ")
        if not self._authenticated(token):
            self.requests.append(Request(http.command, parts.path, {}, content_type, None, 401, token))
            reply(http, *_status(401, "Unauthorized", "Unauthorized"))
            return
        denied = self._authorize(http.command, segments, http.headers.get("Authorization"))
        if denied:
            self.requests.append(Request(http.command, parts.path, {}, content_type, None, denied[0], token))
            reply(http, *denied)
            return
        if (segments[1:4] == ["api", "v1", "namespaces"] and segments[5:6] == ["services"]
                and segments[7:8] == ["proxy"]):
            self.requests.append(Request(http.command, parts.path, {}, content_type, None, token=token))
            self._proxy(http, segments[4], segments[6], "/" + "/".join(segments[8:]), parts.query, raw)
            return
        body = json.loads(raw) if raw.strip() else None  # JSON is what the client sends, also for apply-patch+yaml
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        request = Request(http.command, parts.path, query, content_type, body, token=token)
        self.requests.append(request)
        with self._lock:
            self._reconcile()
            status, answer = self._route(request, http.headers.get("User-Agent", ""))
            if request.method != "GET" and status < 300:
                self._reconcile()  # the controllers watch: a write's pods are made at its time, not the next request's
        request.status = status
        reply(http, status, answer)

    def _authorize(self, method: str, segments: list[str], authorization: str | None) -> tuple[int, dict] | None:
        """GKE's IAM authorizer: the permission a request needs, by its resource and verb (a custom resource is a
        thirdPartyObject; the service proxy is services.proxy; an apply that creates needs create as well), held
        by the token's principal on the project; 403 Forbidden as the API server words it. None: allowed."""
        if self.iam is None:
            return None
        from fakes.iam import Denied

        try:
            member = self.iam.caller(authorization)
        except Denied:
            return _status(401, "Unauthorized", "Unauthorized")
        rest = [p for p in segments if p]
        rest = rest[2:] if rest[:1] == ["api"] else rest[3:]
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or (rest[0] not in RESOURCES and rest[0] != "services"):
            return None  # discovery, which every authenticated caller may read
        plural, name = rest[0], (rest[1] if len(rest) > 1 else None)
        resource = _GKE_IAM_NAMES.get(plural, "thirdPartyObjects")
        if plural == "services":  # only its proxy is served here
            verbs = ["proxy"]
        elif method == "GET":
            verbs = ["get" if name else "list"]
        else:
            verbs = {"POST": ["create"], "DELETE": ["delete"]}.get(method, ["update"])
            if method == "PATCH" and (plural, namespace, name) not in self.objects:
                verbs.append("create")
        for verb in verbs:
            permission = f"container.{resource}.{verb}"
            if not self.iam.holds(member, permission, f"projects/{self.iam.project}"):
                where = f' in the namespace "{namespace}"' if namespace else ""
                return _status(403, "Forbidden", f'{plural} is forbidden: User "{member.split(":", 1)[1]}" cannot '
                               f'{verb} resource "{plural}"{where}: requires one of ["{permission}"] permission(s).')
        return None

    def _authenticated(self, token: str) -> bool:
        """The authentication filter (k8s.io/apiserver pkg/endpoints/filters/authentication.go): a request no
        authenticator accepts is answered 401, Status reason and message "Unauthorized"; a Google access token is
        accepted until its expiry and not after (GKE's webhook token authenticator)."""
        if self.tokens is None:
            return True
        with self._lock:
            expiry = self.tokens.get(token)
            return expiry is not None and self.clock() < expiry

    def _proxy(self, http: BaseHTTPRequestHandler, namespace: str, service: str, path: str, query: str,
               raw: bytes) -> None:
        """The API server's service proxy for a RayCluster's head service: the request, as it came, to an endpoint
        of the service; its answer, as it came.

        - No service (KubeRay makes NAME-head-svc with the RayCluster NAME): 404 `services "NAME" not found`.
        - No endpoint: 503 `no endpoints available for service "NAME"` (pkg/registry/core/service/storage
          ResourceLocation, which sends only to an endpoint's ready addresses). The endpoints controller lists a
          pod that has an address (here: Running) as ready if it is, or if the service publishes not-ready
          addresses, which also keeps a pod being deleted (pkg/controller/util/endpoint ShouldPodBeInEndpoints,
          pkg/controller/endpoint). KubeRay's head service does from v1.2 (headless, PublishNotReadyAddresses:
          ray-operator/controllers/ray/common/service.go BuildServiceForHeadPod) unless the operator runs with
          ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE (`head_service_cluster_ip`): then an unready head has no endpoint.
        - An endpoint whose dashboard does not answer (an unready head): 503 `error trying to reach service: dial
          tcp ...: connect: connection refused` (apimachinery pkg/util/proxy/transport.go).
        - Otherwise what `services` maps the service to answers; a head no test maps answers as an idle Ray
          dashboard does: GET /api/jobs/ is an empty list of jobs.
        """
        import urllib.error
        import urllib.request

        name = service.split(":")[0]
        with self._lock:
            self._reconcile()
            cluster = next((n for p, ns, n in self.objects if p == "rayclusters" and ns == namespace
                            and f"{n}-head-svc" == name), None)
            heads = [] if cluster is None else [
                pod for pod in kuberay.pods_of(self.objects, namespace, cluster).values()
                if pod["metadata"]["labels"][kuberay.NODE_TYPE_LABEL] == "head"]
            publish_unready = _headless_head_service(self.kuberay) and not self.head_service_cluster_ip
            endpoints = [pod for pod in heads if (pod.get("status") or {}).get("phase") == "Running" and (
                publish_unready or (_ready(pod) and not pod["metadata"].get("deletionTimestamp")))]
            unready = (namespace, cluster) in self.unready_heads
        if cluster is None:
            reply(http, *_status(404, "NotFound", f'services "{name}" not found'))
            return
        if not endpoints:
            reply(http, *_status(503, "ServiceUnavailable", f'no endpoints available for service "{name}"'))
            return
        upstream = self.services.get((namespace, service))
        if unready and upstream is None:
            reply(http, *_status(503, "ServiceUnavailable", f"error trying to reach service: dial tcp "
                                                            f"10.8.0.10:{DASHBOARD_PORT}: connect: connection refused"))
            return
        if upstream is None:
            reply(http, *((200, []) if (http.command, path) == ("GET", "/api/jobs/") else
                          _status(404, "NotFound", "the fake's idle Ray dashboard serves GET /api/jobs/ only")))
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

    def _route(self, request: Request, user_agent: str) -> tuple[int, dict]:
        parts = [p for p in request.path.split("/") if p]
        # /api/v1/... or /apis/GROUP/VERSION/...
        group_version, rest = ("v1", parts[2:]) if parts[:1] == ["api"] else ("/".join(parts[1:3]), parts[3:])
        if group_version not in self.served:
            return _status(404, "NotFound", "the server could not find the requested resource")
        if not rest and request.method == "GET":
            return 200, self._discovery(group_version)
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]][1] != group_version:
            return _status(404, "NotFound", "the server could not find the requested resource")
        plural, name, subresource = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        # A request without ?fieldManager is recorded under its User-Agent's product, as the server does.
        manager = request.query.get("fieldManager") or user_agent.split("/")[0] or "unknown"
        dry_run = request.query.get("dryRun") == "All"
        if name is None:
            if request.method == "GET":
                return self._list(plural, namespace, request.query.get("labelSelector", ""),
                                  request.query.get("fieldSelector", ""))
            if request.method == "POST":
                key = (plural, namespace, request.body["metadata"]["name"])
                if key in self.objects:
                    return _status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
                return self._write(key, request.body, manager, dry_run=dry_run)
        key = (plural, namespace, name)
        current = self.objects.get(key)
        if request.method == "GET":
            return (200, current) if current else _not_found(plural, name)
        if request.method == "DELETE":
            return self._delete(key) if current else _not_found(plural, name)
        if subresource == "status" and request.method in ("PUT", "PATCH") and current:
            current["status"] = (request.body or {}).get("status", {})
            return 200, current
        if subresource is not None:
            return _status(405, "MethodNotAllowed", f"{request.method} {request.path}")
        if request.method == "PATCH" and request.content_type.startswith("application/apply-patch"):
            if not request.query.get("fieldManager"):
                return _status(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: "
                                               "Required value: is required for apply patch")
            return self._apply(key, request.body, manager, request.query.get("force") == "true", dry_run)
        if current is None:
            return _not_found(plural, name)
        if request.method == "PATCH" and request.content_type.startswith("application/json-patch+json"):
            patched, error = _json_patch(current, request.body)
            return error or self._write(key, patched, manager, dry_run=dry_run)
        if request.method == "PUT":
            if request.body["metadata"].get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
                return _status(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object '
                                                "has been modified; please apply your changes to the latest version "
                                                "and try again")
            return self._write(key, request.body, manager, dry_run=dry_run)
        return _status(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format ({request.content_type})")

    def _discovery(self, group_version: str) -> dict:
        resources = [{"name": plural, "kind": kind, "namespaced": namespaced, "singularName": kind.lower(),
                      "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                     for plural, (kind, version, namespaced) in RESOURCES.items() if version == group_version]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}

    def _list(self, plural: str, namespace: str, selector: str, field_selector: str) -> tuple[int, dict]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        fields = dict(term.split("=", 1) for term in field_selector.split(",") if "=" in term)
        for field in fields:
            if field not in SELECTABLE_FIELDS.get(plural, set()) | {"metadata.name", "metadata.namespace"}:
                return _status(400, "BadRequest", f'field label not supported: {field}')
        kind, version, _ = RESOURCES[plural]
        items = [obj for (p, ns, _), obj in self.objects.items()
                 if p == plural and (not namespace or ns == namespace)
                 and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
                 and all(_field(obj, path) == value for path, value in fields.items())]
        return 200, {"apiVersion": version, "kind": f"{kind}List",
                     "metadata": {"resourceVersion": str(next(self._versions))}, "items": items}

    # -- writes -----------------------------------------------------------------------------
    def _apply(self, key, config: dict, manager: str, force: bool, dry_run: bool) -> tuple[int, dict]:
        plural, _, name = key
        if (config.get("metadata") or {}).get("name") != name:
            return _status(400, "BadRequest", "the name of the object does not match the name on the URL")
        if RESOURCES[plural][0] != config.get("kind"):
            return _status(400, "BadRequest", f"the kind {config.get('kind')!r} does not match the URL ({plural})")
        if plural == "pods":
            return _status(405, "MethodNotAllowed", "the fake serves pods to read and delete; KubeRay makes them")
        schema = kube_rules.schema(plural, self.kuberay)
        config = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
        if plural in kube_rules.CUSTOM:
            kube_rules.prune_unknown(config, schema)
        applied = kube_ssa.field_set(config, schema)
        current = self.objects.get(key)
        owners = copy.deepcopy(self.owners.get(key, {}))
        live = _without_server_fields(current) if current else {}
        live.pop("status", None)
        conflicts = {(other, path) for other, owner in owners.items() if other != manager
                     for path in owner.fields & applied
                     if kube_ssa.value_at(live, path, schema) != kube_ssa.value_at(config, path, schema)}
        if conflicts and not force:
            listed = "; ".join(f'conflict with "{m}": .{_dotted(p)}' for m, p in sorted(conflicts, key=repr))
            return _status(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {listed}")
        for other, path in conflicts:
            owners[other].fields.discard(path)
        previous = owners.get(manager, Owner("Apply", set())).fields
        for path in previous - applied:
            if not any(path in o.fields for m, o in owners.items() if m != manager):
                kube_ssa.remove(live, path, schema)
        owners[manager] = Owner("Apply", applied)
        merged = kube_ssa.merge(live, config, schema)
        return self._store(key, merged, owners, dry_run)

    def _write(self, key, obj: dict, manager: str, dry_run: bool = False) -> tuple[int, dict]:
        """An update (create, PUT, JSON patch): its manager takes every field it changed."""
        if key[0] == "pods":
            return _status(405, "MethodNotAllowed", "the fake serves pods to read and delete; KubeRay makes them")
        schema = kube_rules.schema(key[0], self.kuberay)
        current = self.objects.get(key)
        before = _without_server_fields(current) if current else {}
        after = _without_server_fields(obj)
        if key[0] in kube_rules.CUSTOM:
            kube_rules.prune_unknown(after, schema)
        for side in (before, after):
            side.pop("status", None)
            side.pop("apiVersion", None)
            side.pop("kind", None)
        changed = kube_ssa.changed_paths(before, after, schema)
        owners = copy.deepcopy(self.owners.get(key, {}))
        for owner in owners.values():
            owner.fields -= changed
        owner = owners.setdefault(manager, Owner("Update", set()))
        owner.fields |= {p for p in changed if kube_ssa.value_at(after, p, schema) is not kube_ssa.MISSING}
        return self._store(key, after, owners, dry_run)

    def _store(self, key, content: dict, owners: dict[str, Owner], dry_run: bool) -> tuple[int, dict]:
        plural, namespace, name = key
        current = self.objects.get(key)
        group = RESOURCES[plural][1].rpartition("/")[0]
        refused = kube_rules.namespace_lifecycle(self.objects, plural, group, namespace, name, creating=current is None)
        if refused:
            return _status(*refused)
        if current and current["metadata"].get("deletionTimestamp"):
            return _status(409, "Conflict", f'{plural} "{name}" is being deleted')  # no change to a terminating object
        content = {"apiVersion": RESOURCES[plural][1], "kind": RESOURCES[plural][0], **content}
        if plural == "secrets":
            _secret_as_stored(content)
        kube_rules.apply_defaults(plural, content, self.kuberay)
        status = content.pop("status", None)
        if current:
            refused = kube_rules.refused_update(plural, current, content, self.storage_classes)
            if refused:
                return _status(*refused)
        stored = self._stamp(content, current, status)
        if current is None and plural in FINALIZERS:
            stored["metadata"]["finalizers"] = sorted({*stored["metadata"].get("finalizers", []), FINALIZERS[plural]})
        stored["metadata"]["managedFields"] = [
            {"manager": m, "operation": o.operation, "apiVersion": RESOURCES[plural][1], "fieldsType": "FieldsV1",
             "fieldsV1": kube_ssa.fields_v1(o.fields)} for m, o in sorted(owners.items()) if o.fields]
        if current and _without_server_fields(current) == _without_server_fields(stored):
            return 200, current  # a write that changes nothing is not stored: no new resourceVersion
        if dry_run:
            return (200 if current else 201), stored
        self._bump(stored)
        self.objects[key] = stored
        self.owners[key] = {m: o for m, o in owners.items() if o.fields}
        if self.controller_delay is not None and plural == "daemonsets":
            self._ready_at[key] = time.monotonic() + self.controller_delay
        if plural == "rayclusters" and self.kuberay_pending:
            self.kuberay, self.kuberay_pending = self.kuberay_pending, None  # the new operator is up
        return (200 if current else 201), stored

    def _stamp(self, obj: dict, previous: dict | None, status: dict | None) -> dict:
        metadata = obj.setdefault("metadata", {})
        before = (previous or {}).get("metadata", {})
        metadata["uid"] = before.get("uid") or f"uid-{next(self._versions)}"
        metadata["creationTimestamp"] = before.get("creationTimestamp") or time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime())
        metadata["generation"] = before.get("generation", 0) + (
            0 if previous and _spec_of(previous) == _spec_of(obj) else 1)
        metadata["resourceVersion"] = before.get("resourceVersion", "0")
        kept = (previous or {}).get("status") or status
        if kept:
            obj["status"] = kept
        return obj

    def _delete(self, key) -> tuple[int, dict]:
        """Deletion waits for the object's finalizers (the protection controllers clear theirs in `_reconcile`)."""
        current = self.objects[key]
        if key[0] == "namespaces":
            return self._delete_namespace(key, current)
        if current["metadata"].get("finalizers"):
            current["metadata"].setdefault("deletionTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            self._bump(current)
            return 200, current
        self.objects.pop(key)
        self.owners.pop(key, None)
        self._ready_at.pop(key, None)
        return _status(200, "Success", "deleted")

    def _delete_namespace(self, key, namespace: dict) -> tuple[int, dict]:
        """The namespace registry's Delete (pkg/registry/core/namespace/storage/storage.go): a namespace with
        finalizers (every one: `kubernetes` is set at creation) is only marked, deletionTimestamp and phase
        Terminating; the namespace controller does the rest (`_finalize_namespaces`)."""
        refused = kube_rules.namespace_deletion(key[2])
        if refused:
            return _status(*refused)
        if not namespace["metadata"].get("deletionTimestamp"):
            namespace["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            namespace["status"] = {"phase": "Terminating"}
            self._bump(namespace)
        return 200, namespace

    def _bump(self, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    # -- controllers --------------------------------------------------------------------------
    def _reconcile(self) -> None:
        """What the controllers would have done by now, run before each request."""
        self._empty_terminating_namespaces()
        self._bind_volumes()
        self._release_protected()
        failures = kuberay.reconcile(self.objects, self.kuberay) if not self.kuberay_pending else {}
        self.scheduling.place(self.objects, self.clock().replace(tzinfo=datetime.UTC).timestamp())
        self._fail_readiness_probes()
        if not self.kuberay_pending:
            kuberay.write_status(self.objects, self.kuberay, failures)
        self._finalize_namespaces()
        now = time.monotonic()
        for key, due in list(self._ready_at.items()):
            if now >= due and key in self.objects:
                del self._ready_at[key]
                self._publish_status(key)

    def _fail_readiness_probes(self) -> None:
        """The kubelet's view of a head pod in `unready_heads` (a worker pod in `unready_workers`): running, its
        readiness probe failing, so the pod's Ready and ContainersReady conditions are False
        (pkg/kubelet/status/generate.go, reason ContainersNotReady)."""
        for key, pod in self.objects.items():
            if key[0] != "pods" or (pod.get("status") or {}).get("phase") != "Running":
                continue
            node_type = pod["metadata"]["labels"][kuberay.NODE_TYPE_LABEL]
            unready = self.unready_heads if node_type == "head" else self.unready_workers
            if (key[1], pod["metadata"]["labels"][kuberay.CLUSTER_LABEL]) in unready:
                container = "ray-head" if node_type == "head" else "ray-worker"
                pod["status"]["conditions"] = [
                    c for c in pod["status"].get("conditions", []) if c["type"] not in ("Ready", "ContainersReady")] + [
                    {"type": t, "status": "False", "reason": "ContainersNotReady",
                     "message": f"containers with unready status: [{container}]"} for t in ("ContainersReady", "Ready")]

    def _empty_terminating_namespaces(self) -> None:
        """The namespace controller (pkg/controller/namespace/deletion/namespaced_resources_deleter.go): every
        object in a Terminating namespace is deleted, each as its own delete would go (finalizers hold it)."""
        terminating = {key[2] for key, obj in self.objects.items()
                       if key[0] == "namespaces" and (obj.get("status") or {}).get("phase") == "Terminating"}
        for key in [k for k in self.objects if k[1] in terminating]:
            if key in self.objects and not self.objects[key]["metadata"].get("deletionTimestamp"):
                self._delete(key)

    def _finalize_namespaces(self) -> None:
        """Then, once nothing is left in it, the controller removes its `kubernetes` finalizer (the namespace's
        finalize subresource), and the namespace goes when no finalizer at all is left (metadata.finalizers:
        anyone's, which hold it Terminating)."""
        for key, namespace in list(self.objects.items()):
            if key[0] != "namespaces" or (namespace.get("status") or {}).get("phase") != "Terminating":
                continue
            if any(k[1] == key[2] for k in self.objects):
                continue
            spec = namespace.setdefault("spec", {})
            spec["finalizers"] = [f for f in spec.get("finalizers", []) if f != kube_rules.NAMESPACE_FINALIZER]
            if not spec["finalizers"] and not namespace["metadata"].get("finalizers"):
                self.objects.pop(key)
                self.owners.pop(key, None)

    def _bind_volumes(self) -> None:
        """The PV controller (pkg/controller/volume/persistentvolume/pv_controller.go): a claim naming a
        volume whose claimRef names it (or is empty) is bound; the binder writes the full claimRef (with
        the claim's uid) into the PV as an update, and both phases become Bound."""
        for key, claim in self.objects.items():
            if key[0] != "persistentvolumeclaims" or claim.get("status", {}).get("phase") == "Bound":
                continue
            volume = self.objects.get(("persistentvolumes", "", claim["spec"].get("volumeName", "")))
            if volume is None or volume["metadata"].get("deletionTimestamp"):
                continue
            ref = volume["spec"].get("claimRef") or {}
            if ref and (ref.get("namespace"), ref.get("name")) != (key[1], key[2]):
                continue
            if ref.get("uid") not in (None, claim["metadata"]["uid"]):
                continue
            bound = copy.deepcopy(volume)
            bound["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": key[1], "name": key[2],
                                         "uid": claim["metadata"]["uid"], "apiVersion": "v1",
                                         "resourceVersion": claim["metadata"]["resourceVersion"]}
            self._write(("persistentvolumes", "", volume["metadata"]["name"]), bound, CONTROLLER_MANAGER)
            self.objects[("persistentvolumes", "", volume["metadata"]["name"])]["status"] = {"phase": "Bound"}
            claim["status"] = {"phase": "Bound", "accessModes": volume["spec"].get("accessModes", []),
                               "capacity": dict(volume["spec"].get("capacity", {}))}

    def _release_protected(self) -> None:
        """kubernetes.io/pvc-protection goes once no pod uses the claim (here: no RayCluster's template names
        it; KubeRay's pods go with their RayCluster), kubernetes.io/pv-protection once no claim is bound to the
        volume (pkg/controller/volume/pvcprotection, pvprotection)."""
        for key, obj in list(self.objects.items()):
            if not obj["metadata"].get("deletionTimestamp") or key[0] == "namespaces":
                continue
            if key[0] == "persistentvolumeclaims" and not any(
                    k[0] == "rayclusters" and k[1] == key[1] and f'"claimName": "{key[2]}"' in json.dumps(c)
                    for k, c in self.objects.items()):
                obj["metadata"]["finalizers"] = [f for f in obj["metadata"]["finalizers"] if f != PVC_PROTECTION]
            if key[0] == "persistentvolumes" and not any(
                    k[0] == "persistentvolumeclaims" and c["spec"].get("volumeName") == key[2]
                    for k, c in self.objects.items()):
                obj["metadata"]["finalizers"] = [f for f in obj["metadata"]["finalizers"] if f != PV_PROTECTION]
            if not obj["metadata"]["finalizers"]:
                self.objects.pop(key)
                self.owners.pop(key, None)

    def _publish_status(self, key) -> None:
        """The status the DaemonSet controller writes once its pods are up (pkg/controller/daemon
        updateDaemonSetStatus: `observedGeneration` is the generation it has seen). KubeRay's is written by
        fakes.kuberay.write_status, by its own rules."""
        obj = self.objects[key]
        nodes = 2
        obj["status"] = {"desiredNumberScheduled": nodes, "currentNumberScheduled": nodes, "numberReady": nodes,
                         "updatedNumberScheduled": nodes, "numberAvailable": nodes,
                         "observedGeneration": obj["metadata"]["generation"]}


PVC_PROTECTION, PV_PROTECTION = "kubernetes.io/pvc-protection", "kubernetes.io/pv-protection"
# The StorageObjectInUseProtection admission plugin adds these at creation
# (plugin/pkg/admission/storage/storageobjectinuseprotection).
FINALIZERS = {"persistentvolumeclaims": PVC_PROTECTION, "persistentvolumes": PV_PROTECTION}


def _json_patch(current: dict, operations: list[dict]) -> tuple[dict, tuple[int, dict] | None]:
    """RFC 6902 test/replace/add/remove; one failed operation and nothing changes (422)."""
    patched = copy.deepcopy(current)
    for operation in operations:
        *parents, last = [int(p) if p.isdigit() else p.replace("~1", "/").replace("~0", "~")
                          for p in operation["path"].strip("/").split("/")]
        target = patched
        try:
            for part in parents:
                target = target[part]
            if operation["op"] == "test":
                if target[last] != operation["value"]:
                    return current, _status(422, "Invalid", f"the server rejected our request due to an error in our "
                                                            f"request: testing value {operation['path']} failed")
            elif operation["op"] == "replace":
                target[last]  # replace needs the member to exist
                target[last] = operation["value"]
            elif operation["op"] == "add":
                target.insert(last, operation["value"]) if isinstance(target, list) else \
                    target.__setitem__(last, operation["value"])
            elif operation["op"] == "remove":
                del target[last]
            else:
                return current, _status(422, "Invalid", f"unsupported op {operation['op']}")
        except (KeyError, IndexError, TypeError):
            return current, _status(422, "Invalid", f"the server rejected our request due to an error in our request: "
                                                    f"{operation['path']} does not exist")
    return patched, None


def _secret_as_stored(secret: dict) -> None:
    """stringData is write-only: merged into data, base64-encoded, and dropped (core/v1 conversion). Its
    keys were never fields of the object, so no manager owns them in `data` (kubernetes#108008)."""
    import base64

    if "stringData" in secret:
        secret["data"] = dict(secret.get("data") or {}, **{k: base64.b64encode(v.encode()).decode()
                                                           for k, v in secret.pop("stringData").items()})


def _without_server_fields(obj: dict) -> dict:
    clean = copy.deepcopy(obj)
    for field in SERVER_FIELDS:
        clean.get("metadata", {}).pop(field, None)
    return clean


def _spec_of(obj: dict) -> dict:
    """What moves `metadata.generation`: everything but metadata and status (the registry strategies'
    PrepareForUpdate; for custom resources, apiextensions' `generation` rule)."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _field(obj: dict, path: str):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _dotted(path: tuple) -> str:
    return ".".join(f"[{dict(p[1])}]" if isinstance(p, tuple) else p for p in path)


def _not_found(plural: str, name: str) -> tuple[int, dict]:
    return _status(404, "NotFound", f'{plural} "{name}" not found')


def _headless_head_service(kuberay_version: str) -> bool:
    """KubeRay v1.2.0 made the head service headless, publishing not-ready addresses (kuberay#2117)."""
    major, minor = (int(part) for part in kuberay_version.lstrip("v").split(".")[:2])
    return (major, minor) >= (1, 2)


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))


def _status(code: int, reason: str, message: str, details: dict | None = None) -> tuple[int, dict]:
    """A metav1.Status as the API server answers it (apimachinery pkg/api/errors/errors.go)."""
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                  "status": "Success" if code < 300 else "Failure",
                  "message": message, "reason": reason, **({"details": details} if details else {}), "code": code}
