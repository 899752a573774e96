"""A fake of the GCP control plane for the real Google client libraries, over HTTP on 127.0.0.1.

It serves the REST paths that google-cloud-compute, google-cloud-container, google-cloud-lustre,
google-cloud-secret-manager and google-api-python-client's servicenetworking send, with the
behaviour a provisioning engine has to cope with:

* long-running operations that finish `operation_seconds` after they start (PENDING, RUNNING, DONE);
  a Compute resource appears only when its insert is done, GKE clusters and node pools show
  PROVISIONING and Lustre instances CREATING until then;
* 404 for what does not exist, 409 for what does, the checks the real APIs make on the fields sent
  (names, CIDR overlaps, references to other resources, resources in use, Lustre tiers, project
  numbers in peerings) and GKE's one operation per cluster at a time;
* Managed Lustre's exportData and importData: each instance's file system is a local directory
  (`lustre_files`), Cloud Storage a real fake-gcs-server (`storage_endpoint`); the copy happens while the
  operation runs, with TransferCounters in its metadata;
* injected latency and transient faults, and a log of every request.

One project's worth of resources: names are unique per kind, whatever project a path names.
Stored resources are the JSON the API returns (camelCase, int64 as strings as the client sent them);
node pools carry one extra key, "cluster", naming their cluster.
"""

import base64
import contextlib
import functools
import ipaddress
import itertools
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import google_crc32c
from google.rpc import code_pb2

from fakes import google_apis, iam
from fakes.jsonhttp import JsonServer, reply, request_body

KINDS = ("network", "subnetwork", "firewall", "address", "resource_policy", "connection", "cluster", "node_pool",
         "lustre_instance", "secret_version")
COMPUTE = "https://www.googleapis.com/compute/v1"
GKE = "https://container.googleapis.com/v1"
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_GKE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
# Managed Lustre's performance tiers (docs.cloud.google.com/managed-lustre/docs/performance-tiers, read
# 2026-12): MB/s per TiB -> (minimum and step in GiB, the capacity up to which that step holds, the step above
# it, the maximum). 0 is the Dynamic tier (Instance.perUnitStorageThroughput: "must not be set or must be set
# to zero" with dynamicTierOptions.mode DEFAULT_CACHE).
LUSTRE_PAGE_SIZE = 2  # the real default is larger; two makes every test with three instances page
FUNCTIONS_PAGE_SIZE = 2  # the same for Cloud Functions: rlops's four span two pages
_LUSTRE_TIERS = {1000: (9000, 1_530_000, 72_000, 10_008_000), 500: (18_000, 3_060_000, 144_000, 20_016_000),
                 250: (36_000, 6_120_000, 288_000, 40_032_000), 125: (72_000, 12_240_000, 72_000, 12_240_000),
                 0: (472_000, 84_016_000, 472_000, 84_016_000)}
_PORTED = {"tcp", "udp", "sctp", "6", "17", "132"}
_SPECIFIC_RESERVATION = (3, "SPECIFIC_RESERVATION")
_ADVANCED_DATAPATH = (2, "ADVANCED_DATAPATH")


# -- errors -------------------------------------------------------------------------------------
class ApiError(Exception):
    """An error answer, in Google's JSON error shape."""

    def __init__(self, code: int, status: str, message: str, reason: str = "invalid", details: list | None = None):
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason
        self.details = details or []  # google.rpc detail messages (ErrorInfo, ...), each with its "@type"

    def body(self) -> dict:
        error = {"code": self.code, "message": self.message, "status": self.status,
                 "errors": [{"reason": self.reason, "message": self.message, "domain": "global"}]}
        return {"error": {**error, "details": self.details} if self.details else error}


def not_found(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The resource '{what}' was not found", "notFound")


def conflict(what: str) -> ApiError:
    return ApiError(409, "ALREADY_EXISTS", f"The resource '{what}' already exists", "alreadyExists")


def invalid(message: str, reason: str = "invalid") -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message, reason)


def precondition(message: str, reason: str = "failedPrecondition") -> ApiError:
    return ApiError(400, "FAILED_PRECONDITION", message, reason)


def gke_busy(kind: str, operation: str, cluster: str) -> str:
    """GKE's refusal while another operation runs on the cluster, in the wordings users report (the Terraform
    Google provider's issues #975, #3650, #7638 and #10366 quote them): one for the cluster's own lifecycle, one
    naming what the running operation does, and the older "incompatible operation"."""
    if kind in ("CREATE_CLUSTER", "DELETE_CLUSTER", "AUTO_REPAIR_NODES"):
        return "Cluster is currently being created, deleted, updated or repaired and cannot be updated."
    doing = {"UPDATE_CLUSTER": f"upgrading cluster {cluster}", "UPGRADE_MASTER": f"upgrading cluster {cluster}",
             "CREATE_NODE_POOL": "creating a node pool", "DELETE_NODE_POOL": "deleting a node pool"}.get(kind)
    if doing:
        return f"Operation {operation} is currently {doing}. Please wait and try again once it is done."
    return f"Cluster is running incompatible operation {operation}."


class OperationFailed(Exception):
    """Raised when an operation finishes: it ends DONE with this error (google.rpc code and message; for Compute,
    its error code, as QUOTA_EXCEEDED, with the Operation's errorDetails)."""

    def __init__(self, code: int | str, message: str, details: list | None = None):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or []


def quota_error(api: str, project: str, metric: str, limit: float, region: str | None,
                requested: float = 0.0) -> ApiError:
    """A request refused for quota, as the API answers it: Compute with 403 `quotaExceeded` ("Quota 'CPUS'
    exceeded.  Limit: 24.0 in region us-central1."), GKE with 403 "Insufficient regional quota to satisfy
    request" (the wordings users report, e.g. the Terraform Google provider's issues); both with the ErrorInfo of
    google/api/error_reason.proto's RESOURCE_QUOTA_EXCEEDED (domain googleapis.com, the consumer, service, metric
    and limit in its metadata)."""
    where = f"in region {region}" if region else "globally"
    limit_name = f"{metric}-per-project" + ("-region" if region else "")
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RESOURCE_QUOTA_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {"consumer": f"projects/{project}", "service": "compute.googleapis.com",
                         "quota_metric": f"compute.googleapis.com/{metric.lower()}", "quota_limit": limit_name}}
    if api == "compute":
        error = ApiError(403, "PERMISSION_DENIED", f"Quota '{metric}' exceeded.  Limit: {limit:.1f} {where}.",
                         "quotaExceeded", [info])
    else:
        error = ApiError(403, "PERMISSION_DENIED", f"Insufficient regional quota to satisfy request: resource "
                         f"\"{metric}\": request requires '{requested:.1f}' and is short '{requested - limit:.1f}'. "
                         f"project has a quota of '{limit:.1f}' with '{limit:.1f}' available. View and manage quotas "
                         f"at https://console.cloud.google.com/iam-admin/quotas?usage=USED&project={project}.",
                         "forbidden", [info])
    return error


# -- the request log and operations -----------------------------------------------------------
@dataclass
class Request:
    method: str
    path: str                 # without the query
    query: dict               # one value per parameter
    body: dict | None         # the parsed JSON body
    status: int               # what the fake answered (0 while it is being answered)
    user_agent: str           # User-Agent and x-goog-api-client, joined
    time: float               # time.time() at arrival
    raw_query: str = ""       # the query as sent (a repeated parameter, as Service Usage's `names`, is all there)
    caller: str = ""          # the principal whose token it carried (when the fake enforces IAM)


@dataclass
class Operation:
    name: str
    api: str                  # compute, container, lustre, servicenetworking
    kind: str                 # operationType or verb
    target: str               # the selfLink or resource name it acts on
    started: float            # time.time()
    seconds: float
    on_done: Callable[[], dict | None] | None = None  # runs once, under the lock; returns the response
    scope: str = ""           # compute: "global" or "regions/R"; GKE: the cluster it keeps busy
    done: bool = False
    response: dict | None = None
    error: OperationFailed | None = None
    busy: Callable[[], bool] | None = None  # while it answers True the operation is not done, whatever the time
    clock: Callable[[], float] = time.time  # the fake's (FakeGcp.clock)

    def phase(self) -> str:
        if self.done:
            return "DONE"
        return "PENDING" if self.clock() - self.started < self.seconds / 3 else "RUNNING"


@dataclass
class Transfer:
    """One Lustre exportData or importData: what it copies and how far it got (TransferOperationMetadata)."""
    kind: str                 # EXPORT or IMPORT (TransferType)
    instance: str             # the instance's id
    lustre_path: str          # the request's LustrePath.path ("/" when left out)
    gcs_uri: str              # the request's GcsPath.uri
    # (source, destination, bytes) of what is scheduled: a Path and an object name, one way or the other; a None
    # destination is an object whose name makes no Lustre path (it fails)
    items: list[tuple]
    counters: dict[str, int]  # TransferCounters, by JSON name
    failure: tuple[int, str] | None = None  # the whole transfer failed (google.rpc code, message): nothing copied
    fail_after: tuple[int, int, str] | None = None  # fail_transfers: (objects copied, then this code, message)
    errors: dict = field(default_factory=dict)  # google.rpc code -> [count, at most 5 ErrorLogEntry]
    finished: bool = False    # the worker copied or failed every object
    ended: float = 0.0        # time.time() when its operation was done

    def fail(self, code: int, uri: str, detail: str, size: int | None = None) -> None:
        """An object (of `size` bytes) that could not be copied, or with no size the whole transfer: counted in
        objectsFailedCount if an object, and sampled in errorSummaries."""
        if size is not None:
            self.counters["objectsFailedCount"] += 1
            self.counters["bytesFailedCount"] += size
        summary = self.errors.setdefault(code, [0, []])
        summary[0] += 1
        if len(summary[1]) < 5:  # ErrorSummary.error_log_entries: "At most 5 error log entries are recorded for
            summary[1].append({"uri": uri, "errorDetails": [detail]})  # a given error code" (types/transfer.py)


_COUNTERS = ("foundObjectsCount", "bytesFoundCount", "objectsSkippedCount", "bytesSkippedCount", "objectsCopiedCount",
             "bytesCopiedCount", "objectsFailedCount", "bytesFailedCount")
# A bucket's name (cloud.google.com/storage/docs/buckets#naming): 3-63 lowercase letters, digits, dashes,
# underscores and dots, starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


