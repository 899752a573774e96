"""The Kubernetes API of an environment's cluster (the official kubernetes client): get, list, apply, delete.

Reached through the GKE control plane's DNS endpoint with the caller's Google credentials (no
kubeconfig on disk, no IP allow-list), or at an explicit URL (`Endpoints.kube`, from RLOPS_KUBE_API: tests
and local clusters). Objects are applied by server-side apply with the field manager `rlops`, as Argo CD does.

The bearer token is a Google OAuth access token, good for an hour
(cloud.google.com/docs/authentication/token-types, "Access tokens"); the API server answers 401 Unauthorized
to one that has expired (k8s.io/apiserver pkg/endpoints/filters/authentication.go). An apply can wait longer
than that (a CRD to be served, then readiness, up to --ready-timeout each), so the token is looked at before
every request and refreshed when it is within `REFRESH_MARGIN` of its expiry, and a 401 is retried once with a
token refreshed then (a clock that disagrees with the server's, a token revoked early).
"""

import datetime
import json
import threading
from collections.abc import Callable
from typing import Any, Protocol, cast

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport.requests
from kubernetes import client
from kubernetes.client.rest import RESTResponse

from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.kube.objects import KINDS, Manifest, Ref, spec_of
from rlops.permissions import Need, lacking_permission, requires

# The Kubernetes API through GKE's IAM (cloud.google.com/kubernetes-engine/docs/reference/api-permissions):
# container.RESOURCE.VERB, custom resources (RayCluster, Network, GKENetworkParamSet) as thirdPartyObjects.
APPLIED = ("namespaces", "serviceAccounts", "secrets", "persistentVolumes", "persistentVolumeClaims", "daemonSets",
           "thirdPartyObjects", "customResourceDefinitions")


def kubernetes_needs(kinds: str | tuple[str, ...], *verbs: str) -> tuple[Need, ...]:
    return tuple(Need(f"container.{kind}.{verb}") for kind in ((kinds,) if isinstance(kinds, str) else kinds)
                 for verb in verbs)

FIELD_MANAGER = "rlops"
# The reaper's and the wake's writes of worker replicas: an update under their own name, so the
# object's managedFields say who set the count (apply keeps it; see diff.keep_live).
REAPER_FIELD_MANAGER = "rlops-reaper"
class KubeError(Failure):
    """`code` and `said`: the API server's HTTP status and its own message, when it answered."""

    def __init__(self, message: str, code: int = 0, said: str = ""):
        super().__init__(message)
        self.code, self.said = code, said


REFRESH_MARGIN = datetime.timedelta(minutes=5)  # a token this close to its expiry is refreshed before it is sent


def _utcnow() -> datetime.datetime:
    """Naive UTC, as google-auth keeps a credential's `expiry`."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


class BearerToken:
    """The caller's Google access token for the API server, refreshed before it expires (see the module's
    docstring). `credentials`: google-auth credentials (`token`, `expiry`, `valid`, `refresh`); `now`: the clock
    the expiry is read against."""

    def __init__(self, credentials: google.auth.credentials.Credentials, now: Callable[[], datetime.datetime] = _utcnow,
                 margin: datetime.timedelta = REFRESH_MARGIN):
        self.credentials, self.now, self.margin = credentials, now, margin
        self._lock = threading.Lock()  # a plan reads environments in threads; one refresh at a time

    def value(self, renew: bool = False) -> str:
        """The token to send now; `renew`: a fresh one whatever the expiry says (the server refused the last)."""
        with self._lock:
            credentials = self.credentials
            expiry = credentials.expiry
            if renew or not credentials.valid or (expiry is not None and expiry - self.now() <= self.margin):
                try:
                    credentials.refresh(google.auth.transport.requests.Request())
                except google.auth.exceptions.GoogleAuthError as error:
                    raise KubeError(f"cannot get a Google access token for the cluster's API server: {error}") \
                        from error
            token = credentials.token
            if token is None:  # valid credentials hold one, and so do refreshed ones
                raise KubeError("the Google credentials gave no access token for the cluster's API server")
            return token


def access(dns_endpoint: str | None, endpoints: Endpoints) -> tuple[str, BearerToken | None]:
    """(base URL, token) of the cluster's API server: `endpoints.kube` if set (with a token only where credentials
    are configured, `endpoints.credentials`), else the DNS endpoint with a Google access token of the caller's
    credentials."""
    if endpoints.kube and not endpoints.credentials:
        return endpoints.kube, None
    if not endpoints.kube and not dns_endpoint:
        raise KubeError("the cluster has no DNS endpoint to reach its control plane; set cluster.dns_endpoint: true "
                        "and apply, or point RLOPS_KUBE_API at the API server")
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    token = BearerToken(credentials)
    token.value()  # fetched now: credentials that cannot make a token fail here, before any request
    return endpoints.kube or f"https://{dns_endpoint}", token


@requires(*kubernetes_needs("services", "get", "proxy"))
def ray_dashboard(dns_endpoint: str | None, namespace: str, ray_cluster: str,
                  endpoints: Endpoints) -> tuple[str, dict[str, str]]:
    """(URL, headers) of a RayCluster's Ray dashboard through the API server's service proxy (KubeRay's
    NAME-head-svc), with the caller's credentials: a token good for one look (ask again for the next)."""
    base, token = access(dns_endpoint, endpoints)
    headers = {"Authorization": f"Bearer {token.value()}"} if token else {}
    return f"{base}/api/v1/namespaces/{namespace}/services/{ray_cluster}-head-svc:dashboard/proxy", headers


def connect(dns_endpoint: str | None, endpoints: Endpoints) -> "KubeApi":
    host, token = access(dns_endpoint, endpoints)
    return KubeApi(client.ApiClient(client.Configuration(host=host)), token)


