"""What every cloud adapter shares: where it points, retries, and waiting on operations.

An adapter reads, creates, updates and deletes the resources of one Google API. It speaks the
API's types and hands back rlops's flat field vocabulary (see `rlops.provision.resources`).
"""

import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol, TypeVar

import google.auth
import httplib2
import requests
from google.api_core import exceptions as gexc
from google.api_core.gapic_v1.client_info import ClientInfo
from google.auth.credentials import AnonymousCredentials
from google_auth_httplib2 import AuthorizedHttp

from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.permissions import lacking_permission
from rlops.resource_shapes import Live, Resource

OWNER_MARK = "rlops-managed-by=rlops"

P = ParamSpec("P")
T = TypeVar("T")
Client = TypeVar("Client")


@dataclass(frozen=True)
class Target:
    """Where an environment's resources live."""

    environment: str
    project: str
    project_number: int
    region: str
    zone: str
    cluster: str

    @property
    def description(self) -> str:
        # Compute networks, subnets, firewalls and addresses have no labels; ownership goes in the description.
        return f"{OWNER_MARK} rlops-env={self.environment}"

    def owns_description(self, description: str | None) -> bool:
        return f"rlops-env={self.environment}" in (description or "") and OWNER_MARK in (description or "")

    def owns_labels(self, labels: Mapping[str, str] | None) -> bool:
        labels = dict(labels or {})
        return labels.get("rlops-managed-by") == "rlops" and labels.get("rlops-env") == self.environment