class FakeGcp:
    def __init__(self, *, operation_seconds: float = 0.3, latency: float = 0.0, seed: int = 0,
                 storage_endpoint: str | None = None, files_root: Path | None = None):
        self.operation_seconds = operation_seconds
        # The fake-gcs-server Lustre transfers read and write (None: STORAGE_EMULATOR_HOST at the transfer's time).
        self.storage_endpoint = storage_endpoint
        # Where lustre_files keeps each instance's file system; None: a temporary directory, removed by stop().
        self._files_root, self._owns_files_root = (Path(files_root), False) if files_root else (None, True)
        self._transfers: dict[str, Transfer] = {}            # operation name -> its transfer
        self._transfer_requests: dict[tuple[str, str], str] = {}  # (instance, requestId) -> operation name
        self._failing_transfers: list[tuple[int, int, str]] = []
        self._workers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.latency = latency        # seconds slept per request
        # When operations start and end (a test's simulated clock makes them deterministic), and how long those of
        # a kind take where not `operation_seconds` (e.g. {"SET_NODE_POOL_SIZE": 90.0}: a GPU pool's resize).
        self.clock: Callable[[], float] = time.time
        self.operation_kind_seconds: dict[str, float] = {}
        self.fail_rate = 0.0          # probability of a transient error (429 and 503 in turn) before anything is done
        self.requests: list[Request] = []
        self.unanswered_zones: list[str] = []  # each answers one cluster list with that zone in missingZones
        self._lock = threading.RLock()
        self._random = random.Random(seed)
        self._store: dict[str, dict[str, dict]] = {kind: {} for kind in KINDS}
        self._creating: dict[str, dict[str, dict]] = {kind: {} for kind in KINDS}  # Compute inserts not done yet
        self._operations: dict[str, Operation] = {}
        self._fail_next: list[tuple[int | str | ApiError, str | None]] = []
        self._failing_operations: list[tuple[str, OperationFailed]] = []
        self._holding = False
        self._lustre_hosts = itertools.count(3)
        self._faults = itertools.count()
        self._ids = itertools.count(1)
        # What `rlops doctor` reads of a project (set by tests; by default everything the seeds need is there).
        self.disabled_services: set[tuple[str, str]] = set()           # (project, service name)
        self.reservations: dict[tuple[str, str, str], dict] = {}       # (project, zone, name) -> Reservation JSON
        self.missing_network_profiles: set[str] = set()                # e.g. {"us-central1-b-vpc-roce"}
        self.denied_permissions: set[tuple[str, str]] = set()          # (project, permission) the caller lacks
        self.machine_types_missing: set[tuple[str, str]] = set()       # (zone, machine type) not offered there
        self.quota_limits: dict[tuple[str, str, str], float] = {}      # (project, region or "global", metric) -> limit
        self.lustre_zones = set(LUSTRE_ZONES)                          # where Managed Lustre is offered
        self.functions: dict[str, dict] = {}  # name projects/P/locations/L/functions/F -> cloudfunctions v2 Function
        self.scheduler_jobs: dict[str, dict] = {}  # name projects/P/locations/L/jobs/J -> cloudscheduler v1 Job
        self.gpu_family_quota: dict[tuple[str, str, str], int] = {}  # (project, region, gpu_family) -> limit
        self.vms: list[dict] = []  # compute v1 Instances beside the GKE nodes (put_gpu_vm)
        # Who may do what (tests/fakes/iam.py); None: every request is granted, as to a project's owner.
        self.iam: iam.Iam | None = None
        from fakes.deploy_apis import DeployApis  # here: it builds on this module's errors and operations

        self.deploy_apis = DeployApis(self)  # what cloudbuild/deploy.yaml's gcloud commands call
        from fakes.artifactregistry import ArtifactRegistry

        self.artifact_registry = ArtifactRegistry(self)  # the image cache's remote repositories
        self._routes = [(method, re.compile(pattern), handler) for method, pattern, handler in
                        self._compute_routes() + self._servicenetworking_routes() + self._gke_routes()
                        + self._lustre_routes() + self._secret_routes() + self._project_routes()
                        + self._deployment_routes() + self._quota_routes() + self.deploy_apis.routes()
                        + self.artifact_registry.routes()]
        self._server: JsonServer | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "FakeGcp":
        self._stopping.clear()
        self._server = JsonServer(self._handle, "fake-gcp")
        return self

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None
        self._stopping.set()  # transfers still copying stop after the object in hand
        for worker in self._workers:
            worker.join(timeout=30)
        self._workers.clear()
        if self._owns_files_root and self._files_root is not None:
            shutil.rmtree(self._files_root, ignore_errors=True)
            self._files_root = None

    def __enter__(self) -> "FakeGcp":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoints(self) -> dict[str, str]:
        base = self._server.url
        return {"compute": base, "container": f"{base}/gke", "lustre": f"{base}/lustre", "serviceusage": f"{base}/su",
                "cloudresourcemanager": f"{base}/crm", "cloudfunctions": f"{base}/cf", "cloudscheduler": f"{base}/cs",
                "cloudquotas": f"{base}/cq", "artifactregistry": f"{base}/ar",
                "servicenetworking": f"{base}/sn", "secretmanager": f"{base}/sm", "iam": f"{base}/iam"}

    # -- test hooks -----------------------------------------------------------------------------
    def fail_next(self, count: int, status: "int | ApiError" = 503, match: str | None = None,
                  busy: str | None = None) -> None:
        """The next `count` requests whose "METHOD path" contains `match` fail with `status` (the error a real API
        answers with it, or this ApiError, as `quota_error` makes); with `busy` (an operationType), as GKE refuses a
        request while an operation of that kind runs."""
        with self._lock:
            self._fail_next += [(status if busy is None else busy, match)] * count

    def fail_operations(self, count: int, kind: str, code: int | str, message: str,
                        details: list | None = None) -> None:
        """The next `count` operations of `kind` (operationType) are accepted and then end DONE with this error,
        as a resize that meets a stockout does (Compute's: its error code and errorDetails, as an insert over
        quota ends with QUOTA_EXCEEDED and a quotaInfo)."""
        with self._lock:
            self._failing_operations += [(kind, OperationFailed(code, message, details))] * count

    def fail_transfers(self, count: int, copied: int, code: int = 13,
                       message: str = "Internal error while copying the object (injected)") -> None:
        """The next `count` exportData/importData copy their first `copied` objects and fail every other one with
        this google.rpc code (objectsFailedCount, errorSummaries); their operations end DONE with an error."""
        with self._lock:
            self._failing_transfers += [(copied, code, message)] * count

    def lustre_files(self, instance: str) -> Path:
        """The directory standing for the instance's file system root (its id or full name), created if need be:
        what a test writes there is what the cluster wrote to /lustre. Deleting the instance deletes it."""
        name = _last(instance)
        if not _RFC1035.fullmatch(name):
            raise ValueError(f"{instance!r} names no Lustre instance")
        with self._lock:
            if self._files_root is None:
                self._files_root = Path(tempfile.mkdtemp(prefix="fake-gcp-lustre-"))
            folder = self._files_root / name
            folder.mkdir(parents=True, exist_ok=True)
            return folder

    @contextlib.contextmanager
    def holding_operations(self):
        """Operations stay RUNNING while this lasts (a resize that drains nodes for minutes), then finish."""
        with self._lock:
            self._holding = True
        try:
            yield
        finally:
            with self._lock:
                self._holding = False

    def mutations(self) -> list[Request]:
        """Accepted requests that create, change or delete something (not operation polls or waits)."""
        return [r for r in list(self.requests) if r.method in ("POST", "PATCH", "PUT", "DELETE")
                and 200 <= r.status < 300 and not r.path.endswith(("/wait", ":testIamPermissions"))]

    def resources(self, kind: str) -> dict[str, dict]:
        """name -> a copy of the stored JSON (a peering connection is keyed by its network's name)."""
        with self._lock:
            self._advance()
            return json.loads(json.dumps(self._store[kind]))

    def put(self, kind: str, name: str, body: dict) -> None:
        """Set a resource as if someone had created or changed it in the console."""
        with self._lock:
            self._store[kind][name] = dict(json.loads(json.dumps(body)))

    def put_secret(self, version: str, value: str) -> None:
        """A secret version's value, as `gcloud secrets versions add` would have left it."""
        self.put("secret_version", version, {"name": version, "value": value})

    # -- HTTP -----------------------------------------------------------------------------------
    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(http.path)
        raw = request_body(http)
        if parts.path == "/token":
            self._token(http, raw)
            return
        if parts.path.startswith("/upload/"):  # a signed URL: no credentials (deploy_apis.DeployApis.upload)
            self.deploy_apis.upload(http, raw)
            return
        query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        # GAPIC clients put their ClientInfo user agent in x-goog-api-client; discovery clients in User-Agent.
        agent = " ".join(filter(None, (http.headers.get("User-Agent"), http.headers.get("x-goog-api-client"))))
        try:
            body, unreadable = (json.loads(raw) if raw.strip() else None), None
        except ValueError:
            body, unreadable = None, invalid("Invalid JSON payload received.")
        request = Request(http.command, parts.path, query, body, 0, agent, time.time(), parts.query)
        with self._lock:
            self.requests.append(request)
        try:
            if self.iam is not None:
                request.caller = self._caller(http.headers.get("Authorization"))
            if unreadable:
                raise unreadable
            status, answer = 200, self._serve(request)
        except ApiError as error:
            status, answer = error.code, error.body()
        except Exception:  # a bug of the fake: say so on stderr, answer 500
            traceback.print_exc(file=sys.stderr)
            status, answer = 500, ApiError(500, "INTERNAL", "Internal error in the fake", "backendError").body()
        request.status = status
        reply(http, status, answer)

    def _serve(self, request: Request) -> dict:
        if self.latency:
            time.sleep(self.latency)
        self._maybe_fail(request)
        try:
            google_apis.check(request.method, request.path, request.query, request.body)
        except google_apis.Violation as violation:
            if violation.code == 404:
                raise ApiError(404, "NOT_FOUND", str(violation), "notFound") from None
            raise invalid(str(violation)) from None
        if self.iam is not None:
            self._authorize(request)
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path) if method == request.method else None
            if match:
                if request.path.endswith("/wait"):
                    self._hold_until_done(match["op"])
                with self._lock:
                    self._advance()
                    return handler(request, **match.groupdict())
        raise ApiError(404, "NOT_FOUND", f"The requested URL {request.method} {request.path} was not found on this "
                       "server (the fake has no such method).", "notFound")

    def _maybe_fail(self, request: Request) -> None:
        with self._lock:
            for i, (status, match) in enumerate(self._fail_next):
                if match is None or match in f"{request.method} {request.path}":
                    del self._fail_next[i]
                    raise status if isinstance(status, ApiError) else self._injected(status)
            if self.fail_rate and self._random.random() < self.fail_rate:
                raise self._injected((429, 503)[next(self._faults) % 2])

    # -- IAM ----------------------------------------------------------------------------------
    def _token(self, http: BaseHTTPRequestHandler, raw: bytes) -> None:
        """Google's OAuth token endpoint, for the JWT-bearer grant google-auth's service account credentials send
        (RFC 7523; iam.Iam.credentials_file writes their key file)."""
        form = {key: values[-1] for key, values in parse_qs(raw.decode()).items()}
        if self.iam is None or form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            reply(http, 400, {"error": "unsupported_grant_type"})
            return
        try:
            reply(http, 200, self.iam.mint(form.get("assertion", "")))
        except iam.Denied:
            reply(http, 400, {"error": "invalid_grant", "error_description": "Bad Request"})

    def _caller(self, authorization: str | None) -> str:
        try:
            return self.iam.caller(authorization)
        except iam.Denied as denied:
            raise ApiError(denied.code, denied.status, denied.message, "authError") from None

    def _authorize(self, request: Request) -> None:
        """The permissions Google checks for this method (iam.method_permissions), on the resource it names: a
        secret version's secret, else the project; acting as the node service account a cluster or node pool
        names needs iam.serviceAccounts.actAs on that account (cloud.google.com/kubernetes-engine/docs/how-to/
        service-accounts, "Use a custom node service account")."""
        method = google_apis.method_id(request.method, request.path)
        if method is None:
            return
        names = re.search(r"projects/([^/:]+)", request.path)
        project = f"projects/{names[1] if names else self.iam.project}"
        secret = re.search(r"projects/[^/]+/secrets/[^/:]+", request.path)
        resource = secret[0] if secret and ".versions." in method else project
        domain = f"{method.split('.', 1)[0]}.googleapis.com"
        try:
            self.iam.check(request.caller, iam.method_permissions().get(method, ()), resource, domain)
            body = request.body or {}
            pools = [body["nodePool"]] if "nodePool" in body else (body.get("cluster") or {}).get("nodePools", [])
            number = self._project_number(project.removeprefix("projects/"))
            node_accounts = {pool.get("config", {}).get("serviceAccount") or self.default_node_account(number)
                             for pool in pools}
            for account in sorted(node_accounts) if method.endswith(".create") else ():
                self.iam.check(request.caller, ("iam.serviceAccounts.actAs",),
                               f"{project}/serviceAccounts/{account}", "iam.googleapis.com")
        except iam.Denied as denied:
            raise ApiError(denied.code, denied.status, denied.message, "forbidden", denied.details) from None

    @staticmethod
    def default_node_account(project_number: str) -> str:
        """The Compute Engine default service account, which GKE's nodes run as when a pool names none (and
        which the caller must then be able to act as, like any other)."""
        return f"{project_number}-compute@developer.gserviceaccount.com"

    @staticmethod
    def _injected(status: int | str) -> ApiError:
        """The error a real API answers with this status (or GKE's busy refusal, given an operationType)."""
        if isinstance(status, str):
            return precondition(gke_busy(status, "operation-injected", "rl-cluster"))
        if status == 429:
            return ApiError(429, "RESOURCE_EXHAUSTED", "Rate limit exceeded (injected)", "rateLimitExceeded")
        if status == 403:
            return ApiError(403, "PERMISSION_DENIED", "Required 'compute.networks.create' permission for "
                            "'projects/rlops-h200-example/global/networks/rl-net' (injected)", "forbidden")
        if status == 400:
            return precondition("Cluster is running incompatible operation operation-injected.")
        return ApiError(status, "UNAVAILABLE", "The service is currently unavailable (injected)", "backendError")

    # -- operations -----------------------------------------------------------------------------
    def _start(self, api: str, kind: str, target: str, on_done=None, *, scope: str = "", name: str = "") -> Operation:
        name = name or f"operation-{int(time.time() * 1000)}-{next(self._ids)}-{self._random.getrandbits(32):08x}"
        for i, (failing_kind, failure) in enumerate(self._failing_operations):
            if failing_kind == kind:
                del self._failing_operations[i]
                on_done = functools.partial(_raise, failure)
                break
        operation = Operation(name, api, kind, target, self.clock(),
                              self.operation_kind_seconds.get(kind, self.operation_seconds), on_done, scope,
                              clock=self.clock)
        self._operations[name] = operation
        return operation

    def _advance(self) -> None:
        """Finish, in the order they started, the operations whose time has come."""
        if self._holding:
            return
        now = self.clock()
        for operation in self._operations.values():
            if not operation.done and operation.started + operation.seconds <= now \
                    and not (operation.busy and operation.busy()):
                operation.done = True
                try:
                    operation.response = operation.on_done() if operation.on_done else None
                except OperationFailed as failed:
                    operation.error = failed

    def _operation(self, api: str, name: str) -> Operation:
        operation = self._operations.get(name)
        if operation is None or operation.api != api:
            raise not_found(f"operations/{name}")
        return operation

    def _hold_until_done(self, name: str) -> None:
        """Compute's operations.wait: answer when the operation is done (or after two minutes)."""
        operation = self._operations.get(name)
        if operation:
            time.sleep(max(0.0, min(120.0, operation.started + operation.seconds - time.time())))

    def _lro_json(self, operation: Operation, metadata: dict | None = None) -> dict:
        """google.longrunning.Operation: name, metadata, done, error, response and nothing else (clients parse it
        strictly); like any proto3 JSON, done is left out while it is false."""
        answer: dict = {"name": operation.name}
        if metadata:
            answer["metadata"] = metadata
        if operation.done:
            answer["done"] = True
            if operation.error:
                answer["error"] = {"code": operation.error.code, "message": operation.error.message}
            else:
                answer["response"] = operation.response or {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return answer

    # -- Compute Engine -------------------------------------------------------------------------
    _COLLECTIONS = {"networks": "network", "subnetworks": "subnetwork", "firewalls": "firewall", "addresses": "address",
                    "resourcePolicies": "resource_policy"}

    def _compute_routes(self) -> list:
        project = r"/compute/v1/projects/(?P<project>[^/]+)"
        global_ = project + r"/global/(?P<collection>networks|firewalls|addresses)"
        regional = project + r"/regions/(?P<region>[^/]+)/(?P<collection>subnetworks|resourcePolicies)"
        operation = project + r"/(?P<scope>global|regions/[^/]+)/operations/(?P<op>[^/]+)"
        one = r"/(?P<name>[^/]+)"
        return [
            ("POST", global_, self._compute_insert), ("POST", regional, self._compute_insert),
            ("GET", global_, self._compute_list), ("GET", regional, self._compute_list),
            ("GET", global_ + one, self._compute_get), ("GET", regional + one, self._compute_get),
            ("PATCH", global_.replace("|addresses", "") + one, self._compute_patch),
            ("DELETE", global_ + one, self._compute_delete), ("DELETE", regional + one, self._compute_delete),
            ("GET", operation, self._compute_operation), ("POST", operation + "/wait", self._compute_operation),
        ]

    @staticmethod
    def _link(project: str, collection: str, name: str, region: str | None = None) -> str:
        scope = f"regions/{region}" if region else "global"
        return f"{COMPUTE}/projects/{project}/{scope}/{collection}/{name}"

    def _compute_op(self, project: str, region: str | None, kind: str, target: str, on_done) -> dict:
        operation = self._start("compute", kind, target, on_done, scope=f"regions/{region}" if region else "global")
        return self._compute_op_json(project, operation)

    def _compute_op_json(self, project: str, operation: Operation) -> dict:
        phase = operation.phase()
        answer = {"kind": "compute#operation", "id": str(zlib.crc32(operation.name.encode())),
                  "name": operation.name, "operationType": operation.kind, "status": phase,
                  "progress": 100 if operation.done else 0, "targetLink": operation.target, "user": "fake@example.com",
                  "insertTime": _timestamp(operation.started),
                  "selfLink": f"{COMPUTE}/projects/{project}/{operation.scope}/operations/{operation.name}"}
        if phase != "PENDING":
            answer["startTime"] = _timestamp(operation.started)
        if operation.done:
            answer["endTime"] = _timestamp(operation.started + operation.seconds)
        if operation.scope.startswith("regions/"):
            answer["region"] = f"{COMPUTE}/projects/{project}/{operation.scope}"
        if operation.done and operation.error:  # compute v1 Operation.error.errors[]: code, message, errorDetails
            failure = operation.error
            code = failure.code if isinstance(failure.code, str) else code_pb2.Code.Name(failure.code)
            answer["error"] = {"errors": [{"code": code, "message": failure.message,
                                           **({"errorDetails": failure.details} if failure.details else {})}]}
        return answer

    def _compute_operation(self, request, project, scope, op):
        operation = self._operation("compute", op)
        if operation.scope != scope:
            raise not_found(f"projects/{project}/{scope}/operations/{op}")
        return self._compute_op_json(project, operation)

    def _compute_insert(self, request, project, collection, region=None):
        kind, body = self._COLLECTIONS[collection], dict(request.body or {})
        name = body.get("name", "")
        if not _RFC1035.fullmatch(name):
            raise invalid(f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                          "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if name in self._store[kind] or name in self._creating[kind]:
            raise conflict(f"projects/{project}/{f'regions/{region}' if region else 'global'}/{collection}/{name}")
        build = {"network": self._new_network, "subnetwork": self._new_subnetwork,
                 "firewall": self._new_firewall, "address": self._new_address,
                 "resource_policy": self._new_resource_policy}[kind]
        stored = build(project, region, body)
        stored.update(kind=f"compute#{kind}", id=str(self._random.getrandbits(63)),
                      creationTimestamp=_timestamp(), selfLink=self._link(project, collection, name, region))
        self._creating[kind][name] = stored

        def finish():
            self._store[kind][name] = self._creating[kind].pop(name)
        return self._compute_op(project, region, "insert", stored["selfLink"], finish)

    def _new_network(self, project, region, body: dict) -> dict:
        if "autoCreateSubnetworks" not in body and "IPv4Range" not in body:
            # Network.autoCreateSubnetworks: "Must be set to create a VPC network. If not set, a legacy network is
            # created" (compute.v1 discovery), and a legacy network needs its IPv4Range.
            raise invalid("Invalid value for field 'resource.autoCreateSubnetworks': ''. Set it to create a VPC "
                          "network (a legacy network needs resource.IPv4Range).")
        stored = dict(body, mtu=_mtu(body.get("mtu", 1460)),
                      autoCreateSubnetworks=bool(body.get("autoCreateSubnetworks")),
                      routingConfig=_routing(body.get("routingConfig") or {"routingMode": "REGIONAL"}))
        if body.get("networkProfile"):
            match = re.fullmatch(r"(?:.*/)?projects/([^/]+)/global/networkProfiles/([^/]+)", body["networkProfile"])
            if not match:
                raise invalid(f"Invalid value for field 'resource.networkProfile': '{body['networkProfile']}'.")
            stored["networkProfile"] = f"{COMPUTE}/projects/{match[1]}/global/networkProfiles/{match[2]}"
        return stored

    def _new_subnetwork(self, project, region, body: dict) -> dict:
        network = self._network_of(body.get("network"), "resource.network")
        cidr = _cidr(body.get("ipCidrRange"), "resource.ipCidrRange")
        if cidr.prefixlen > 29:
            raise invalid(f"Invalid IPCidrRange: {cidr} is too small: the smallest subnet is a /29.")
        for kind in ("subnetwork", "address"):
            for other in [*self._store[kind].values(), *self._creating[kind].values()]:
                if other.get("network", "").endswith(f"/networks/{network}") and _overlaps(cidr, _range_of(other)):
                    raise invalid(f"Invalid IPCidrRange: {cidr} conflicts with existing {kind} '{other['name']}' "
                                  f"({_range_of(other)}).", "invalid")
        return dict(body, network=self._link(project, "networks", network), region=f"{COMPUTE}/projects/{project}/"
                    f"regions/{region}", gatewayAddress=str(cidr[1]), purpose="PRIVATE", stackType="IPV4_ONLY",
                    fingerprint=f"{self._random.getrandbits(64):016x}")

    def _new_firewall(self, project, region, body: dict) -> dict:
        _check_rules(body)
        network = self._network_of(body.get("network") or "global/networks/default", "resource.network")
        direction = body.get("direction", "INGRESS")
        if direction not in ("INGRESS", "EGRESS"):
            raise invalid(f"Invalid value for field 'resource.direction': '{direction}'.")
        return dict(body, network=self._link(project, "networks", network), direction=direction,
                    priority=body.get("priority", 1000), disabled=bool(body.get("disabled")))

    def _new_address(self, project, region, body: dict) -> dict:
        address_type, purpose = body.get("addressType", "EXTERNAL"), body.get("purpose", "")
        if address_type == "EXTERNAL":
            return dict(body, addressType="EXTERNAL", status="RESERVED", address=f"34.120.{next(self._ids) % 250}.1")
        if purpose not in ("VPC_PEERING", "PRIVATE_SERVICE_CONNECT"):
            raise invalid(f"Invalid value for field 'resource.purpose': '{purpose}'. A global internal address needs "
                          "purpose VPC_PEERING or PRIVATE_SERVICE_CONNECT.")
        network = self._network_of(body.get("network"), "resource.network")
        prefix = int(body.get("prefixLength") or 0)
        if purpose == "VPC_PEERING" and not 8 <= prefix <= 29:
            raise invalid(f"Invalid value for field 'resource.prefixLength': '{prefix}'. A VPC_PEERING range needs a "
                          "prefix length between 8 and 29.")
        if body.get("address"):
            base = ipaddress.ip_address(body["address"])
            wanted = ipaddress.ip_network(f"{base}/{prefix}", strict=False)
            if wanted.network_address != base:
                raise invalid(f"Invalid value for field 'resource.address': '{base}'. The address of a VPC_PEERING "
                              f"range must be the first address of its /{prefix}.")
            self._check_free(network, wanted)
        return dict(body, network=self._link(project, "networks", network), status="RESERVED",
                    address=body.get("address") or self._free_range(network, prefix))

    @staticmethod
    def _new_resource_policy(project, region, body: dict) -> dict:
        workload = body.get("workloadPolicy")
        if workload is not None:
            # `gcloud compute resource-policies create workload-policy`: --type is required, and --accelerator-topology
            # and --max-topology-distance are one or the other (its synopsis); Cluster Toolkit's resource-policy module
            # refuses acceleratorTopologyMode without an acceleratorTopology (its precondition).
            if not workload.get("type"):
                raise invalid("Invalid value for field 'resource.workloadPolicy.type': ''. "
                              "A workload policy needs a type.")
            if workload.get("acceleratorTopology") and workload.get("maxTopologyDistance"):
                raise invalid("Invalid value for field 'resource.workloadPolicy': acceleratorTopology and "
                              "maxTopologyDistance cannot both be set.")
            if workload.get("acceleratorTopologyMode") and not workload.get("acceleratorTopology"):
                raise invalid("Invalid value for field 'resource.workloadPolicy.acceleratorTopologyMode': it needs "
                              "acceleratorTopology.")
        return dict(body, region=f"{COMPUTE}/projects/{project}/regions/{region}", status="READY")

    def _taken(self, network: str) -> list:
        taken = [ipaddress.ip_network(_range_of(r)) for kind in ("subnetwork", "address")
                 for r in [*self._store[kind].values(), *self._creating[kind].values()]
                 if r.get("network", "").endswith(f"/networks/{network}") and _range_of(r)]
        if self._store["network"][network].get("autoCreateSubnetworks"):
            taken.append(ipaddress.ip_network("10.128.0.0/9"))
        return taken

    def _check_free(self, network: str, wanted) -> None:
        used = next((str(t) for t in self._taken(network) if wanted.overlaps(t)), None)
        if used:
            raise invalid(f"Invalid value for field 'resource.address': '{wanted}' overlaps {used}, already used in "
                          f"network {network}.", "conflict")

    def _free_range(self, network: str, prefix: int) -> str:
        """The first /prefix of 10.0.0.0/8 that no subnet or range of the network (or its auto subnets) uses."""
        taken = self._taken(network)
        for candidate in ipaddress.ip_network("10.0.0.0/8").subnets(new_prefix=prefix):
            if not any(candidate.overlaps(used) for used in taken):
                return str(candidate.network_address)
        raise precondition(f"No free /{prefix} range is left in network {network}.", "ipSpaceExhausted")

    def _compute_list(self, request, project, collection, region=None):
        kind = self._COLLECTIONS[collection]
        items = [r for r in self._store[kind].values()
                 if region is None or r.get("region", "").endswith(f"/regions/{region}")]
        answer = {"kind": f"compute#{kind}List", "selfLink": self._link(project, collection, "", region).rstrip("/")}
        return dict(answer, items=items) if items else answer

    def _compute_get(self, request, project, collection, name, region=None):
        found = self._store[self._COLLECTIONS[collection]].get(name)
        if found is None:
            raise not_found(f"projects/{project}/{f'regions/{region}' if region else 'global'}/{collection}/{name}")
        return found

    def _compute_patch(self, request, project, collection, name):
        found = self._compute_get(request, project, collection, name)
        changes = {k: v for k, v in (request.body or {}).items() if found.get(k) != v and k != "name"}
        mutable = {"networks": {"mtu", "routingConfig", "description"},
                   "firewalls": {"allowed", "denied", "sourceRanges", "destinationRanges", "description", "priority",
                                 "disabled", "sourceTags", "targetTags", "targetServiceAccounts", "logConfig"},
                   }[collection]
        for key in changes.keys() - mutable:
            raise invalid(f"Invalid value for field 'resource.{key}': '{changes[key]}'. The field cannot be changed.")
        if "mtu" in changes:
            _mtu(changes["mtu"])
        if "routingConfig" in changes:
            _routing(changes["routingConfig"])
        if collection == "firewalls":
            _check_rules({**found, **changes})
        return self._compute_op(project, None, "patch", self._link(project, collection, name),
                                lambda: found.update(changes))

    def _compute_delete(self, request, project, collection, name, region=None):
        kind = self._COLLECTIONS[collection]
        self._compute_get(request, project, collection, name, region)
        users = self._users(kind, name)
        if users:
            raise invalid(f"The {kind} resource '{self._link(project, collection, name, region)}' is already being "
                          f"used by '{users[0]}'", "resourceInUseByAnotherResource")
        return self._compute_op(project, region, "delete", self._link(project, collection, name, region),
                                lambda: self._store[kind].pop(name, None))

    def _users(self, kind: str, name: str) -> list[str]:
        """What refers to this Compute resource, and so stops its deletion."""
        users = []
        pool_networks = [(pool["name"], extra) for pool in self._store["node_pool"].values()
                         for extra in pool.get("networkConfig", {}).get("additionalNodeNetworkConfigs", [])]
        if kind == "network":
            users += [r.get("selfLink", r.get("name")) for k in ("subnetwork", "firewall", "address")
                      for r in self._store[k].values() if r.get("network", "").endswith(f"/networks/{name}")]
            users += [f"peering {c['peering']}" for n, c in self._store["connection"].items() if n == name]
            users += [f"cluster {n}" for n, c in self._store["cluster"].items() if _last(c.get("network")) == name]
            users += [f"node pool {p}" for p, extra in pool_networks if _last(extra.get("network")) == name]
            users += [f"Lustre instance {n}" for n, i in self._store["lustre_instance"].items()
                      if _last(i.get("network")) == name]
        if kind == "subnetwork":
            users += [f"node pool {p}" for p, extra in pool_networks if _last(extra.get("subnetwork")) == name]
        if kind == "address":
            users += [f"peering {c['peering']}" for c in self._store["connection"].values()
                      if name in c.get("reservedPeeringRanges", [])]
        if kind == "resource_policy":
            users += [f"node pool {p['name']}" for p in self._store["node_pool"].values()
                      if _last(p.get("placementPolicy", {}).get("policyName")) == name]
        return users

    def _network_of(self, reference: str | None, field: str) -> str:
        """The name of the existing network `reference` (a URL or a partial path) points to."""
        name = _last(reference)
        if name in self._creating["network"]:
            raise invalid(f"The resource '{reference}' is not ready", "resourceNotReady")
        if name not in self._store["network"]:
            raise invalid(f"Invalid value for field '{field}': '{reference}'. The referenced network resource cannot "
                          "be found.")
        return name

    # -- Service Networking (private services access) -----------------------------------------
    def _servicenetworking_routes(self) -> list:
        connections = r"/sn/v1/services/servicenetworking.googleapis.com/connections"
        return [
            ("POST", connections, self._connect),
            ("GET", connections, self._list_connections),
            ("PATCH", connections + r"/-", self._update_connection),
            # The discovery document posts deleteConnection to the connection's name, with no ":verb".
            ("POST", connections + r"/(?P<peering>[^/:]+)(:deleteConnection)?", self._disconnect),
            ("GET", r"/sn/v1/(?P<op>operations/[^/]+)", self._sn_operation),
        ]

    def _sn_op(self, kind: str, network: str, on_done) -> dict:
        name = f"operations/pssn.p24-{next(self._ids)}-{self._random.getrandbits(32):08x}"
        return self._lro_json(self._start("servicenetworking", kind, network, on_done, name=name))

    def _sn_operation(self, request, op):
        return self._lro_json(self._operation("servicenetworking", op))

    def _connect(self, request):
        body = request.body or {}
        network = self._peering_network(body.get("network", ""))
        ranges = self._peering_ranges(network, body.get("reservedPeeringRanges"))
        if network in self._store["connection"]:
            raise precondition("Cannot modify allocated ranges in CreateConnection. Please use UpdateConnection.")
        stored = {"network": body["network"], "reservedPeeringRanges": ranges,
                  "peering": "servicenetworking-googleapis-com", "service": "services/servicenetworking.googleapis.com"}

        def finish():
            self._store["connection"][network] = stored
            return dict(stored, **{"@type": "type.googleapis.com/google.cloud.servicenetworking.v1.Connection"})
        return self._sn_op("connect", network, finish)

    def _list_connections(self, request):
        network = self._peering_network(request.query.get("network", ""), must_exist=False)
        found = self._store["connection"].get(network)
        return {"connections": [found]} if found else {}

    def _update_connection(self, request):
        if request.query.get("updateMask") != "reservedPeeringRanges":
            raise invalid(f"updateMask '{request.query.get('updateMask')}': only reservedPeeringRanges can change")
        body = request.body or {}
        network = self._peering_network(body.get("network", ""))
        connection = self._store["connection"].get(network)
        if connection is None:
            raise not_found(f"connection of network {network}")
        ranges = self._peering_ranges(network, body.get("reservedPeeringRanges"))

        def finish():
            connection["reservedPeeringRanges"] = ranges
            return dict(connection, **{"@type": "type.googleapis.com/google.cloud.servicenetworking.v1.Connection"})
        return self._sn_op("update", network, finish)

    def _disconnect(self, request, peering):
        network = self._peering_network((request.body or {}).get("consumerNetwork", ""))
        if network not in self._store["connection"]:
            raise not_found(f"connection {peering} of network {network}")

        def finish():
            # Accepted, but the operation fails while a producer's resource still uses the peering.
            users = [n for n, i in self._store["lustre_instance"].items() if _last(i.get("network")) == network]
            if users:
                raise OperationFailed(9, "Failed to delete connection; Producer services (e.g. CloudSQL, Cloud "
                                         "Memstore, etc.) are still using this connection (Lustre instance "
                                         f"{users[0]}).")
            self._store["connection"].pop(network, None)
        return self._sn_op("disconnect", network, finish)

    def _peering_network(self, reference: str, must_exist: bool = True) -> str:
        match = re.fullmatch(r"projects/([^/]+)/global/networks/([^/]+)", reference)
        if not match or not match[1].isdigit():
            raise invalid(f"Network '{reference}' must be of the form projects/PROJECT_NUMBER/global/networks/NAME "
                          "(the project number, not its ID)")
        return self._network_of(match[2], "network") if must_exist else match[2]

    def _peering_ranges(self, network: str, ranges: list[str] | None) -> list[str]:
        if not ranges:
            raise invalid("reservedPeeringRanges must name at least one allocated range")
        for name in ranges:
            address = self._store["address"].get(name)
            if (address is None or address.get("purpose") != "VPC_PEERING"
                    or not address.get("network", "").endswith(f"/networks/{network}")):
                raise precondition(f"Allocated IP range '{name}' not found in network '{network}'")
        return list(ranges)

    # -- GKE ------------------------------------------------------------------------------------
    def _gke_routes(self) -> list:
        location = r"/gke/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
        cluster = location + r"/clusters/(?P<cluster>[^/:]+)"
        pool = cluster + r"/nodePools/(?P<pool>[^/:]+)"
        return [
            ("POST", location + r"/clusters", self._create_cluster),
            ("GET", location + r"/clusters", self._list_clusters),
            ("GET", cluster, self._get_cluster), ("PUT", cluster, self._update_cluster),
            ("DELETE", cluster, self._delete_cluster),
            ("POST", cluster + r"/nodePools", self._create_node_pool),
            ("GET", pool, self._get_node_pool), ("DELETE", pool, self._delete_node_pool),
            ("PUT", pool, self._update_node_pool),
            ("POST", pool + r":setAutoscaling", self._set_autoscaling), ("POST", pool + r":setSize", self._set_size),
            ("GET", location + r"/operations/(?P<op>[^/]+)", self._gke_operation),
            ("GET", location + r"/serverConfig", self._server_config),
            ("GET", location + r"/operations", self._list_gke_operations),
        ]

    def _list_gke_operations(self, request, project, location):
        """container v1 ListOperationsResponse: every operation of the location, as GKE keeps them a while."""
        self._advance()
        found = [self._gke_op_json(project, location, op) for op in self._operations.values() if op.api == "container"]
        return {"operations": found} if found else {}

    def _server_config(self, request, project, location):
        """container v1 ServerConfig: the default and valid versions, and each release channel's."""
        every = sorted({v for versions in GKE_CHANNELS.values() for v in versions}, reverse=True)
        return {"defaultClusterVersion": GKE_CHANNELS["REGULAR"][0], "validMasterVersions": every,
                "validNodeVersions": every,
                "channels": [{"channel": channel, "defaultVersion": versions[0], "validVersions": versions}
                             for channel, versions in GKE_CHANNELS.items()]}

    def _gke_op(self, project: str, location: str, cluster: str, kind: str, target: str, on_done) -> dict:
        self._idle(cluster)
        return self._gke_op_json(project, location, self._start("container", kind, target, on_done, scope=cluster))

    def _idle(self, cluster: str) -> None:
        """GKE runs one operation per cluster at a time and refuses others, worded after the operation running."""
        busy = [o for o in self._operations.values() if o.api == "container" and o.scope == cluster and not o.done]
        if busy:
            raise precondition(gke_busy(busy[0].kind, busy[0].name, cluster))

    @staticmethod
    def _gke_op_json(project: str, location: str, operation: Operation) -> dict:
        answer = {"name": operation.name, "zone": location, "location": location, "operationType": operation.kind,
                  "status": operation.phase(), "targetLink": operation.target,
                  "startTime": _timestamp(operation.started),
                  "selfLink": f"{GKE}/projects/{project}/locations/{location}/operations/{operation.name}"}
        if operation.done:
            answer["endTime"] = _timestamp(operation.started + operation.seconds)
            if operation.error:  # container v1 Operation: `error` (google.rpc.Status), `statusMessage` deprecated
                answer["error"] = {"code": operation.error.code, "message": operation.error.message}
                answer["statusMessage"] = operation.error.message
        return answer

    def _gke_operation(self, request, project, location, op):
        return self._gke_op_json(project, location, self._operation("container", op))

    def _create_cluster(self, request, project, location):
        cluster = dict((request.body or {}).get("cluster") or {})
        name = cluster.get("name", "")
        if not _GKE_NAME.fullmatch(name):
            raise invalid(f"Invalid cluster name '{name}': 1-40 lowercase letters, digits or hyphens, starting with a "
                          "letter and not ending with a hyphen.")
        if name in self._store["cluster"]:
            raise ApiError(409, "ALREADY_EXISTS",
                           f"Already exists: projects/{project}/locations/{location}/clusters/{name}.", "alreadyExists")
        network = self._network_of(cluster.get("network") or "default", "cluster.network")
        self._check_cluster(project, cluster)
        pools = cluster.pop("nodePools", None) or []
        if pools and cluster.get("initialNodeCount"):
            raise invalid("Cluster.initial_node_count and Cluster.node_pools cannot both be set.")
        if not pools and not int(cluster.get("initialNodeCount", 0)):
            raise invalid("Cluster.initial_node_count must be greater than zero, or node pools must be given.")
        if not pools:
            pools = [{"name": "default-pool", "initialNodeCount": cluster.pop("initialNodeCount"),
                      "config": cluster.get("nodeConfig", {})}]
        link = f"{GKE}/projects/{project}/locations/{location}/clusters/{name}"
        for pool in pools:
            self._check_pool(pool, location, cluster)
            pool.setdefault("locations", _default_zones(location, cluster))
        version = _gke_version(cluster.get("initialClusterVersion"),
                               (cluster.get("releaseChannel") or {}).get("channel"))
        dns = cluster.setdefault("controlPlaneEndpointsConfig", {}).setdefault("dnsEndpointConfig", {})
        dns["endpoint"] = f"gke-{self._random.getrandbits(64):016x}.{location}.gke.goog"
        cluster.update(network=network, location=location, status="PROVISIONING", selfLink=link,
                       createTime=_timestamp(), currentMasterVersion=version, currentNodeVersion=version,
                       endpoint="34.118.0.2")
        cluster.setdefault("networkConfig", {})["network"] = f"projects/{project}/global/networks/{network}"
        self._store["cluster"][name] = cluster
        for pool in pools:
            self._store["node_pool"][pool["name"]] = dict(pool, status="PROVISIONING", version=version, cluster=name,
                                                          selfLink=f"{link}/nodePools/{pool['name']}")

        def finish():
            cluster["status"] = "RUNNING"
            for pool in pools:
                self._store["node_pool"].get(pool["name"], {})["status"] = "RUNNING"
        return self._gke_op(project, location, name, "CREATE_CLUSTER", link, finish)

    @staticmethod
    def _check_cluster(project: str, cluster: dict) -> None:
        networking = cluster.get("networkConfig", {})
        if networking.get("enableMultiNetworking"):
            if networking.get("datapathProvider") not in _ADVANCED_DATAPATH:
                raise invalid("Multi-networking requires GKE Dataplane V2 (datapathProvider ADVANCED_DATAPATH).")
            if not cluster.get("ipAllocationPolicy", {}).get("useIpAliases"):
                raise invalid("Multi-networking requires a VPC-native cluster (ipAllocationPolicy.useIpAliases).")
        pool = cluster.get("workloadIdentityConfig", {}).get("workloadPool")
        if pool and pool != f"{project}.svc.id.goog":
            raise invalid(f"Workload Identity pool '{pool}' must be '{project}.svc.id.goog'.")

    def _check_pool(self, pool: dict, location: str, cluster: dict) -> None:
        name = pool.get("name", "")
        if not _GKE_NAME.fullmatch(name):
            raise invalid(f"Invalid node pool name '{name}'.")
        # NodePool.locations (container v1): zones of the cluster's region, a zonal cluster's being its zone's.
        region = _region_of(location)
        for zone in pool.get("locations", []):
            if not re.fullmatch(rf"{re.escape(region)}-[a-z]", zone):
                raise invalid(f"Node pool '{name}': location '{zone}' is not a zone of the cluster's "
                              f"region '{region}'.")
        config = pool.get("config", {})
        affinity = config.get("reservationAffinity", {})
        if affinity.get("consumeReservationType") in _SPECIFIC_RESERVATION:
            if config.get("spot"):
                raise invalid("Spot VMs cannot consume a specific reservation.")
            if (affinity.get("key") != "compute.googleapis.com/reservation-name"
                    or len(affinity.get("values") or []) != 1):
                # ReservationAffinity.key (container.v1 discovery): "To target a SPECIFIC_RESERVATION by name,
                # specify "compute.googleapis.com/reservation-name" as the key and ... the name ... as its value."
                raise invalid(f"Invalid reservationAffinity: a SPECIFIC_RESERVATION is named by the key "
                              f"'compute.googleapis.com/reservation-name' and one value, not "
                              f"{affinity.get('key')!r} = {affinity.get('values')}.")
        _check_autoscaling(pool.get("autoscaling", {}))
        self._check_placement(pool, location, cluster)
        extras = pool.get("networkConfig", {}).get("additionalNodeNetworkConfigs", [])
        if extras and not cluster.get("networkConfig", {}).get("enableMultiNetworking"):
            raise invalid("Additional node networks need multi-networking enabled on the cluster.")
        for extra in extras:
            network = self._network_of(extra.get("network"), "additionalNodeNetworkConfigs.network")
            subnet = self._store["subnetwork"].get(_last(extra.get("subnetwork")))
            if subnet is None or not subnet["network"].endswith(f"/networks/{network}"):
                raise invalid(f"Subnetwork '{extra.get('subnetwork')}' does not exist in network '{network}'.")
            # A network profile is zonal (networkProfiles are `ZONE-vpc-roce`, GKE's A3 Ultra/A4 RDMA guides):
            # its NICs exist only on nodes in that zone.
            profile = _last(self._store["network"][network].get("networkProfile"))
            zone = profile.rsplit("-vpc-", 1)[0] if profile else None
            if zone and set(pool.get("locations") or [location]) != {zone}:
                raise invalid(f"Node pool '{name}' attaches network '{network}' (network profile {profile}): its "
                              f"nodes must all be in {zone}, not {pool.get('locations') or [location]}.")

    def _check_placement(self, pool: dict, location: str, cluster: dict) -> None:
        """A node pool's placementPolicy, as GKE takes it."""
        name, placement = pool.get("name", ""), pool.get("placementPolicy") or {}
        machine = pool.get("config", {}).get("machineType", "")
        if machine.startswith("a4x-") and not placement:
            # "When creating multiple instances for machine series that support partitioning, such as A4X Max and
            # A4X, you must apply a compact placement policy or a workload policy"
            # (docs.cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy).
            raise invalid(f"Node pool '{name}': {machine} nodes need a placement policy (placementPolicy: a workload "
                          "policy, or compact placement).")
        if not placement:
            return
        if placement.get("type") in ("COMPACT", 1):
            zones = pool.get("locations") or _default_zones(location, cluster)
            if len(zones) != 1:
                # GKE's compact placement is within one zone (cloud.google.com/kubernetes-engine/docs/how-to/
                # compact-placement); Cluster Toolkit's gke-node-pool refuses COMPACT on more than one zone, and on a
                # blue-green upgrade or queued provisioning (its preconditions).
                raise invalid(f"Node pool '{name}': compact placement is only available for node pools in a single "
                              f"zone, not {zones}.")
            if (pool.get("upgradeSettings") or {}).get("strategy") in ("BLUE_GREEN", 2):
                raise invalid(f"Node pool '{name}': compact placement is not supported with blue-green upgrades.")
            if (pool.get("queuedProvisioning") or {}).get("enabled"):
                raise invalid(f"Node pool '{name}': placementPolicy COMPACT cannot go with queued provisioning.")
        policy_name = placement.get("policyName")
        if not policy_name:
            return
        # PlacementPolicy.policyName (container v1): "The resource policy must be in the same project and region as
        # the node pool. If not found, InvalidArgument error is returned."
        policy = self._store["resource_policy"].get(_last(policy_name))
        if policy is None or not policy.get("region", "").endswith(f"/regions/{_region_of(location)}"):
            raise invalid(f"Node pool '{name}': resource policy '{policy_name}' was not found in region "
                          f"{_region_of(location)}.")
        topology = (policy.get("workloadPolicy") or {}).get("acceleratorTopology")
        gpus = sum(int(a.get("acceleratorCount", 0)) for a in pool.get("config", {}).get("accelerators", []))
        if topology and gpus:
            # A 1x72 topology is one NVLink domain of 72 GPUs: "NODE_COUNT ... must be 18 nodes or less ... to obtain
            # the GPU topology of 1x72 in one subblock" (Cluster Toolkit's gke-a4x-max-bm README, GKE's steps).
            most = functools.reduce(lambda a, b: a * b, map(int, topology.split("x"))) // gpus
            scaling = pool.get("autoscaling") or {}
            wanted = max(int(pool.get("initialNodeCount", 0)),
                         int(scaling.get("maxNodeCount", 0)) if scaling.get("enabled") else 0)
            if wanted > most:
                raise invalid(f"Node pool '{name}': {wanted} nodes of {gpus} GPUs do not fit accelerator topology "
                              f"{topology} of resource policy '{_last(policy_name)}' ({most} nodes at most).")

    def _cluster(self, project: str, location: str, name: str) -> dict:
        found = self._store["cluster"].get(name)
        if found is None:
            raise ApiError(404, "NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{name}.",
                           "notFound")
        return found

    def _get_cluster(self, request, project, location, cluster):
        pools = [_without_cluster(p) for p in self._store["node_pool"].values() if p.get("cluster") == cluster]
        return dict(self._cluster(project, location, cluster), nodePools=pools)

    def _list_clusters(self, request, project, location):
        """container v1 ListClustersResponse: `clusters` (each with its `nodePools`, as a get gives it) and
        `missingZones`, the zones that did not answer (none here: the fake's zones always answer)."""
        names = [name for name, found in self._store["cluster"].items() if found.get("location", location) == location]
        if self.unanswered_zones:  # a zone that did not answer in time: its clusters are missing from the list
            missing = self.unanswered_zones.pop(0)
            return {"clusters": [], "missingZones": [missing]}
        return {"clusters": [self._get_cluster(request, project, location, name) for name in names]}

    def _update_cluster(self, request, project, location, cluster):
        found = self._cluster(project, location, cluster)
        update = (request.body or {}).get("update") or {}
        desired = [key for key in update if key.startswith("desired")]
        if len(desired) != 1:
            raise invalid(f"Exactly one update can be applied to a cluster with each request, got {len(desired)}: "
                          f"{desired}.")
        key = desired[0]
        if key == "desiredMasterVersion":
            change = {"currentMasterVersion": _gke_version(update[key],
                                                           (found.get("releaseChannel") or {}).get("channel"))}
        else:  # desiredAddonsConfig -> addonsConfig, ...
            change = {key[len("desired")].lower() + key[len("desired") + 1:]: update[key]}
        return self._gke_op(project, location, cluster, "UPDATE_CLUSTER", found.get("selfLink", cluster),
                            lambda: _merge(found, change))

    def _delete_cluster(self, request, project, location, cluster):
        found = self._cluster(project, location, cluster)

        def finish():
            self._store["cluster"].pop(cluster, None)
            for name in [n for n, p in self._store["node_pool"].items() if p.get("cluster") == cluster]:
                del self._store["node_pool"][name]
        answer = self._gke_op(project, location, cluster, "DELETE_CLUSTER", found.get("selfLink", cluster), finish)
        found["status"] = "STOPPING"
        return answer

    def _create_node_pool(self, request, project, location, cluster):
        found = self._cluster(project, location, cluster)
        self._idle(cluster)
        if found.get("status", "RUNNING") != "RUNNING":
            raise precondition(f"Cluster {cluster} is {found['status']}: node pools can be added when it is RUNNING.")
        pool = dict((request.body or {}).get("nodePool") or {})
        self._check_pool(pool, location, found)
        pool.setdefault("locations", _default_zones(location, found))
        name = pool["name"]
        if name in self._store["node_pool"]:
            raise ApiError(409, "ALREADY_EXISTS", f"Already exists: {found.get('selfLink', cluster)}/nodePools/{name}.",
                           "alreadyExists")
        stored = dict(pool, status="PROVISIONING", version=found.get("currentNodeVersion", ""), cluster=cluster,
                      selfLink=f"{GKE}/projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}")
        self._store["node_pool"][name] = stored
        return self._gke_op(project, location, cluster, "CREATE_NODE_POOL", stored["selfLink"],
                            lambda: stored.update(status="RUNNING"))

    def _pool(self, project: str, location: str, cluster: str, name: str) -> dict:
        pool = self._store["node_pool"].get(name)
        if pool is None or pool.get("cluster") != cluster:
            raise ApiError(404, "NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{cluster}/"
                           f"nodePools/{name}.", "notFound")
        return pool

    def _get_node_pool(self, request, project, location, cluster, pool):
        return _without_cluster(self._pool(project, location, cluster, pool))

    def _delete_node_pool(self, request, project, location, cluster, pool):
        found = self._pool(project, location, cluster, pool)
        answer = self._gke_op(project, location, cluster, "DELETE_NODE_POOL", found.get("selfLink", pool),
                              lambda: self._store["node_pool"].pop(pool, None))
        found["status"] = "STOPPING"
        return answer

    def _update_node_pool(self, request, project, location, cluster, pool):
        """container v1 nodePools.update, of which the fake models `locations`: GKE adds and removes nodes to match
        (node counts are per zone), checked as at creation; and `gcfsConfig`, image streaming (NodeConfig's)."""
        found = self._pool(project, location, cluster, pool)
        body = request.body or {}
        others = sorted(set(body) - {"name", "locations", "gcfsConfig"})
        if others:
            raise ApiError(501, "UNIMPLEMENTED", f"The fake's nodePools.update models only locations and gcfsConfig, "
                           f"not {others}.", "notImplemented")
        zones = body.get("locations") or found.get("locations", [])
        self._check_pool(dict(found, locations=zones), location, self._cluster(project, location, cluster))

        def finish():
            found.update(locations=zones)
            if "gcfsConfig" in body:
                found.setdefault("config", {})["gcfsConfig"] = body["gcfsConfig"]
        return self._gke_op(project, location, cluster, "UPDATE_CLUSTER", found.get("selfLink", pool), finish)

    def _set_autoscaling(self, request, project, location, cluster, pool):
        found = self._pool(project, location, cluster, pool)
        scaling = (request.body or {}).get("autoscaling") or {}
        _check_autoscaling(scaling)
        return self._gke_op(project, location, cluster, "UPDATE_CLUSTER", found.get("selfLink", pool),
                            lambda: found.update(autoscaling=scaling))

    def _set_size(self, request, project, location, cluster, pool):
        found = self._pool(project, location, cluster, pool)
        count = int((request.body or {}).get("nodeCount", 0))  # proto3 leaves a 0 out
        return self._gke_op(project, location, cluster, "SET_NODE_POOL_SIZE", found.get("selfLink", pool),
                            lambda: found.update(nodeCount=count))

    # -- Managed Lustre -------------------------------------------------------------------------
    def _lustre_routes(self) -> list:
        location = r"/lustre/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
        instance = location + r"/instances/(?P<name>[^/]+)"
        return [
            ("POST", location + r"/instances", self._create_instance),
            ("GET", location + r"/instances", self._list_instances),
            ("GET", instance, self._get_instance), ("PATCH", instance, self._update_instance),
            ("DELETE", instance, self._delete_instance),
            ("POST", location + r"/instances/(?P<name>[^/:]+):exportData", self._export_data),
            ("POST", location + r"/instances/(?P<name>[^/:]+):importData", self._import_data),
            ("GET", location + r"/operations/(?P<op>[^/]+)", self._lustre_operation),
            ("GET", r"/lustre/v1/projects/(?P<project>[^/]+)/locations", self._lustre_locations),
        ]

    def _lustre_locations(self, request, project):
        """google.cloud.location ListLocationsResponse: the zones the fake offers Managed Lustre in, one page."""
        return {"locations": [{"name": f"projects/{project}/locations/{zone}", "locationId": zone,
                               "displayName": zone} for zone in sorted(self.lustre_zones)]}

    def _lustre_op(self, project: str, location: str, verb: str, target: str, on_done) -> dict:
        return self._lustre_op_json(self._lustre_start(project, location, verb, target, on_done))

    def _lustre_start(self, project: str, location: str, verb: str, target: str, on_done) -> Operation:
        name = f"projects/{project}/locations/{location}/operations/operation-{int(time.time() * 1000)}-" \
               f"{next(self._ids)}"
        return self._start("lustre", verb, target, on_done, name=name)

    def _lustre_op_json(self, operation: Operation) -> dict:
        transfer = self._transfers.get(operation.name)
        if transfer:
            return self._lro_json(operation, self._transfer_metadata(operation, transfer))
        metadata = {"@type": "type.googleapis.com/google.cloud.lustre.v1.OperationMetadata",
                    "createTime": _timestamp(operation.started), "target": operation.target, "verb": operation.kind,
                    "apiVersion": "v1"}
        if operation.done:
            metadata["endTime"] = _timestamp(operation.started + operation.seconds)
        return self._lro_json(operation, metadata)

    def _lustre_operation(self, request, project, location, op):
        name = f"projects/{project}/locations/{location}/operations/{op}"
        return self._lustre_op_json(self._operation("lustre", name))

    def _instance(self, project: str, location: str, name: str) -> dict:
        found = self._store["lustre_instance"].get(name)
        if found is None:
            raise not_found(f"projects/{project}/locations/{location}/instances/{name}")
        return found

    def _create_instance(self, request, project, location):
        if location not in self.lustre_zones:
            raise invalid(f"Location {location} is not supported for Managed Lustre instances.")
        instance_id, body = request.query.get("instanceId", ""), dict(request.body or {})
        if not _RFC1035.fullmatch(instance_id):
            raise invalid(f"instance_id '{instance_id}' must be 1-63 lowercase letters, digits or hyphens, starting "
                          "with a letter.")
        path = f"projects/{project}/locations/{location}/instances/{instance_id}"
        if instance_id in self._store["lustre_instance"]:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{path}' already exists", "alreadyExists")
        throughput = int(body.get("perUnitStorageThroughput", 0))
        dynamic = (body.get("dynamicTierOptions") or {}).get("mode") in ("DEFAULT_CACHE", 2)
        if throughput not in _LUSTRE_TIERS or (throughput == 0) != dynamic:
            raise invalid(f"per_unit_storage_throughput {throughput} is not one of 125, 250, 500, 1000, or 0 (unset) "
                          "with dynamic_tier_options.mode DEFAULT_CACHE.")
        _check_capacity(int(body.get("capacityGib", 0)), throughput)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,7}", body.get("filesystem", "")):
            raise invalid(f"filesystem '{body.get('filesystem', '')}' must be 1-8 letters or digits, starting with a "
                          "letter.")
        if not re.fullmatch(r"projects/[^/]+/global/networks/[^/]+", body.get("network", "")):
            raise invalid(f"network '{body.get('network', '')}' must be projects/PROJECT/global/networks/NAME.")
        network = self._network_of(body["network"], "instance.network")
        connection = self._store["connection"].get(network)
        if connection is None:
            raise precondition(f"Network {network} has no private services access connection: create one with "
                               "servicenetworking first.")
        stored = dict(body, name=path, state="CREATING", createTime=_timestamp(), updateTime=_timestamp(),
                      uid=f"{self._random.getrandbits(128):032x}")
        self._store["lustre_instance"][instance_id] = stored
        ip = self._lustre_ip(connection)

        def finish():
            stored.update(state="ACTIVE", mountPoint=f"{ip}@tcp:/{body['filesystem']}")
            return _typed(stored)
        return self._lustre_op(project, location, "create", path, finish)

    def _lustre_ip(self, connection: dict) -> str:
        """An address inside the peering's first allocated range, as the service producer would take."""
        allocated = self._store["address"].get(connection["reservedPeeringRanges"][0], {})
        network = ipaddress.ip_network(_range_of(allocated) or "10.0.0.0/24", strict=False)
        return str(network[next(self._lustre_hosts)])  # a replaced instance gets a new address

    def _list_instances(self, request, project, location):
        """lustre v1 ListInstancesResponse, in pages: `instances`, `nextPageToken` while more follow, `unreachable`.
        The page size is the request's `pageSize`, else LUSTRE_PAGE_SIZE (small, so that clients meet paging)."""
        mine = sorted((found for found in self._store["lustre_instance"].values()
                       if found["name"].startswith(f"projects/{project}/locations/{location}/")),
                      key=lambda i: i["name"])
        size = int(request.query.get("pageSize") or LUSTRE_PAGE_SIZE)
        start = int(request.query.get("pageToken") or 0)
        answer = {"instances": mine[start:start + size]}
        if start + size < len(mine):
            answer["nextPageToken"] = str(start + size)
        return answer

    def _get_instance(self, request, project, location, name):
        return self._instance(project, location, name)

    def _update_instance(self, request, project, location, name):
        found, body = self._instance(project, location, name), request.body or {}
        mask = {_snake(path.strip()) for path in request.query.get("updateMask", "").split(",") if path.strip()}
        if not mask:
            raise invalid("update_mask is required.")
        if "per_unit_storage_throughput" in mask:
            raise invalid("per_unit_storage_throughput cannot be changed: it is immutable.")
        if mask - {"capacity_gib", "description", "labels"}:
            raise invalid(f"update_mask {sorted(mask)}: only capacity_gib, description and labels can be updated.")
        if found.get("state") != "ACTIVE":
            raise precondition(f"Instance {name} is {found.get('state')}: it can be updated when it is ACTIVE.")
        change = {_camel(path): body[_camel(path)] for path in mask if _camel(path) in body}
        if "capacity_gib" in mask:
            capacity, current = int(body.get("capacityGib", 0)), int(found.get("capacityGib", 0))
            if capacity < current:
                raise invalid(f"capacity_gib can only grow: {current} -> {capacity}.")
            _check_capacity(capacity, int(found.get("perUnitStorageThroughput", 0)), current)
            change["capacityGib"] = str(capacity)
        found["state"] = "UPDATING"

        def finish():
            found.update(change, state="ACTIVE", updateTime=_timestamp())
            return _typed(found)
        return self._lustre_op(project, location, "update", found["name"] if "name" in found else name, finish)

    def _delete_instance(self, request, project, location, name):
        found = self._instance(project, location, name)
        found["state"] = "DELETING"

        def finish():
            self._store["lustre_instance"].pop(name, None)
            # Its data goes with it: "if an instance is deleted, that data is not recoverable"
            # (docs.cloud.google.com/managed-lustre/docs/back-up-instance-data).
            if self._files_root is not None:
                shutil.rmtree(self._files_root / name, ignore_errors=True)
        return self._lustre_op(project, location, "delete", found.get("name", name), finish)

    # -- Managed Lustre: exportData and importData -------------------------------------------------
    # Sources: the request and metadata messages' field docs in google-cloud-lustre
    # (google/cloud/lustre_v1/types/transfer.py), the REST reference
    # (docs.cloud.google.com/managed-lustre/docs/reference/rest/v1/projects.locations.instances/exportData,
    # .../importData) and "Transfer data to or from Cloud Storage"
    # (docs.cloud.google.com/managed-lustre/docs/transfer-data, read 2026-12).
    #
    # What the request itself carries is checked when it arrives (400, 404, 409, as the front end answers); what
    # only the data reveals (a bucket that does not exist, a Lustre directory that does not) fails the operation:
    # the transfer's workers, acting as the Managed Lustre service agent on the bucket and the file system, are
    # the ones that meet it, not the control plane (an assumption: the docs do not say which).
    def _export_data(self, request, project, location, name):
        return self._transfer(request, project, location, name, "EXPORT")

    def _import_data(self, request, project, location, name):
        return self._transfer(request, project, location, name, "IMPORT")

    def _transfer(self, request, project: str, location: str, name: str, kind: str) -> dict:
        found, body = self._instance(project, location, name), request.body or {}
        request_id = body.get("requestId", "")
        if request_id:
            try:  # requestId: "Optional. UUID to identify requests."
                uuid.UUID(request_id)
            except ValueError:
                raise invalid(f"request_id '{request_id}' must be a UUID.") from None
            earlier = self._transfer_requests.get((name, request_id))
            if earlier:  # the same request again (a client's retry): its operation, not a second transfer
                return self._lustre_op_json(self._operations[earlier])
        account = body.get("serviceAccount", "")
        if account and not re.fullmatch(r"(projects/[^/]+/serviceAccounts/)?[^/]+", account):
            # serviceAccount: EMAIL_ADDRESS_OR_UNIQUE_ID, projects/PROJECT_ID/serviceAccounts/..., projects/-/...
            raise invalid(f"service_account '{account}' must be an email or unique ID, or "
                          "projects/{PROJECT_ID}/serviceAccounts/{EMAIL_ADDRESS_OR_UNIQUE_ID}.")
        lustre_path = (body.get("lustrePath") or {}).get("path") or "/"  # LustrePath.path: "Default is /."
        if not lustre_path.startswith("/"):  # LustrePath.path: "Must start with /."
            raise invalid(f"lustre_path.path '{lustre_path}' must start with '/'.")
        if {".", ".."} & set(lustre_path.split("/")):  # assumed: a path names a directory, not a way around one
            raise invalid(f"lustre_path.path '{lustre_path}' must not contain '.' or '..' segments.")
        uri = (body.get("gcsPath") or {}).get("uri", "")
        bucket, prefix = _gcs_path(uri)
        if found.get("state") != "ACTIVE":
            # Assumed, as for updates: a transfer needs a file system that is there (not CREATING, UPDATING or
            # DELETING); the docs do not list the states a transfer may start in.
            raise precondition(f"Instance {name} is {found.get('state')}: data can be transferred when it is ACTIVE.")
        for running, transfer in self._transfers.items():
            if transfer.instance == name and not self._operations[running].done:
                # transfer-data, "Limitations": "Only one transfer operation per instance can be active at a time",
                # a second one fails with "ABORTED: unable to queue the operation".
                raise ApiError(409, "ABORTED", "unable to queue the operation", "aborted")
        client = self._storage_client()
        root = self.lustre_files(name)
        plan = _plan_export if kind == "EXPORT" else _plan_import
        transfer = Transfer(kind, name, lustre_path, uri, [], dict.fromkeys(_COUNTERS, 0))
        lacking = self._lustre_agent_lacks(project, bucket, kind)
        if lacking:
            transfer.failure = (7, lacking)
        else:
            plan(transfer, client, root, bucket, prefix)
        if self._failing_transfers:
            transfer.fail_after = self._failing_transfers.pop(0)

        def finish():
            transfer.ended = time.time()
            if transfer.failure:
                raise OperationFailed(*transfer.failure)
            failed = transfer.counters["objectsFailedCount"]
            if failed:  # assumed: the operation's error is that of the most frequent error summary
                code = max(transfer.errors, key=lambda c: transfer.errors[c][0])
                raise OperationFailed(code, f"{failed} of {transfer.counters['foundObjectsCount']} objects failed "
                                            "to transfer: see the operation metadata's errorSummaries.")
            return {"@type": f"type.googleapis.com/google.cloud.lustre.v1.{kind.title()}DataResponse"}
        verb = "exportData" if kind == "EXPORT" else "importData"  # assumed: the RPC's name
        operation = self._lustre_start(project, location, verb, found["name"], finish)
        operation.busy = lambda: not transfer.finished
        self._transfers[operation.name] = transfer
        if request_id:
            self._transfer_requests[(name, request_id)] = operation.name
        worker = threading.Thread(target=self._copy, args=(transfer, operation, bucket), daemon=True,
                                  name=f"fake-gcp-{verb}")
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()
        return self._lustre_op_json(operation)

    def lustre_agent(self, project: str) -> str:
        """Managed Lustre's service agent, which reads and writes Cloud Storage in a transfer."""
        return f"serviceAccount:service-{self._project_number(project)}@gcp-sa-lustre.iam.gserviceaccount.com"

    def _lustre_agent_lacks(self, project: str, bucket: str, kind: str) -> str | None:
        """The transfer is made as Managed Lustre's service agent, which needs the bucket's objects
        (cloud.google.com/managed-lustre/docs/transfer-data: roles/storage.objectUser on the bucket, "Grant
        permissions to the service agent"); what it lacks, as the operation's error says it."""
        if self.iam is None:
            return None
        needed = ("storage.objects.create", "storage.objects.delete") if kind == "EXPORT" else \
            ("storage.objects.get", "storage.objects.list")
        agent = self.lustre_agent(project)
        for permission in needed:
            if not self.iam.holds(agent, permission, f"projects/_/buckets/{bucket}"):
                return (f"Permission '{permission}' denied on resource 'projects/_/buckets/{bucket}' for "
                        f"{agent.split(':', 1)[1]}, Managed Lustre's service agent.")
        return None

    def _storage_client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        url = self.storage_endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        if not url:
            raise ApiError(500, "INTERNAL", "The fake has no Cloud Storage to transfer with: give "
                           "FakeGcp(storage_endpoint=...) a fake-gcs-server's URL (or set STORAGE_EMULATOR_HOST).",
                           "backendError")
        return storage.Client(project="fake-gcp-lustre", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": url})

    def _copy(self, transfer: Transfer, operation: Operation, bucket_name: str) -> None:
        """The transfer's worker: copies what `plan` scheduled, one object after another, spread over the
        operation's duration so that the counters grow while it runs; its operation is done when this is."""
        try:
            if transfer.failure or not transfer.items:
                return
            bucket = self._storage_client().bucket(bucket_name)
            count = len(transfer.items)
            for index, (source, destination, size) in enumerate(transfer.items):
                due = operation.started + operation.seconds * (index + 1) / (count + 1)
                if self._stopping.wait(max(0.0, due - time.time())):
                    return
                uri = f"gs://{bucket_name}/{source if transfer.kind == 'IMPORT' else destination}"
                error = None
                if transfer.fail_after and index >= transfer.fail_after[0]:
                    error = transfer.fail_after[1:]
                elif destination is None:
                    error = (3, f"Object name '{source}' makes no path under {transfer.lustre_path} (it has an empty, "
                                "'.' or '..' segment).")
                else:
                    try:
                        if transfer.kind == "EXPORT":
                            bucket.blob(destination).upload_from_filename(str(source))
                        else:
                            destination.parent.mkdir(parents=True, exist_ok=True)
                            partial = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.partial")
                            try:
                                bucket.blob(source).download_to_filename(str(partial))
                                os.replace(partial, destination)
                            finally:
                                partial.unlink(missing_ok=True)
                    except Exception as failed:  # an object that failed, as the real transfer counts it
                        error = (_rpc_code(failed), str(failed))
                with self._lock:
                    if error:
                        transfer.fail(error[0], uri, error[1], size)
                    else:
                        transfer.counters["objectsCopiedCount"] += 1
                        transfer.counters["bytesCopiedCount"] += size
        except Exception as broken:  # the fake's own bug: the transfer fails rather than hangs
            traceback.print_exc(file=sys.stderr)
            with self._lock:
                transfer.failure = (13, f"Internal error in the fake's transfer: {broken}")
        finally:
            with self._lock:
                transfer.finished = True

    def _transfer_metadata(self, operation: Operation, transfer: Transfer) -> dict:
        """ExportDataMetadata or ImportDataMetadata (types/transfer.py): TransferOperationMetadata's paths, counters
        (int64 as strings, zeros left out as in any proto3 JSON), type and error summaries, and the common fields;
        ImportDataMetadata has no `verb`."""
        lustre, gcs = {"path": transfer.lustre_path}, {"uri": transfer.gcs_uri}
        paths = {"sourceLustrePath": lustre, "destinationGcsPath": gcs} if transfer.kind == "EXPORT" else \
            {"sourceGcsPath": gcs, "destinationLustrePath": lustre}
        details = {**paths, "counters": {key: str(value) for key, value in transfer.counters.items() if value},
                   "transferType": transfer.kind}
        if transfer.errors:
            details["errorSummaries"] = [{"errorCode": code_pb2.Code.Name(code), "errorCount": str(count),
                                          "errorLogEntries": entries}
                                         for code, (count, entries) in sorted(transfer.errors.items())]
        metadata = {"@type": f"type.googleapis.com/google.cloud.lustre.v1.{transfer.kind.title()}DataMetadata",
                    "operationMetadata": details, "createTime": _timestamp(operation.started),
                    "target": operation.target, "apiVersion": "v1"}
        if transfer.kind == "EXPORT":
            metadata["verb"] = operation.kind
        if operation.done:
            metadata["endTime"] = _timestamp(transfer.ended or operation.started + operation.seconds)
        return metadata

    # -- Secret Manager -------------------------------------------------------------------------
    def _secret_routes(self) -> list:
        version = r"/sm/v1/(?P<version>projects/[^/]+/secrets/[^/]+/versions/[^/:]+)"
        return [("GET", version + r":access", self._access_secret), ("GET", version, self._get_secret_version),
                ("POST", r"/sm/v1/projects/(?P<project>[^/]+)/secrets/(?P<secret>[^/:]+):testIamPermissions",
                 self._test_secret_permissions)]

    def _test_secret_permissions(self, request, project, secret):
        """secretmanager v1 TestIamPermissionsResponse for a secret: the asked permissions the caller holds on
        it, granted on the secret or inherited from the project (`denied_permissions` on either)."""
        asked = (request.body or {}).get("permissions", [])
        resource = f"projects/{project}/secrets/{secret}"
        held = [p for p in asked if (resource, p) not in self.denied_permissions and (project, p) not in
                self.denied_permissions and (self.iam is None or self.iam.holds(request.caller, p, resource))]
        return {"permissions": held} if held else {}

    def _get_secret_version(self, request, version):
        """secretmanager v1 SecretVersion, its metadata: the value only ever through :access."""
        found = self._store["secret_version"].get(version)
        if found is None:
            raise ApiError(404, "NOT_FOUND", f"Secret Version [{version}] not found.", "notFound")
        return {"name": version, "createTime": _timestamp(), "state": found.get("state", "ENABLED")}

    # -- what `rlops doctor` reads: Service Usage, reservations, network profiles ------------------
    def node_pool_trouble(self, pool: str, code: str, message: str) -> None:
        """GKE's report of a node pool it cannot grow, as container v1 shows it on the NodePool: status
        RUNNING_WITH_ERROR, a statusMessage, and a StatusCondition whose `code` is one of its enum
        (GCE_STOCKOUT, GCE_QUOTA_EXCEEDED, ...) with the canonical google.rpc code beside it."""
        canonical = {"GCE_STOCKOUT": "RESOURCE_EXHAUSTED",
                     "GCE_QUOTA_EXCEEDED": "RESOURCE_EXHAUSTED"}.get(code, "UNKNOWN")
        with self._lock:
            self._store["node_pool"][pool].update(status="RUNNING_WITH_ERROR", statusMessage=message, conditions=[
                {"code": code, "message": message, "canonicalCode": canonical}])

    def deploy(self, project: str, location: str = "us-central1") -> None:
        """What cloudbuild/deploy.yaml leaves in a project: the four functions (2nd gen, ACTIVE) and the Cloud
        Scheduler job that publishes a tick every minute (ENABLED), as their APIs show them."""
        for target in ("train", "watch", "snapshot", "reap"):
            name = f"projects/{project}/locations/{location}/functions/rlops-{target}"
            self.functions[name] = {
                "name": name, "environment": "GEN_2", "state": "ACTIVE", "updateTime": _timestamp(),
                "buildConfig": {"runtime": "python311", "entryPoint": target},
                "serviceConfig": {"serviceAccountEmail": f"rlops-{target}@{project}.iam.gserviceaccount.com",
                                  "uri": f"https://rlops-{target}-{self._project_number(project)}.{location}.run.app",
                                  "environmentVariables": {"RLOPS_ENVIRONMENTS": "environments",
                                                           "RLOPS_PROJECT": project}}}
        job = f"projects/{project}/locations/{location}/jobs/rlops-tick"
        self.scheduler_jobs[job] = {"name": job, "schedule": "* * * * *", "timeZone": "Etc/UTC", "state": "ENABLED",
                                    "pubsubTarget": {"topicName": f"projects/{project}/topics/rlops-tick",
                                                     "data": base64.b64encode(b"{}").decode()}}

    def put_gpu_vm(self, project: str, zone: str, name: str, accelerator: str, count: int,
                   status: str = "RUNNING") -> None:
        """A VM with GPUs that is not a node of the cluster (someone's notebook, another team's job)."""
        self.vms.append(_instance(project, zone, name, accelerator, count, status, {}))

    def _instances(self, project: str) -> list[dict]:
        """compute v1 Instances: each GKE node of a GPU node pool (its VMs carry the node pool's GKE labels) and
        the VMs put beside them."""
        nodes = []
        for pool in self._store["node_pool"].values():
            accelerators = (pool.get("config") or {}).get("accelerators") or []
            for zone in pool.get("locations") or []:
                for index in range(int(pool.get("nodeCount", pool.get("initialNodeCount", 0)))):
                    for accelerator in accelerators:
                        nodes.append(_instance(project, zone, f"gke-{pool['cluster']}-{pool['name']}-{index}",
                                               accelerator["acceleratorType"], int(accelerator["acceleratorCount"]),
                                               "RUNNING", {"goog-k8s-cluster-name": pool["cluster"],
                                                           "goog-k8s-node-pool-name": pool["name"]}))
        return nodes + [vm for vm in self.vms if f"/projects/{project}/" in vm["zone"]]

    def _aggregated(self, request, project, collection):
        """compute v1 InstanceAggregatedList / ReservationAggregatedList: per zone scope."""
        if collection == "instances":
            found = self._instances(project)
        else:
            found = [r for (p, _, _), r in self.reservations.items() if p == project]
        items: dict[str, dict] = {}
        for item in found:
            items.setdefault(f"zones/{_last(item['zone'])}", {collection: []})[collection].append(item)
        return {"kind": f"compute#{collection[:-1]}AggregatedList", "id": f"projects/{project}/aggregated/{collection}",
                "items": items}

    def _quota_routes(self) -> list:
        return [("GET", r"/cq/v1/projects/(?P<project>[^/]+)/locations/global/services/compute\.googleapis\.com/"
                        r"quotaInfos/(?P<quota>[^/]+)", self._quota_info)]

    def _quota_info(self, request, project, quota):
        """cloudquotas v1 QuotaInfo of GPUS-PER-GPU-FAMILY-per-project-region: a limit per region and GPU family
        (`gpu_family_quota`, else DEFAULT_GPU_FAMILY_QUOTA), and 0 for any other combination, as a new project
        has. The fake knows only this quota."""
        if (project, "cloudquotas.googleapis.com") in self.disabled_services:
            raise ApiError(403, "PERMISSION_DENIED", f"Cloud Quotas API has not been used in project {project} before "
                           "or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
                           f"cloudquotas.googleapis.com/overview?project={project} then retry.", "SERVICE_DISABLED")
        if quota != GPU_FAMILY_QUOTA:
            raise not_found(f"projects/{project}/locations/global/services/compute.googleapis.com/quotaInfos/{quota}")
        limits = {(region, family): DEFAULT_GPU_FAMILY_QUOTA for region in ("us-central1", "us-east1", "us-east4")
                  for family in ("NVIDIA_H200", "NVIDIA_B200")}
        limits.update({(region, family): limit for (p, region, family), limit in self.gpu_family_quota.items()
                       if p == project})
        infos = [{"dimensions": {"region": region, "gpu_family": family}, "details": {"value": str(limit)},
                  "applicableLocations": [region]} for (region, family), limit in sorted(limits.items())]
        return {"name": f"projects/{self._project_number(project)}/locations/global/services/compute.googleapis.com/"
                        f"quotaInfos/{quota}", "quotaId": quota, "metric": "compute.googleapis.com/gpus_per_gpu_family",
                "service": "compute.googleapis.com", "isPrecise": True, "containerType": "PROJECT",
                "dimensions": ["region", "gpu_family"], "quotaDisplayName": "GPUs per GPU family",
                "metricUnit": "1", "dimensionsInfos": infos + [{"dimensions": {}, "details": {"value": "0"}}]}

    def _deployment_routes(self) -> list:
        return [("GET", r"/cf/v2/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/functions",
                 self._list_functions),
                ("GET", r"/cs/v1/(?P<name>projects/[^/]+/locations/[^/]+/jobs/[^/]+)", self._get_scheduler_job)]

    def _list_functions(self, request, project, location):
        """cloudfunctions v2 ListFunctionsResponse, in pages (`nextPageToken` while more follow) of the request's
        `pageSize`, else FUNCTIONS_PAGE_SIZE (small, so that a client that reads one page misses functions);
        location "-" lists every location (the method's doc)."""
        prefix = f"projects/{project}/locations/" + ("" if location == "-" else f"{location}/")
        found = [function for name, function in sorted(self.functions.items()) if name.startswith(prefix)]
        size = int(request.query.get("pageSize") or FUNCTIONS_PAGE_SIZE)
        start = int(request.query.get("pageToken") or 0)
        answer = {"functions": found[start:start + size]} if found[start:start + size] else {}
        if start + size < len(found):
            answer["nextPageToken"] = str(start + size)
        return answer

    def _get_scheduler_job(self, request, name):
        if name not in self.scheduler_jobs:
            raise not_found(name)
        return self.scheduler_jobs[name]

    def put_reservation(self, project: str, zone: str, name: str, machine_type: str, accelerator: str,
                        per_vm: int, count: int, in_use: int = 0, required: bool = True) -> None:
        """A specific reservation as compute v1 Reservation JSON (int64 counts as strings, as the API writes them)."""
        self.reservations[(project, zone, name)] = {
            "kind": "compute#reservation", "name": name, "status": "READY",
            "zone": f"{COMPUTE}/projects/{project}/zones/{zone}", "specificReservationRequired": required,
            "selfLink": f"{COMPUTE}/projects/{project}/zones/{zone}/reservations/{name}",
            "specificReservation": {"count": str(count), "inUseCount": str(in_use), "instanceProperties": {
                "machineType": machine_type,
                "guestAccelerators": [{"acceleratorType": accelerator, "acceleratorCount": per_vm}]}}}

    def _project_routes(self) -> list:
        compute = r"/compute/v1/projects/(?P<project>[^/]+)"
        return [("GET", r"/su/v1/projects/(?P<project>[^/]+)/services:batchGet", self._batch_get_services),
                ("POST", r"/crm/v1/projects/(?P<project>[^/]+):testIamPermissions", self._test_permissions),
                ("POST", r"/iam/v1/projects/(?P<project>[^/]+)/serviceAccounts/(?P<account>[^/:]+):testIamPermissions",
                 self._test_account_permissions),
                ("GET", compute + r"/zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/]+)", self._get_reservation),
                ("GET", compute + r"/global/networkProfiles/(?P<name>[^/]+)", self._get_network_profile),
                ("GET", compute + r"/zones/(?P<zone>[^/]+)/machineTypes/(?P<name>[^/]+)", self._get_machine_type),
                ("GET", compute, self._get_project), ("GET", compute + r"/regions/(?P<region>[^/]+)", self._get_region),
                ("GET", compute + r"/aggregated/(?P<collection>instances|reservations)", self._aggregated)]

    def _quotas(self, project: str, scope: str, usage: dict[str, float]) -> list[dict]:
        """compute v1 Quota entries: each metric's limit (DEFAULT_QUOTA_LIMITS, or what a test set) and its usage,
        counted from what the fake holds. Only metrics of the discovery document's Quota.metric enum exist."""
        enum = set(google_apis.document("compute.v1")["schemas"]["Quota"]["properties"]["metric"]["enum"])
        limits = {**DEFAULT_QUOTA_LIMITS[scope == "global"],
                  **{metric: limit for (p, where, metric), limit in self.quota_limits.items()
                     if p == project and where == scope}}
        assert set(limits) <= enum, set(limits) - enum
        return [{"metric": metric, "limit": float(limit), "usage": float(usage.get(metric, 0))}
                for metric, limit in sorted(limits.items())]

    def _get_project(self, request, project):
        """compute v1 Project, with its global quotas; usage is what the fake holds of each kind."""
        usage = {"NETWORKS": len(self._store["network"]), "SUBNETWORKS": len(self._store["subnetwork"]),
                 "FIREWALLS": len(self._store["firewall"]),
                 "GLOBAL_INTERNAL_ADDRESSES": sum(1 for a in self._store["address"].values() if "region" not in a)}
        return {"kind": "compute#project", "name": project, "id": self._project_number(project),
                "selfLink": f"{COMPUTE}/projects/{project}", "quotas": self._quotas(project, "global", usage)}

    def _get_region(self, request, project, region):
        """compute v1 Region with its regional quotas. CPU usage: each node pool's nodes times its machine's vCPUs
        (the number a predefined machine type's name ends with), counted against its family's metric (N2_CPUS
        for n2-..., CPUS for e2 and the families Compute has no metric of)."""
        enum = set(google_apis.document("compute.v1")["schemas"]["Quota"]["properties"]["metric"]["enum"])
        usage: dict[str, float] = {}
        for pool in self._store["node_pool"].values():
            machine = (pool.get("config") or {}).get("machineType", "e2-medium")
            family = f"{machine.split('-')[0].upper()}_CPUS"
            metric = family if family in enum else "CPUS"
            nodes = int(pool.get("nodeCount", pool.get("initialNodeCount", 0)))
            usage[metric] = usage.get(metric, 0) + nodes * self._machine(machine)["guestCpus"]
        return {"kind": "compute#region", "name": region, "status": "UP",
                "selfLink": f"{COMPUTE}/projects/{project}/regions/{region}",
                "quotas": self._quotas(project, region, usage)}

    def _get_machine_type(self, request, project, zone, name):
        """compute v1 MachineType; 404 for one not offered in the zone (`machine_types_missing`)."""
        if (zone, name) in self.machine_types_missing or (machine := self._machine(name)) is None:
            raise not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
        return dict(machine, zone=zone, selfLink=f"{COMPUTE}/projects/{project}/zones/{zone}/machineTypes/{name}")

    @staticmethod
    def _machine(name: str) -> dict | None:
        """The GPU machines rlops knows (vCPUs, memory and GPUs from the machine families page, as
        `rlops.spec.catalog` holds them) and the predefined general-purpose types, whose name ends with their
        vCPU count and whose kind sets the memory per vCPU (standard 4 GB, highmem 8 GB, highcpu 1 GB)."""
        from rlops.spec import catalog

        if (gpu := catalog.GPU_MACHINES.get(name)) is not None:
            return {"kind": "compute#machineType", "name": name, "guestCpus": gpu.vcpus,
                    "memoryMb": int(gpu.memory_gib * 1024), "isSharedCpu": False,
                    "accelerators": [{"guestAcceleratorType": gpu.accelerator,
                                      "guestAcceleratorCount": gpu.accelerators_per_node}]}
        predefined = re.fullmatch(r"(e2|n2|n2d|c2|c3|n4)-(standard|highmem|highcpu)-(\d+)", name)
        if predefined is None:
            return None
        vcpus = int(predefined[3])
        return {"kind": "compute#machineType", "name": name, "guestCpus": vcpus, "isSharedCpu": False,
                "memoryMb": vcpus * {"standard": 4, "highmem": 8, "highcpu": 1}[predefined[2]] * 1024}

    def _batch_get_services(self, request, project):
        """serviceusage v1 BatchGetServicesResponse; `names` repeats in the query (at most 30, the method's doc)."""
        names = parse_qs(request.raw_query).get("names", [])
        if len(names) > 30:
            raise invalid("names: at most 30 services can be requested at once.")
        answer = []
        for name in names:
            service = name.rsplit("/", 1)[-1]
            state = "DISABLED" if (project, service) in self.disabled_services else "ENABLED"
            answer.append({"name": f"projects/{self._project_number(project)}/services/{service}",
                           "parent": f"projects/{self._project_number(project)}", "state": state,
                           "config": {"name": service}})
        return {"services": answer}

    def _test_permissions(self, request, project):
        """cloudresourcemanager v1 TestIamPermissionsResponse: the subset of the asked permissions the caller holds;
        a wildcard is refused (TestIamPermissionsRequest.permissions: "Permissions with wildcards ... are not
        allowed")."""
        asked = (request.body or {}).get("permissions", [])
        if any("*" in permission for permission in asked):
            raise invalid("Permissions with wildcards (such as * or storage.*) are not allowed.")
        held = [permission for permission in asked if (project, permission) not in self.denied_permissions
                and (self.iam is None or self.iam.holds(request.caller, permission, f"projects/{project}"))]
        return {"permissions": held} if held else {}

    def _test_account_permissions(self, request, project, account):
        """iam v1 TestIamPermissionsResponse for a service account (`projects/-/...` names the account's own
        project): the asked permissions the caller holds on it, or on the project."""
        asked = (request.body or {}).get("permissions", [])
        resource = f"projects/{self.iam.project if self.iam and project == '-' else project}/serviceAccounts/{account}"
        held = [p for p in asked if self.iam is None or self.iam.holds(request.caller, p, resource)]
        return {"permissions": held} if held else {}

    def _project_number(self, project: str) -> str:
        return str(abs(hash(project)) % 10**12)

    def _get_reservation(self, request, project, zone, name):
        found = self.reservations.get((project, zone, name))
        if found is None:
            raise not_found(f"projects/{project}/zones/{zone}/reservations/{name}")
        return found

    def _get_network_profile(self, request, project, name):
        """Network profiles are Google's, one per zone and kind (`ZONE-vpc-roce`, GKE's A3 Ultra/A4 RDMA guides)."""
        match = re.fullmatch(r"(?P<zone>[a-z]+-[a-z]+\d+-[a-z])-vpc-(?P<kind>roce|falcon)", name)
        if match is None or name in self.missing_network_profiles:
            raise not_found(f"projects/{project}/global/networkProfiles/{name}")
        return {"kind": "compute#networkProfile", "name": name, "id": str(abs(hash(name)) % 10**15),
                "zone": f"{COMPUTE}/projects/{project}/zones/{match['zone']}",
                "location": {"name": match["zone"], "scope": "ZONE"},
                "selfLink": f"{COMPUTE}/projects/{project}/global/networkProfiles/{name}"}

    def _access_secret(self, request, version):
        found = self._store["secret_version"].get(version)
        if found is None:
            raise ApiError(404, "NOT_FOUND", f"Secret Version [{version}] not found or has no versions.", "notFound")
        data = found["value"].encode()
        return {"name": version, "payload": {"data": base64.b64encode(data).decode(),
                                             "dataCrc32c": str(google_crc32c.value(data))}}


# -- small helpers --------------------------------------------------------------------------------
GPU_FAMILY_QUOTA = "GPUS-PER-GPU-FAMILY-per-project-region"  # Cloud Quotas' quota id (dimensions region, gpu_family)
DEFAULT_GPU_FAMILY_QUOTA = 128  # the fake's default limit in its regions: the seeds' pools fit, grown too


def _instance(project: str, zone: str, name: str, accelerator: str, count: int, status: str, labels: dict) -> dict:
    return {"kind": "compute#instance", "name": name, "status": status, "labels": labels,
            "zone": f"{COMPUTE}/projects/{project}/zones/{zone}",
            "guestAccelerators": [{"acceleratorType": f"{COMPUTE}/projects/{project}/zones/{zone}/acceleratorTypes/"
                                                      f"{accelerator}", "acceleratorCount": count}]}


# The zones the fake offers Managed Lustre in: the seeds' (their tutorials put Lustre there) and a few more. Google's
# own list is longer and grows; a test removes a zone to plant its absence.
LUSTRE_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b", "us-east1-c", "us-east1-d",
                "us-east4-a", "europe-west4-b", "asia-southeast1-b")
# The fake's default quota limits, [regional, global]: generous, so that only a test's limit is short.
DEFAULT_QUOTA_LIMITS = ({"CPUS": 2400, "N2_CPUS": 2400, "IN_USE_ADDRESSES": 575, "PREEMPTIBLE_NVIDIA_H100_GPUS": 64},
                        {"NETWORKS": 15, "SUBNETWORKS": 175, "FIREWALLS": 200, "GLOBAL_INTERNAL_ADDRESSES": 5000})


def _region_of(location: str) -> str:
    """us-central1 of us-central1 and of us-central1-b."""
    return re.sub(r"-[a-z]$", "", location)


def _default_zones(location: str, cluster: dict) -> list[str]:
    """A node pool's zones when its create names none: the cluster's `locations`, else a zonal cluster's zone, else
    three zones of the region (GKE's default for a regional cluster; which three is GKE's choice)."""
    if cluster.get("locations"):
        return list(cluster["locations"])
    return [location] if _region_of(location) != location else [f"{location}-{zone}" for zone in "abc"]


def _timestamp(epoch: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if epoch is None else epoch, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _last(reference: str | None) -> str:
    return (reference or "").rstrip("/").rsplit("/", 1)[-1]


def _mtu(value) -> int:
    if not 1300 <= int(value) <= 8896:
        raise invalid(f"Invalid value for field 'resource.mtu': '{value}'. Must be between 1300 and 8896.")
    return int(value)


def _routing(config: dict) -> dict:
    if config.get("routingMode", "REGIONAL") not in ("REGIONAL", "GLOBAL"):
        raise invalid(f"Invalid value for field 'resource.routingConfig.routingMode': '{config.get('routingMode')}'.")
    return config


def _cidr(value: str | None, field: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value or "", strict=False)
    except ValueError:
        raise invalid(f"Invalid value for field '{field}': '{value}'. Invalid IPCidrRange.") from None


def _range_of(resource: dict) -> str | None:
    """A subnet's CIDR or an allocated range's address/prefix."""
    if resource.get("ipCidrRange"):
        return resource["ipCidrRange"]
    if resource.get("address") and resource.get("prefixLength"):
        return f"{resource['address']}/{resource['prefixLength']}"
    return None


def _overlaps(cidr: ipaddress.IPv4Network, other: str | None) -> bool:
    return bool(other) and cidr.overlaps(ipaddress.ip_network(other, strict=False))


def _check_rules(firewall: dict) -> None:
    if bool(firewall.get("allowed")) == bool(firewall.get("denied")):
        raise invalid("Invalid value for field 'resource': exactly one of allowed or denied must be given.")
    for rule in firewall.get("allowed") or firewall.get("denied"):
        if not rule.get("IPProtocol"):
            raise invalid("Invalid value for field 'resource.allowed[].IPProtocol': ''. A protocol is required.")
        if rule.get("ports") and str(rule["IPProtocol"]).lower() not in _PORTED:
            # Firewall.allowed[].ports: "only applicable for the UDP or TCP protocol" (compute.v1 discovery;
            # the firewall docs add SCTP).
            raise invalid(f"Invalid value for field 'resource.allowed[].ports': {rule['ports']}. Ports can only be "
                          f"given with {', '.join(sorted(_PORTED))}, not {rule['IPProtocol']}.")
        for port in rule.get("ports", []):
            if not re.fullmatch(r"\d{1,5}(-\d{1,5})?", str(port)):
                raise invalid(f"Invalid value for field 'resource.allowed[].ports[]': '{port}'.")
    for source in firewall.get("sourceRanges", []):
        try:  # IPv4 or IPv6 CIDRs (Firewall.sourceRanges: "Both IPv4 and IPv6 are supported")
            ipaddress.ip_network(source, strict=False)
        except ValueError:
            raise invalid(f"Invalid value for field 'resource.sourceRanges[]': '{source}'. Invalid IPCidrRange.") \
                from None


def _check_autoscaling(scaling: dict) -> None:
    if scaling.get("enabled") and int(scaling.get("minNodeCount", 0)) > int(scaling.get("maxNodeCount", 0)):
        raise invalid("Autoscaling minNodeCount must not be greater than maxNodeCount.")


def _raise(error: Exception):
    raise error


# The fake's GKE versions per release channel, newest first (illustrative numbers in GKE's own format; a real
# project's come from getServerConfig, which changes weekly). The first of each is the channel's default.
GKE_CHANNELS = {"RAPID": ["1.34.1-gke.1829001", "1.33.5-gke.1080000", "1.33.2-gke.1475000"],
                "REGULAR": ["1.33.2-gke.1475000", "1.32.9-gke.1108000", "1.31.13-gke.1023000"],
                "STABLE": ["1.32.9-gke.1108000", "1.31.13-gke.1023000"],
                "EXTENDED": ["1.31.13-gke.1023000", "1.30.14-gke.1015000"]}


def _gke_version(requested: str | None, channel: str | None) -> str:
    """GKE's answer to a requested version in a release channel (none named: REGULAR, GKE's default for a new
    cluster; UNSPECIFIED: no channel, every version): "" and "latest" -> the channel's default, a prefix (1.33,
    1.33.2) -> the newest version it offers with it; one it does not offer is refused."""
    offered = GKE_CHANNELS.get(channel or "REGULAR",
                               sorted({v for vs in GKE_CHANNELS.values() for v in vs}, reverse=True))
    if requested in (None, "", "latest", "-"):
        return offered[0]
    for version in offered:
        if version == requested or version.startswith(requested + ".") or version.startswith(requested + "-"):
            return version
    raise invalid(f"Master version \"{requested}\" is unsupported.")


def _merge(into: dict, change: dict) -> None:
    """An update's fields replace the stored ones, message by message (what is not sent is kept)."""
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _without_cluster(pool: dict) -> dict:
    return {key: value for key, value in pool.items() if key != "cluster"}


def _check_capacity(capacity: int, throughput: int, current: int | None = None) -> None:
    """The tier's minimum, maximum and step; an instance created at or below the step's threshold grows only up
    to it (managed-lustre/docs/increase-capacity, "Limitations on increasing capacity")."""
    minimum, threshold, big_step, maximum = _LUSTRE_TIERS[throughput]
    ceiling = threshold if current is not None and current <= threshold else maximum
    step = minimum if capacity <= threshold else big_step
    if capacity < minimum or capacity > ceiling or capacity % step:
        raise invalid(f"capacity_gib {capacity} is invalid at {throughput or 'the Dynamic tier'} MB/s/TiB: it must be "
                      f"between {minimum} and {ceiling}, a multiple of {minimum} up to {threshold} and of {big_step} "
                      "above.")


def _snake(path: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m[1].lower(), path)


def _camel(path: str) -> str:
    head, *rest = path.split("_")
    return head + "".join(part.title() for part in rest)


def _typed(instance: dict) -> dict:
    return dict(instance, **{"@type": "type.googleapis.com/google.cloud.lustre.v1.Instance"})


def _gcs_path(uri: str) -> tuple[str, str]:
    """GcsPath.uri -> (bucket, object name prefix, "" or ending with "/"). GcsPath.uri: "Required. The URI to a
    Cloud Storage bucket, or a path within a bucket, using the format gs://<bucket_name>/<optional_path_inside_bucket>/.
    If a path inside the bucket is specified, it must end with a forward slash (/)." (types/transfer.py)"""
    if not uri:
        raise invalid("gcs_path.uri is required.")
    match = re.fullmatch(r"gs://([^/]+)(?:/(.*))?", uri)
    if not match or not _BUCKET.fullmatch(match[1]):
        raise invalid(f"gcs_path.uri '{uri}' must be gs://<bucket_name>/<optional_path_inside_bucket>/.")
    prefix = match[2] or ""
    if prefix and not prefix.endswith("/"):
        raise invalid(f"gcs_path.uri '{uri}': a path inside the bucket must end with a forward slash (/).")
    return match[1], prefix


def _crc32c(data: bytes) -> str:
    """As Cloud Storage reports an object's crc32c: base64 of the big-endian checksum."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _same(path: Path, size: int, crc32c: str | None) -> bool:
    """Whether a file holds what an object of this size and crc32c holds."""
    return path.is_file() and path.stat().st_size == size and _crc32c(path.read_bytes()) == crc32c


def _listing(transfer: Transfer, client, bucket: str, prefix: str) -> list | None:
    """The objects under the prefix; None, and the transfer failed, when the bucket does not exist."""
    from google.api_core import exceptions as gexc

    try:
        return list(client.list_blobs(bucket, prefix=prefix or None))
    except gexc.NotFound:
        transfer.failure = (5, f"Bucket gs://{bucket} does not exist or the Managed Lustre service agent cannot "
                               "access it.")
        transfer.fail(5, f"gs://{bucket}/{prefix}", transfer.failure[1])
        return None


# Incremental transfers: "Data transfers are incremental; they only copy files that don't already exist in the
# destination, or that have changed since they were transferred" (transfer-data); what is not copied counts as
# skipped, and foundObjectsCount excludes it ("excluding any that are ... skipped due to sync", TransferCounters).
# Assumed: "changed" is judged by content (size and crc32c), and a transfer deletes nothing in the destination
# ("Exports do not delete files in the destination bucket that have been deleted from the instance",
# managed-lustre/docs/back-up-instance-data).
def _objects_beside(transfer: Transfer, client, directory: Path, bucket: str, prefix: str, missing: str):
    """The objects under the prefix, once the Lustre directory is known to exist; None (the transfer failed
    NOT_FOUND) if either is missing."""
    if not directory.is_dir():
        transfer.failure = (5, missing)
        transfer.fail(5, transfer.lustre_path, missing)
        return None
    return _listing(transfer, client, bucket, prefix)


def _plan_export(transfer: Transfer, client, root: Path, bucket: str, prefix: str) -> None:
    """Every file under the Lustre path, as the object prefix + its path relative to the Lustre path (assumed:
    /a/b/c.bin exported from /a/ to gs://bkt/x/ is x/b/c.bin); empty directories make no object."""
    source = root / transfer.lustre_path.strip("/")
    objects = _objects_beside(transfer, client, source, bucket, prefix,
                              f"Lustre path {transfer.lustre_path} does not exist or is not a directory.")
    if objects is None:
        return
    existing = {blob.name: (blob.size, blob.crc32c) for blob in objects}
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        name, size = prefix + path.relative_to(source).as_posix(), path.stat().st_size
        if existing.get(name, (None, None))[0] == size and _same(path, size, existing[name][1]):
            transfer.counters["objectsSkippedCount"] += 1
            transfer.counters["bytesSkippedCount"] += size
        else:
            transfer.items.append((path, name, size))
            transfer.counters["foundObjectsCount"] += 1
            transfer.counters["bytesFoundCount"] += size


def _plan_import(transfer: Transfer, client, root: Path, bucket: str, prefix: str) -> None:
    """Every object under the prefix, as the Lustre path + its name after the prefix; objects ending with "/"
    (folder placeholders) make no file (assumed)."""
    destination = root / transfer.lustre_path.strip("/")
    # LustrePath.path: "If you're importing data into Managed Lustre, any path other than the default must
    # already exist on the file system."
    objects = _objects_beside(transfer, client, destination, bucket, prefix,
                              f"Lustre path {transfer.lustre_path} does not exist: create the directory first.")
    if objects is None:
        return
    for blob in sorted(objects, key=lambda b: b.name):
        relative, size = blob.name[len(prefix):], int(blob.size or 0)
        if not relative or relative.endswith("/"):
            continue
        parts = relative.split("/")
        target = None if {"", ".", ".."} & set(parts) else destination.joinpath(*parts)
        if target is not None and _same(target, size, blob.crc32c):
            transfer.counters["objectsSkippedCount"] += 1
            transfer.counters["bytesSkippedCount"] += size
        else:
            transfer.items.append((blob.name, target, size))
            transfer.counters["foundObjectsCount"] += 1
            transfer.counters["bytesFoundCount"] += size


def _rpc_code(error: Exception) -> int:
    """The google.rpc code of a failed copy: the storage client's error's, NOT_FOUND for a vanished file."""
    code = getattr(error, "grpc_status_code", None)
    if code is not None:
        return code.value[0]
    return 5 if isinstance(error, FileNotFoundError) else 13


def main() -> None:
    """`cd tests && python -m fakes.gcp [--latency S] [--operation-seconds S] [--storage-endpoint URL]
    [--files-root DIR]`: serve until stdin closes.

    Prints the endpoints as one JSON line (RLOPS_API_ENDPOINTS takes it as it is). Run apart from
    the process under test, the fake's own work does not compete with it for the interpreter.
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--operation-seconds", type=float, default=0.3)
    parser.add_argument("--storage-endpoint", help="the fake-gcs-server Lustre transfers use")
    parser.add_argument("--files-root", type=Path, help="where the Lustre instances' files are (kept on exit)")
    args = parser.parse_args()
    fake = FakeGcp(latency=args.latency, operation_seconds=args.operation_seconds,
                   storage_endpoint=args.storage_endpoint, files_root=args.files_root).start()
    print(json.dumps(fake.endpoints), flush=True)
    sys.stdin.read()
    fake.stop()


if __name__ == "__main__":
    main()