class _KeyRefresh(Protocol):
    """`client.Configuration`'s hook, called with the configuration before each request reads its key: the client
    declares it only as `self.refresh_api_key_hook = None` (kubernetes/client/configuration.py), all a type checker
    sees of it."""

    refresh_api_key_hook: Callable[[client.Configuration], None] | None


class KubeApi:
    def __init__(self, api_client: client.ApiClient, token: BearerToken | None = None):
        self.api, self.token = api_client, token
        self._served: dict[str, bool] = {}
        if token is not None:
            # The client reads the key through this hook before every request (Configuration.get_api_key_with_prefix).
            configuration = api_client.configuration
            configuration.api_key = {"authorization": token.value()}
            configuration.api_key_prefix = {"authorization": "Bearer"}
            cast(_KeyRefresh, configuration).refresh_api_key_hook = \
                lambda conf: conf.api_key.update(authorization=token.value())

    def _path(self, ref: Ref, collection: bool = False) -> str:
        prefix, plural, namespaced = KINDS[ref.kind]
        scope = f"/namespaces/{ref.namespace}" if namespaced and ref.namespace else ""
        return f"{prefix}{scope}/{plural}" + ("" if collection else f"/{ref.name}")

    def _call(self, method: str, path: str, query: dict[str, str] | None = None, body: object = None,
              content_type: str | None = None) -> Any:
        """The API server's answer as JSON; None for a GET or DELETE of what is not there (404)."""
        response = self._send(method, path, query, body, content_type)
        if response.status == 401 and self.token is not None:
            # Refused as expired or revoked although our clock said it was good: once more, with a new token.
            self.token.value(renew=True)
            response = self._send(method, path, query, body, content_type)
        data = json.loads(response.data) if response.data else {}
        if response.status == 404 and method in ("GET", "DELETE"):
            return None
        if response.status >= 300:
            refused = " (the caller's Google token, refreshed, was refused too)" if response.status == 401 and \
                self.token is not None else ""
            lacking = lacking_permission(KubeError(data.get("message", ""))) if response.status == 403 else None
            raise KubeError(f"Kubernetes API {method} {path}: {response.status} {data.get('reason', '')}: "
                            f"{lacking + ': ' if lacking else ''}{data.get('message', '')}{refused}", response.status,
                            data.get("message", ""))
        return data

    def _send(self, method: str, path: str, query: dict[str, str] | None, body: object,
              content_type: str | None) -> RESTResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        _, url, headers, serialized, _ = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(method, url, headers, serialized)
            response.read()
        except Exception as error:  # urllib3's connection errors, said as one line
            raise KubeError(f"Kubernetes API {method} {path}: cannot reach the cluster: {error}") from error
        return response

    def served(self, kind: str) -> bool:
        """Whether the API server serves `kind` (its group-version's discovery document lists it), as of the
        first ask since `forget_served`."""
        prefix, plural, _ = KINDS[kind]
        if prefix not in self._served:
            listed = self._call("GET", prefix)
            self._served[prefix] = bool(listed) and any(r.get("name") == plural for r in listed.get("resources", []))
        return self._served[prefix]

    def forget_served(self) -> None:
        self._served.clear()

    @requires(*kubernetes_needs(APPLIED, "get"))
    def get(self, ref: Ref) -> Manifest | None:
        return self._call("GET", self._path(ref))

    @requires(*kubernetes_needs(APPLIED, "list"))
    def list_labelled(self, kind: str, labels: dict[str, str], namespace: str = "",
                      fields: dict[str, str] | None = None) -> list[Manifest]:
        """The objects of `kind` with these labels (in `namespace`, or in all) and, if given, these field values
        (a field selector: the fields the kind's registry lets a list select on); none while the kind is not
        served (the list is a 404)."""
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}
        if fields:
            query["fieldSelector"] = ",".join(f"{k}={v}" for k, v in sorted(fields.items()))
        listed = self._call("GET", self._path(Ref(kind, "", namespace), collection=True), query)
        items: list[Manifest] = (listed or {}).get("items", [])
        for item in items:
            item["kind"] = kind  # an item of a list comes without it
        return items

    @requires(*kubernetes_needs(APPLIED, "get", "create", "update"))
    def apply(self, obj: Manifest, dry_run: bool = False) -> Manifest:
        """Server-side apply as rlops; `dry_run`: what the server would make of it, changing nothing."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        return self._call("PATCH", self._path(Ref.of(obj)), query, body=obj,
                          content_type="application/apply-patch+yaml")

    @requires(*kubernetes_needs("thirdPartyObjects", "get", "update"))
    def set_worker_replicas(self, ref: Ref, sizes: dict[str, int]) -> bool:
        """The reaper's and the wake's write: worker groups' replicas, by JSON patch. Each replace is preceded
        by a `test` of the group's name at that index, so a list reordered since the read changes nothing
        (422) instead of resizing the wrong group. False if the RayCluster (or its kind) is not there."""
        live = self.get(ref)
        if live is None:
            return False
        patch = []
        for i, group in enumerate(spec_of(live).get("workerGroupSpecs", [])):
            if group["groupName"] in sizes:
                patch += [{"op": "test", "path": f"/spec/workerGroupSpecs/{i}/groupName", "value": group["groupName"]},
                          {"op": "replace", "path": f"/spec/workerGroupSpecs/{i}/replicas",
                           "value": sizes[group["groupName"]]}]
        if patch:
            self._call("PATCH", self._path(ref), {"fieldManager": REAPER_FIELD_MANAGER}, body=patch,
                       content_type="application/json-patch+json")
        return True

    @requires(*kubernetes_needs(APPLIED, "delete"))
    def delete(self, ref: Ref) -> None:
        self._call("DELETE", self._path(ref))