class Http(Protocol):
    """What google-api-python-client asks of the `http` it is given: httplib2.Http's `request`."""

    def request(self, uri: str, method: str = "GET", body: str | bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[httplib2.Response, bytes]: ...


@dataclass(frozen=True)
class Connection:
    """How to reach the APIs: Google's endpoints with default credentials, or a local fake."""

    credentials: Any = None
    endpoints: Endpoints = field(default_factory=Endpoints)
    # Says which rlops process sent a request, in the API's audit log (and a fake's request log).
    user_agent: str = field(default_factory=lambda: f"rlops pid/{os.getpid()}")

    @classmethod
    def to(cls, endpoints: Endpoints) -> "Connection":
        """Google's APIs with application default credentials, or, where `endpoints.apis` names a fake, no
        credentials at all unless some are configured (`endpoints.credentials`)."""
        if endpoints.apis and not endpoints.credentials:
            return cls(credentials=AnonymousCredentials(), endpoints=endpoints)
        return cls(endpoints=endpoints)

    def client_options(self, api: str) -> dict | None:
        apis = self.endpoints.apis
        return {"api_endpoint": apis[api]} if api in apis else None

    # GAPIC clients are thread-safe and keep their HTTP connections open: one of each per connection,
    # shared by every environment's adapters, so planning ten environments does not open ten sets.
    _clients: dict[Callable[..., Any], Any] = field(default_factory=dict, compare=False, repr=False)
    _clients_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def discovery(self, api: str, version: str, http: Http | None = None) -> Any:
        """A google-api-python-client of `api` (for the APIs with no GAPIC library), from its bundled discovery
        document. Any: its resources and methods are made at run time from that document."""
        from googleapiclient import discovery  # noqa: PLC0415 cold start: only where a discovery client is built
        from googleapiclient.http import set_user_agent  # noqa: PLC0415 cold start: as above

        if http is None:
            credentials = self.credentials
            if credentials is None:
                credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            http = set_user_agent(AuthorizedHttp(credentials, http=httplib2.Http(timeout=60)), self.user_agent)
        return discovery.build(api, version, static_discovery=True, cache_discovery=False,
                               client_options=self.client_options(api), http=http)

    def gapic(self, api: str, client_class: Callable[..., Client]) -> Client:
        """The one `client_class` (a GAPIC client of `api`) of this connection, over REST."""
        with self._clients_lock:
            if client_class not in self._clients:
                self._clients[client_class] = client_class(
                    transport="rest", credentials=self.credentials, client_options=self.client_options(api),
                    client_info=ClientInfo(user_agent=self.user_agent))
            return self._clients[client_class]


@dataclass(frozen=True)
class Read:
    """One API call that reads resources: `fetch` makes it, `pick` finds in its answer the resources one
    environment asked for ({key: Live or None}). Reads with equal `call` are one call: the environments of a
    project share a list of its networks, clusters or Lustre instances."""

    call: tuple
    fetch: Callable[[], Any]
    pick: Callable[[Any], dict[str, Live | None]]


class ResourceAdapter(Protocol):
    """What the provisioning engine asks of the adapter of a resource kind (`rlops.cloud.adapters()` maps
    kinds to adapters). `fields` is what finds the resource: the desired fields, or the recorded ones of a
    resource the spec dropped (its region, zone or cluster)."""

    # Read-only: an adapter's `kinds = ("network", "subnetwork")` is a tuple of literal strings.
    @property
    def kinds(self) -> tuple[str, ...]: ...

    @property
    def target(self) -> Target: ...

    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        """The calls that read these (kind, name, fields): one list per kind where the API has one."""
        ...

    def read(self, kind: str, name: str, fields: dict) -> Live | None: ...

    def create(self, resource: Resource) -> "Pending": ...

    def update(self, resource: Resource, changed: list[str]) -> "Pending": ...

    def delete(self, kind: str, name: str, fields: dict) -> "Pending": ...


def read_each(adapter: ResourceAdapter, api: str, wanted: list[tuple[str, str, dict]]) -> list[Read]:
    """`reads` of an API without a list worth sharing: one get per resource."""
    project = adapter.target.project
    return [Read((api, project, kind, name, tuple(sorted((k, str(v)) for k, v in fields.items()))),
                 lambda kind=kind, name=name, fields=fields: adapter.read(kind, name, fields),
                 lambda live, kind=kind, name=name: {f"{kind}/{name}": live})
            for kind, name, fields in wanted]


class CloudError(Failure):
    """A failed call, said so that the user knows which API, which resource and what to do."""


@dataclass
class RetryPolicy:
    attempts: int = 8
    base_seconds: float = 0.5
    cap_seconds: float = 30.0

    def delays(self) -> Iterator[float]:
        for attempt in range(self.attempts - 1):
            # Full jitter: concurrent appliers that failed together do not retry together.
            yield random.uniform(0, min(self.cap_seconds, self.base_seconds * 2 ** attempt))


RETRY = RetryPolicy()
_TRANSIENT = (gexc.TooManyRequests, gexc.ServiceUnavailable, gexc.InternalServerError, gexc.BadGateway,
              gexc.GatewayTimeout, gexc.DeadlineExceeded)


def is_transient(error: Exception) -> bool:
    if isinstance(error, _TRANSIENT):
        return True
    if isinstance(error, (requests.ConnectionError, httplib2.HttpLib2Error, ConnectionError)):
        return True  # a dropped connection; the clients do not retry it themselves
    # GKE runs one operation per cluster at a time and refuses others (HTTP 400, FAILED_PRECONDITION) until it is
    # done, in three wordings (the Terraform Google provider retries all three: its issues #975, #3650, #7638,
    # #10366), common right after a cluster is created and during auto-upgrades.
    return isinstance(error, (gexc.FailedPrecondition, gexc.BadRequest)) and any(
        words in str(error).lower() for words in GKE_BUSY)


GKE_BUSY = ("incompatible operation", "please wait and try again once it is done",
            "is currently being created, deleted, updated or repaired")


def call(api: str, what: str, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one API call, retrying transient failures with exponential backoff and jitter."""
    delays = RETRY.delays()
    while True:
        try:
            return function(*args, **kwargs)
        except Exception as raised:  # sorted into transient and final below
            error = _as_api_core(raised)
            if not is_transient(error):
                raise CloudError(explain(api, what, error)) from error
            delay = next(delays, None)
            if delay is None:
                raise CloudError(f"{explain(api, what, error)} (gave up after {RETRY.attempts} attempts)") from error
            time.sleep(delay)


def get_or_none(api: str, what: str, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`call` for a read: None when the resource does not exist."""
    try:
        return call(api, what, function, *args, **kwargs)
    except CloudError as error:
        if isinstance(error.__cause__, gexc.NotFound):
            return None
        raise


def is_conflict(error: CloudError) -> bool:
    """The create was refused because the resource exists (an earlier, interrupted create got through)."""
    return isinstance(error.__cause__, (gexc.Conflict, gexc.AlreadyExists))


def _as_api_core(error: Exception) -> Exception:
    """googleapiclient's HttpError as the google.api_core exception of its status, like the GAPIC clients raise."""
    status = getattr(getattr(error, "resp", None), "status", None)
    if status is None:
        return error
    converted = gexc.from_http_status(int(status), getattr(error, "reason", None) or str(error))
    converted.__cause__ = error
    return converted


QUOTA_HINT = "a quota is exhausted: ask for more in the console (IAM & Admin > Quotas) or use another region"


def is_quota(error: Exception) -> bool:
    """Refused for quota, however the API answers it: Compute's 403 `quotaExceeded`, GKE's 403 "Insufficient
    regional quota", the ErrorInfo reason google/api/error_reason.proto gives it; never a missing permission."""
    reasons = {getattr(error, "reason", None)} | {
        item.get("reason") for item in getattr(error, "errors", None) or () if isinstance(item, dict)}
    message = getattr(error, "message", None) or str(error)
    return bool(reasons & {"RESOURCE_QUOTA_EXCEEDED", "quotaExceeded"}) or "quota" in message.lower()


def explain(api: str, what: str, error: Exception) -> str:
    message = getattr(error, "message", None) or str(error)
    if is_quota(error):
        hint = QUOTA_HINT
    elif isinstance(error, (gexc.PermissionDenied, gexc.Forbidden)):
        hint = lacking_permission(error) or ("the caller lacks a permission (named in the message), or the API is "
                                             "not enabled in the project")
    elif isinstance(error, gexc.NotFound):
        hint = "it does not exist (or the API is not enabled in the project)"
    elif isinstance(error, (gexc.Conflict, gexc.AlreadyExists)):
        hint = "it exists already"
    elif isinstance(error, (gexc.FailedPrecondition, gexc.BadRequest)):
        hint = "the API refused the request"
    elif isinstance(error, gexc.ResourceExhausted):
        hint = "a quota is exhausted"
    else:
        hint = type(error).__name__
    return f"{api}: {what}: {hint}: {message}"


class Pending:
    """A long-running operation: `poll()` says (done, error message or None)."""

    def __init__(self, description: str, poll: Callable[[], tuple[bool, str | None]]):
        self.description = description
        self._poll = poll

    def poll(self) -> tuple[bool, str | None]:
        return self._poll()

    def wait(self, timeout: float | None = None, first_poll_seconds: float = 0.2,
             max_poll_seconds: float = 5.0) -> str | None:
        """Poll, often at first (most operations finish in seconds), until done; its error message or None.
        Raises `OperationTimeout` once `timeout` seconds have passed without it finishing."""
        started, delay = time.monotonic(), first_poll_seconds
        while True:
            done, error = self.poll()
            if done:
                return error
            if timeout is not None and time.monotonic() - started > timeout:
                raise OperationTimeout(f"{self.description}: not finished after {timeout:.0f}s")
            time.sleep(delay)
            delay = min(max_poll_seconds, delay * 1.5)


class OperationTimeout(Failure):
    pass


def longrunning(api: str, what: str, operation: dict, get: Callable[[str], dict]) -> Pending:
    """A google.longrunning.Operation as a discovery client returns it (a dict), polled through `get(name)`."""
    name = operation.get("name")
    if operation.get("done") or not name:
        return Pending(f"{what} operation", lambda: (True, _operation_error(operation)))

    def poll() -> tuple[bool, str | None]:
        current = call(api, f"get operation {name}", get, name)
        return bool(current.get("done")), _operation_error(current)

    return Pending(f"{what} {name}", poll)


def _operation_error(operation: dict) -> str | None:
    error = operation.get("error")
    return f"{error.get('code')}: {error.get('message')}" if error else None



def last_segment(url: str | None) -> str | None:
    return url.rstrip("/").rsplit("/", 1)[-1] if url else None


def from_projects(url: str | None) -> str | None:
    """`https://.../compute/v1/projects/p/global/x/y` -> `projects/p/global/x/y`."""
    if not url:
        return None
    return url[url.index("projects/"):] if "projects/" in url else url
