"""A fake of the GCP control plane for the real Google client libraries, over HTTP on 127.0.0.1.

It serves the REST paths that google-cloud-compute, google-cloud-container, google-cloud-lustre and
google-api-python-client's servicenetworking send, with the behaviour the provisioning engine has
to cope with: long-running operations that finish after `operation_seconds`, resources that appear
only when their create is done (GKE and Lustre show PROVISIONING/CREATING meanwhile), 404 and 409,
GKE's one-operation-per-cluster rule, the server-side checks the real APIs make on the fields rlops
sends, injected latency and transient faults, and a log of every request.

One project's worth of resources: names are unique per kind, whatever project a path names.
"""

import itertools
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

KINDS = ("network", "subnetwork", "firewall", "address", "connection", "cluster", "node_pool", "lustre_instance")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LUSTRE_STEP = {1000: 9000, 500: 18000, 250: 36000, 125: 72000}


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str, reason: str = ""):
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason or status.lower()

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "status": self.status,
                          "errors": [{"reason": self.reason, "message": self.message, "domain": "global"}]}}


def not_found(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The resource '{what}' was not found", "notFound")


def bad_request(message: str, status: str = "INVALID_ARGUMENT") -> ApiError:
    return ApiError(400, status, message, "invalid")


@dataclass
class Request:
    method: str
    path: str
    query: dict
    body: dict | None
    user_agent: str
    time: float
    status: int = 0


@dataclass
class Operation:
    name: str
    api: str
    kind: str
    target: str
    finish_at: float
    on_done: object = None          # called once, under the fake's lock, when the operation finishes
    cluster: str | None = None      # GKE: the cluster this operation keeps busy
    response: dict | None = None
    done: bool = False


@dataclass
class FakeGcp:
    operation_seconds: float = 0.3
    latency: float = 0.0
    seed: int = 0
    fail_rate: float = 0.0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self):
        self._store: dict[str, dict[str, dict]] = {kind: {} for kind in KINDS}
        self._pending_creates: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self._operations: dict[str, Operation] = {}
        self._lock = threading.RLock()
        self._random = random.Random(self.seed)
        self._fail_next: list[tuple[int, str | None]] = []
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle and test hooks -----------------------------------------------------------
    def start(self) -> "FakeGcp":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes; no 40 ms delayed-ACK stall

            def log_message(self, *args):
                pass

            def _serve(self):
                fake._handle(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 drops a parallel plan's connects for a second
            def handle_error(self, request, client_address):
                pass  # a client killed mid-request (the crash tests do that) is not the fake's error

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-gcp").start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoints(self) -> dict[str, str]:
        base = f"http://127.0.0.1:{self._server.server_address[1]}"
        return {"compute": base, "container": f"{base}/gke", "lustre": f"{base}/lustre", "servicenetworking": f"{base}/sn/"}

    def fail_next(self, count: int, status: int = 503, match: str | None = None) -> None:
        with self._lock:
            self._fail_next += [(status, match)] * count

    def resources(self, kind: str) -> dict[str, dict]:
        with self._lock:
            self._advance()
            return json.loads(json.dumps(self._store[kind]))

    def put(self, kind: str, name: str, body: dict) -> None:
        """Set a resource as if someone changed it in the console."""
        with self._lock:
            self._store[kind][name] = json.loads(json.dumps(body))

    def mutations(self) -> list[Request]:
        """Accepted requests that create, change or delete something."""
        return [r for r in list(self.requests)
                if r.method in ("POST", "PATCH", "PUT", "DELETE") and 200 <= r.status < 300 and not r.path.endswith("/wait")]

    # -- HTTP -------------------------------------------------------------------------------
    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        length = int(http.headers.get("Content-Length") or 0)
        raw = http.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else None
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        # GAPIC clients put their ClientInfo user agent in x-goog-api-client; discovery clients in User-Agent.
        agent = f"{http.headers.get('User-Agent', '')} {http.headers.get('x-goog-api-client', '')}".strip()
        request = Request(http.command, parts.path, query, body, agent, time.time())
        self.requests.append(request)
        if self.latency:
            time.sleep(self.latency)
        try:
            self._maybe_fail(request)
            with self._lock:
                self._advance()
                status, answer = 200, self._route(request)
        except ApiError as error:
            status, answer = error.code, error.body()
        request.status = status
        payload = json.dumps(answer).encode()
        http.send_response(status)
        http.send_header("Content-Type", "application/json")
        http.send_header("Content-Length", str(len(payload)))
        http.end_headers()
        http.wfile.write(payload)

    def _maybe_fail(self, request: Request) -> None:
        with self._lock:
            for i, (status, match) in enumerate(self._fail_next):
                if match is None or match in f"{request.method} {request.path}":
                    del self._fail_next[i]
                    raise self._transient(status)
            if self.fail_rate and self._random.random() < self.fail_rate:
                raise self._transient(self._random.choice((429, 503)))

    @staticmethod
    def _transient(status: int) -> ApiError:
        """The error the real APIs answer with this status (the permission and quota ones are not transient)."""
        if status == 429:
            return ApiError(429, "RESOURCE_EXHAUSTED", "Rate limit exceeded (injected)", "rateLimitExceeded")
        if status == 403:
            return ApiError(403, "PERMISSION_DENIED", "Required 'compute.networks.create' permission for "
                            "'projects/rlops-h200-example/global/networks/rl-net' (injected)", "forbidden")
        if status == 400:
            return ApiError(400, "FAILED_PRECONDITION", "Cluster is running incompatible operation "
                            "operation-injected.", "failedPrecondition")
        if status == 412:
            return ApiError(412, "FAILED_PRECONDITION", "Quota 'NVIDIA_H200_GPUS' exceeded. Limit: 0.0 in region "
                            "us-central1 (injected)", "quotaExceeded")
        return ApiError(status, "UNAVAILABLE", "The service is currently unavailable (injected)", "backendError")

    def _route(self, request: Request) -> dict:
        for method, pattern, handler in self._routes():
            if method == request.method:
                match = re.fullmatch(pattern, request.path)
                if match:
                    return handler(request, **match.groupdict())
        raise not_found(f"{request.method} {request.path}")

    def _routes(self):
        cp = r"/compute/v1/projects/(?P<project>[^/]+)"
        gke = r"/gke/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
        lus = r"/lustre/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
        sn = r"/sn/v1/services/servicenetworking.googleapis.com/connections"
        return [
            ("POST", cp + r"/global/networks", self._insert_network),
            ("PATCH", cp + r"/global/networks/(?P<name>[^/]+)", self._patch_network),
            ("POST", cp + r"/regions/(?P<region>[^/]+)/subnetworks", self._insert_subnetwork),
            ("POST", cp + r"/global/firewalls", self._insert_firewall),
            ("PATCH", cp + r"/global/firewalls/(?P<name>[^/]+)", self._patch_firewall),
            ("POST", cp + r"/global/addresses", self._insert_address),
            ("GET", cp + r"/global/(?P<collection>networks|firewalls|addresses)", self._compute_list),
            ("GET", cp + r"/regions/(?P<region>[^/]+)/(?P<collection>subnetworks)", self._compute_list),
            ("GET", cp + r"/global/(?P<collection>networks|firewalls|addresses)/(?P<name>[^/]+)", self._compute_get),
            ("GET", cp + r"/regions/(?P<region>[^/]+)/(?P<collection>subnetworks)/(?P<name>[^/]+)", self._compute_get),
            ("DELETE", cp + r"/global/(?P<collection>networks|firewalls|addresses)/(?P<name>[^/]+)", self._compute_delete),
            ("DELETE", cp + r"/regions/(?P<region>[^/]+)/(?P<collection>subnetworks)/(?P<name>[^/]+)", self._compute_delete),
            ("GET", cp + r"/(global|regions/[^/]+)/operations/(?P<op>[^/]+)", self._compute_operation),
            ("POST", sn, self._connect),
            ("GET", sn, self._list_connections),
            ("PATCH", sn + r"/-", self._update_connection),
            ("POST", sn + r"/(?P<peering>[^/:]+)", self._disconnect),  # deleteConnection is a POST on the name
            ("GET", r"/sn/v1/operations/(?P<op>.+)", self._lro),
            ("POST", gke + r"/clusters", self._create_cluster),
            ("GET", gke + r"/clusters/(?P<cluster>[^/]+)", self._get_cluster),
            ("PUT", gke + r"/clusters/(?P<cluster>[^/]+)", self._update_cluster),
            ("DELETE", gke + r"/clusters/(?P<cluster>[^/]+)", self._delete_cluster),
            ("POST", gke + r"/clusters/(?P<cluster>[^/]+)/nodePools", self._create_node_pool),
            ("GET", gke + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)", self._get_node_pool),
            ("DELETE", gke + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)", self._delete_node_pool),
            ("POST", gke + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+):(?P<verb>setAutoscaling|setSize)",
             self._resize_node_pool),
            ("GET", gke + r"/operations/(?P<op>[^/]+)", self._gke_operation),
            ("POST", lus + r"/instances", self._create_instance),
            ("GET", lus + r"/instances/(?P<name>[^/]+)", self._get_instance),
            ("PATCH", lus + r"/instances/(?P<name>[^/]+)", self._update_instance),
            ("DELETE", lus + r"/instances/(?P<name>[^/]+)", self._delete_instance),
            ("GET", lus + r"/operations/(?P<op>[^/]+)", self._lro),
        ]

    # -- operations -------------------------------------------------------------------------
    def _operation(self, api: str, kind: str, target: str, on_done=None, cluster: str | None = None,
                   name: str | None = None) -> Operation:
        operation = Operation(name or f"operation-{next(self._ids)}", api, kind, target,
                              time.monotonic() + self.operation_seconds, on_done, cluster)
        self._operations[operation.name] = operation
        return operation

    def _advance(self) -> None:
        now = time.monotonic()
        for operation in list(self._operations.values()):
            if not operation.done and operation.finish_at <= now:
                operation.done = True
                if operation.on_done:
                    operation.response = operation.on_done()

    def _find_operation(self, name: str) -> Operation:
        operation = self._operations.get(name)
        if operation is None:
            raise not_found(f"operations/{name}")
        return operation

    # -- compute ----------------------------------------------------------------------------
    def _compute_op(self, project: str, target: str, kind: str, on_done, region: str | None = None) -> dict:
        operation = self._operation("compute", kind, target, on_done)
        return self._compute_op_json(project, operation, region)

    @staticmethod
    def _compute_op_json(project: str, operation: Operation, region: str | None = None) -> dict:
        scope = f"regions/{region}" if region else "global"
        answer = {"kind": "compute#operation", "name": operation.name, "operationType": operation.kind,
                  "status": "DONE" if operation.done else "RUNNING", "targetLink": operation.target,
                  "selfLink": f"https://compute.googleapis.com/compute/v1/projects/{project}/{scope}/operations/{operation.name}"}
        if region:
            answer["region"] = region
        return answer

    def _compute_operation(self, request, project, op, **_):
        return self._compute_op_json(project, self._find_operation(op))

    def _new_compute(self, kind: str, body: dict) -> str:
        name = (body or {}).get("name", "")
        if not _NAME.match(name):
            raise bad_request(f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                              "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if name in self._store[kind] or name in self._pending_creates[kind]:
            raise ApiError(409, "ALREADY_EXISTS", f"The resource '{kind} {name}' already exists", "alreadyExists")
        return name

    def _created(self, kind: str, name: str, stored: dict):
        self._pending_creates[kind].add(name)

        def finish():
            self._pending_creates[kind].discard(name)
            self._store[kind][name] = stored
        return finish

    def _network_named(self, reference: str | None) -> str:
        name = (reference or "").rstrip("/").rsplit("/", 1)[-1]
        if name not in self._store["network"]:
            raise bad_request(f"The resource 'projects/.../global/networks/{name}' is not ready or does not exist",
                              "FAILED_PRECONDITION")
        return name

    def _insert_network(self, request, project):
        body = request.body or {}
        name = self._new_compute("network", body)
        link = f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{name}"
        stored = dict(body, selfLink=link, mtu=body.get("mtu", 1460),
                      autoCreateSubnetworks=body.get("autoCreateSubnetworks", False))
        return self._compute_op(project, link, "insert", self._created("network", name, stored))

    def _patch_network(self, request, project, name):
        network = self._get("network", name)
        changes = {k: v for k, v in (request.body or {}).items() if k in ("mtu", "routingConfig")}
        return self._compute_op(project, network["selfLink"], "patch", lambda: network.update(changes))

    def _insert_subnetwork(self, request, project, region):
        body = request.body or {}
        name = self._new_compute("subnetwork", body)
        network = self._network_named(body.get("network"))
        cidr = body.get("ipCidrRange", "")
        for other in self._store["subnetwork"].values():
            if other["network"].endswith(f"/{network}") and _overlaps(other["ipCidrRange"], cidr):
                raise bad_request(f"Invalid IPCidrRange: {cidr} conflicts with existing subnetwork "
                                  f"'{other['name']}' in region '{region}'.")
        link = f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}/subnetworks/{name}"
        stored = dict(body, selfLink=link, region=f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}",
                      network=f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{network}")
        operation = self._operation("compute", "insert", link, self._created("subnetwork", name, stored))
        return self._compute_op_json(project, operation, region)

    def _insert_firewall(self, request, project):
        body = request.body or {}
        name = self._new_compute("firewall", body)
        network = self._network_named(body.get("network"))
        if not body.get("allowed") and not body.get("denied"):
            raise bad_request("Invalid value for field 'resource.allowed': a firewall needs allowed or denied rules")
        link = f"https://compute.googleapis.com/compute/v1/projects/{project}/global/firewalls/{name}"
        stored = dict(body, selfLink=link, direction=body.get("direction", "INGRESS"),
                      network=f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{network}")
        return self._compute_op(project, link, "insert", self._created("firewall", name, stored))

    def _patch_firewall(self, request, project, name):
        firewall = self._get("firewall", name)
        changes = {k: v for k, v in (request.body or {}).items() if k in ("allowed", "sourceRanges", "denied")}
        return self._compute_op(project, firewall["selfLink"], "patch", lambda: firewall.update(changes))

    def _insert_address(self, request, project):
        body = request.body or {}
        name = self._new_compute("address", body)
        network = self._network_named(body.get("network"))
        if body.get("purpose") == "VPC_PEERING" and not body.get("prefixLength"):
            raise bad_request("Invalid value for field 'resource.prefixLength': a VPC_PEERING range needs a prefix length")
        link = f"https://compute.googleapis.com/compute/v1/projects/{project}/global/addresses/{name}"
        stored = dict(body, selfLink=link, address=body.get("address", "10.112.0.0"),
                      network=f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{network}")
        return self._compute_op(project, link, "insert", self._created("address", name, stored))

    _COLLECTIONS = {"networks": "network", "subnetworks": "subnetwork", "firewalls": "firewall", "addresses": "address"}

    def _compute_list(self, request, project, collection, region=None):
        items = [r for r in self._store[self._COLLECTIONS[collection]].values()
                 if region is None or r.get("region", "").endswith(f"/regions/{region}")]
        return {"kind": f"compute#{collection[:-1]}List", "items": items}

    def _compute_get(self, request, project, collection, name, region=None):
        return self._get(self._COLLECTIONS[collection], name)

    def _compute_delete(self, request, project, collection, name, region=None):
        kind = self._COLLECTIONS[collection]
        resource = self._get(kind, name)
        if kind == "network":
            users = [f"{k} {n}" for k in ("subnetwork", "firewall", "address") for n, r in self._store[k].items()
                     if r.get("network", "").endswith(f"/networks/{name}")]
            users += [f"cluster {n}" for n, c in self._store["cluster"].items() if c["network"].endswith(name)]
            users += [f"peering {c['peering']}" for n, c in self._store["connection"].items() if n == name]
            if users:
                raise bad_request(f"The network resource '{name}' is already being used by '{users[0]}'",
                                  "FAILED_PRECONDITION")
        if kind == "subnetwork":
            for pool in self._store["node_pool"].values():
                for extra in pool.get("networkConfig", {}).get("additionalNodeNetworkConfigs", []):
                    if extra.get("subnetwork", "").endswith(name):
                        raise bad_request(f"The subnetwork resource '{name}' is already being used by node pool "
                                          f"'{pool['name']}'", "FAILED_PRECONDITION")
        return self._compute_op(project, resource["selfLink"], "delete", lambda: self._store[kind].pop(name, None),
                                region)

    # -- service networking -----------------------------------------------------------------
    def _connect(self, request):
        body = request.body or {}
        network = self._peering_network(body.get("network", ""))
        ranges = body.get("reservedPeeringRanges", [])
        self._check_ranges(network, ranges)
        if network in self._store["connection"]:
            raise bad_request(f"Cannot modify allocated ranges in CreateConnection. Please use UpdateConnection.",
                              "FAILED_PRECONDITION")
        stored = {"network": body["network"], "reservedPeeringRanges": ranges,
                  "peering": "servicenetworking-googleapis-com", "service": "services/servicenetworking.googleapis.com"}
        return self._lro_json(self._operation("servicenetworking", "connect", network, self._created("connection", network, stored),
                                              name=f"operations/pssn.{next(self._ids)}"))

    def _list_connections(self, request):
        network = request.query.get("network", "").rsplit("/", 1)[-1]
        found = self._store["connection"].get(network)
        return {"connections": [found]} if found else {}

    def _update_connection(self, request):
        body = request.body or {}
        network = self._peering_network(body.get("network", ""))
        connection = self._get("connection", network)
        ranges = body.get("reservedPeeringRanges", [])
        self._check_ranges(network, ranges)
        operation = self._operation("servicenetworking", "update", network,
                                    lambda: connection.update(reservedPeeringRanges=ranges), name=f"operations/pssn.{next(self._ids)}")
        return self._lro_json(operation)

    def _disconnect(self, request, peering):
        network = self._peering_network((request.body or {}).get("consumerNetwork", ""))
        self._get("connection", network)
        operation = self._operation("servicenetworking", "delete", network,
                                    lambda: self._store["connection"].pop(network, None), name=f"operations/pssn.{next(self._ids)}")
        return self._lro_json(operation)

    def _peering_network(self, reference: str) -> str:
        match = re.fullmatch(r"projects/([^/]+)/global/networks/([^/]+)", reference)
        if not match or not match.group(1).isdigit():
            raise bad_request(f"Network '{reference}' must be of the form projects/PROJECT_NUMBER/global/networks/NAME "
                              "(the project number, not its ID)")
        return self._network_named(match.group(2))

    def _check_ranges(self, network: str, ranges: list[str]) -> None:
        for name in ranges:
            address = self._store["address"].get(name)
            if address is None or address.get("purpose") != "VPC_PEERING" or not address["network"].endswith(f"/{network}"):
                raise bad_request(f"Allocated IP range '{name}' not found in network '{network}'", "FAILED_PRECONDITION")

    # -- long-running operations (service networking, Lustre) ------------------------------
    def _lro(self, request, op, project=None, location=None):
        name = f"projects/{project}/locations/{location}/operations/{op}" if project else f"operations/{op}"
        return self._lro_json(self._find_operation(name))

    @staticmethod
    def _lro_json(operation: Operation) -> dict:
        # google.longrunning.Operation only: the client parses it strictly.
        answer = {"name": operation.name, "done": operation.done}
        if operation.done and operation.response is not None:
            answer["response"] = operation.response
        return answer

    # -- GKE --------------------------------------------------------------------------------
    def _gke_op(self, project: str, location: str, cluster: str, kind: str, target: str, on_done) -> dict:
        busy = [o for o in self._operations.values() if o.cluster == cluster and not o.done]
        if busy:
            raise bad_request(f"Cluster is running incompatible operation {busy[0].name}.", "FAILED_PRECONDITION")
        operation = self._operation("container", kind, target, on_done, cluster=cluster)
        return self._gke_op_json(project, location, operation)

    @staticmethod
    def _gke_op_json(project: str, location: str, operation: Operation) -> dict:
        return {"name": operation.name, "operationType": operation.kind, "status": "DONE" if operation.done else "RUNNING",
                "zone": location, "targetLink": operation.target,
                "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/operations/{operation.name}"}

    def _gke_operation(self, request, project, location, op):
        return self._gke_op_json(project, location, self._find_operation(op))

    def _create_cluster(self, request, project, location):
        cluster = dict((request.body or {}).get("cluster") or {})
        name = cluster.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
            raise bad_request(f"Invalid cluster name '{name}': 1-40 lowercase letters, digits or hyphens")
        if name in self._store["cluster"]:
            raise ApiError(409, "ALREADY_EXISTS", f"Already exists: projects/{project}/locations/{location}/clusters/{name}.")
        self._network_named(cluster.get("network"))
        network_config = cluster.get("networkConfig", {})
        if network_config.get("enableMultiNetworking") and network_config.get("datapathProvider") not in (2, "ADVANCED_DATAPATH"):
            raise bad_request("Multi-networking requires GKE Dataplane V2 (datapathProvider ADVANCED_DATAPATH)")
        pools = cluster.pop("nodePools", []) or []
        if not pools:
            raise bad_request("Cluster.initial_node_count must be greater than zero, or node pools must be given")
        version = cluster.get("initialClusterVersion") or "1.33"
        cluster.update(status="PROVISIONING", location=location, currentMasterVersion=f"{version}.2-gke.1475000",
                       selfLink=f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{name}")
        self._store["cluster"][name] = cluster
        for pool in pools:
            self._store["node_pool"][pool["name"]] = dict(pool, status="PROVISIONING", cluster=name)

        def finish():
            cluster["status"] = "RUNNING"
            for pool in pools:
                self._store["node_pool"][pool["name"]]["status"] = "RUNNING"
        return self._gke_op(project, location, name, "CREATE_CLUSTER", cluster["selfLink"], finish)

    def _cluster(self, name: str) -> dict:
        return self._get("cluster", name)

    def _get_cluster(self, request, project, location, cluster):
        found = dict(self._cluster(cluster))
        found["nodePools"] = [self._pool_json(p) for p in self._store["node_pool"].values() if p.get("cluster") == cluster]
        return found

    def _update_cluster(self, request, project, location, cluster):
        found = self._cluster(cluster)
        update = (request.body or {}).get("update") or {}
        desired = [k for k in update if k.startswith("desired")]
        if len(desired) != 1:
            raise bad_request(f"Exactly one update can be applied to a cluster per request, got {len(desired)}: {desired}")
        key = desired[0]
        field_name = {"desiredAddonsConfig": "addonsConfig", "desiredReleaseChannel": "releaseChannel",
                      "desiredWorkloadIdentityConfig": "workloadIdentityConfig",
                      "desiredControlPlaneEndpointsConfig": "controlPlaneEndpointsConfig",
                      "desiredMasterVersion": "currentMasterVersion"}.get(key)
        if field_name is None:
            raise bad_request(f"{key} is not supported by this fake")
        value = f"{update[key]}.2-gke.1475000" if key == "desiredMasterVersion" else update[key]
        return self._gke_op(project, location, cluster, "UPDATE_CLUSTER", found["selfLink"],
                            lambda: found.update({field_name: value}))

    def _delete_cluster(self, request, project, location, cluster):
        found = self._cluster(cluster)

        def finish():
            self._store["cluster"].pop(cluster, None)
            for name in [n for n, p in self._store["node_pool"].items() if p.get("cluster") == cluster]:
                del self._store["node_pool"][name]
        operation = self._gke_op(project, location, cluster, "DELETE_CLUSTER", found["selfLink"], finish)
        found["status"] = "STOPPING"
        return operation

    def _create_node_pool(self, request, project, location, cluster):
        found = self._cluster(cluster)
        if found["status"] != "RUNNING":
            raise bad_request(f"Cluster {cluster} is {found['status']}; node pools can be added when it is RUNNING",
                              "FAILED_PRECONDITION")
        pool = dict((request.body or {}).get("nodePool") or {})
        name = pool.get("name", "")
        if name in self._store["node_pool"]:
            raise ApiError(409, "ALREADY_EXISTS", f"Already exists: node pool {name}.")
        for extra in pool.get("networkConfig", {}).get("additionalNodeNetworkConfigs", []):
            self._network_named(extra.get("network"))
            if extra.get("subnetwork", "").rsplit("/", 1)[-1] not in self._store["subnetwork"]:
                raise bad_request(f"Subnetwork {extra.get('subnetwork')} does not exist")
        affinity = pool.get("config", {}).get("reservationAffinity", {})
        if affinity and pool.get("config", {}).get("spot"):
            raise bad_request("Spot VMs cannot consume a specific reservation")
        if affinity.get("consumeReservationType") in (3, "SPECIFIC_RESERVATION") and not affinity.get("values"):
            raise bad_request("A SPECIFIC_RESERVATION affinity needs the reservation name in values")
        stored = dict(pool, status="PROVISIONING", cluster=cluster,
                      selfLink=f"{found['selfLink']}/nodePools/{name}")
        self._store["node_pool"][name] = stored
        return self._gke_op(project, location, cluster, "CREATE_NODE_POOL", stored["selfLink"],
                            lambda: stored.update(status="RUNNING"))

    def _pool(self, cluster: str, name: str) -> dict:
        pool = self._store["node_pool"].get(name)
        if pool is None or pool.get("cluster") != cluster:
            raise not_found(f"node pool {name} in cluster {cluster}")
        return pool

    @staticmethod
    def _pool_json(pool: dict) -> dict:
        return {k: v for k, v in pool.items() if k != "cluster"}

    def _get_node_pool(self, request, project, location, cluster, pool):
        return self._pool_json(self._pool(cluster, pool))

    def _delete_node_pool(self, request, project, location, cluster, pool):
        found = self._pool(cluster, pool)
        operation = self._gke_op(project, location, cluster, "DELETE_NODE_POOL", found.get("selfLink", ""),
                                 lambda: self._store["node_pool"].pop(pool, None))
        found["status"] = "STOPPING"
        return operation

    def _resize_node_pool(self, request, project, location, cluster, pool, verb):
        found = self._pool(cluster, pool)
        body = request.body or {}
        if verb == "setAutoscaling":
            scaling = body.get("autoscaling") or {}
            if int(scaling.get("minNodeCount", 0)) > int(scaling.get("maxNodeCount", 0)):
                raise bad_request("autoscaling minNodeCount must not exceed maxNodeCount")
            change = {"autoscaling": scaling}
        else:
            change = {"nodeCount": int(body.get("nodeCount", 0))}  # proto3 leaves a 0 out
        return self._gke_op(project, location, cluster, verb.upper(), found.get("selfLink", ""),
                            lambda: found.update(change))

    # -- Managed Lustre ---------------------------------------------------------------------
    def _lustre_op(self, project: str, location: str, on_done) -> dict:
        name = f"projects/{project}/locations/{location}/operations/operation-{next(self._ids)}"
        return self._lro_json(self._operation("lustre", "lustre", name, on_done, name=name))

    def _create_instance(self, request, project, location):
        instance_id = request.query.get("instanceId", "")
        if not _NAME.match(instance_id):
            raise bad_request(f"instance_id '{instance_id}' must be 1-63 lowercase letters, digits or hyphens")
        if instance_id in self._store["lustre_instance"]:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource 'instances/{instance_id}' already exists")
        body = dict(request.body or {})
        capacity, throughput = int(body.get("capacityGib", 0)), int(body.get("perUnitStorageThroughput", 0))
        step = _LUSTRE_STEP.get(throughput)
        if step is None:
            raise bad_request(f"perUnitStorageThroughput {throughput} is not one of {sorted(_LUSTRE_STEP)}")
        if capacity < step or capacity % step:
            raise bad_request(f"capacityGib {capacity} must be a multiple of {step} at {throughput} MB/s/TiB")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,7}", body.get("filesystem", "")):
            raise bad_request(f"filesystem '{body.get('filesystem')}' must be 1-8 alphanumerics starting with a letter")
        network = self._network_named(body.get("network"))
        if network not in self._store["connection"]:
            raise bad_request(f"Network {network} has no private services access connection", "FAILED_PRECONDITION")
        path = f"projects/{project}/locations/{location}/instances/{instance_id}"
        stored = dict(body, name=path, state="CREATING", mountPoint=f"10.112.0.5@tcp:/{body['filesystem']}")
        self._store["lustre_instance"][instance_id] = stored

        def finish():
            stored["state"] = "ACTIVE"
            return dict(stored, **{"@type": "type.googleapis.com/google.cloud.lustre.v1.Instance"})
        return self._lustre_op(project, location, finish)

    def _get_instance(self, request, project, location, name):
        return self._get("lustre_instance", name)

    def _update_instance(self, request, project, location, name):
        found = self._get("lustre_instance", name)
        mask = {m.strip() for m in request.query.get("updateMask", "").split(",") if m.strip()}
        body = request.body or {}
        if mask - {"capacity_gib", "capacityGib", "description", "labels"}:
            raise bad_request(f"updateMask {sorted(mask)}: only capacity_gib, description and labels can change")
        if found["state"] != "ACTIVE":
            raise bad_request(f"instance {name} is {found['state']}", "FAILED_PRECONDITION")
        change = {}
        if mask & {"capacity_gib", "capacityGib"}:
            capacity, step = int(body.get("capacityGib", 0)), _LUSTRE_STEP[int(found["perUnitStorageThroughput"])]
            if capacity < int(found["capacityGib"]):
                raise bad_request(f"capacityGib can only grow ({found['capacityGib']} -> {capacity})")
            if capacity % step:
                raise bad_request(f"capacityGib {capacity} must be a multiple of {step}")
            change["capacityGib"] = str(capacity)
        found["state"] = "UPDATING"

        def finish():
            found.update(change, state="ACTIVE")
            return dict(found, **{"@type": "type.googleapis.com/google.cloud.lustre.v1.Instance"})
        return self._lustre_op(project, location, finish)

    def _delete_instance(self, request, project, location, name):
        found = self._get("lustre_instance", name)
        found["state"] = "DELETING"
        def finish():
            self._store["lustre_instance"].pop(name, None)
            return {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return self._lustre_op(project, location, finish)

    # -- shared -----------------------------------------------------------------------------
    def _get(self, kind: str, name: str) -> dict:
        found = self._store[kind].get(name)
        if found is None:
            raise not_found(f"{kind} {name}")
        return found


def _overlaps(a: str, b: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_network(a, strict=False).overlaps(ipaddress.ip_network(b, strict=False))
    except ValueError:
        raise bad_request(f"Invalid IPCidrRange: {b}") from None


def main() -> None:
    """`python tests/fakes/gcp.py [--latency S] [--operation-seconds S]`: serve until stdin closes.

    Prints the endpoints as one JSON line (RLOPS_API_ENDPOINTS takes it as it is). Run apart from
    the process under test, the fake's own work does not compete with it for the interpreter.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--operation-seconds", type=float, default=0.3)
    args = parser.parse_args()
    fake = FakeGcp(latency=args.latency, operation_seconds=args.operation_seconds).start()
    print(json.dumps(fake.endpoints), flush=True)
    sys.stdin.read()
    fake.stop()


if __name__ == "__main__":
    main()
