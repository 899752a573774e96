"""What cloudbuild/deploy.yaml's gcloud commands call, served by the fake GCP (FakeGcp mounts `DeployApis`):

- Pub/Sub v1: topics get/create, subscriptions get/create/patch, and both kinds' getIamPolicy/setIamPolicy;
- Cloud Functions v2: functions get/create/patch (long-running operations whose BUILD and SERVICE stages
  gcloud shows), runtimes.list, generateUploadUrl and the PUT of the source zip to the signed URL it returns
  (served here too: `upload_url`), operations get;
- Cloud Run v1: a function's service's getIamPolicy/setIamPolicy (`gcloud functions add-invoker-policy-binding`
  grants roles/run.invoker on the 2nd gen function's Cloud Run service; `functions deploy` of an existing
  function with --no-allow-unauthenticated also rewrites that policy);
- Cloud Scheduler v1: jobs create/patch (get is FakeGcp's, as the doctor reads it);
- what `functions deploy` reads on the side: Resource Manager v1 projects.get (the project's number) and
  Service Usage v1 services.get (whether run, cloudbuild and artifactregistry are enabled).

Requests are checked against the discovery documents (google_apis) and IAM (FakeGcp._authorize) before they
get here. The rules enforced below are the fields' own documentation in those discovery documents, unless a
comment names another source. Functions and jobs are FakeGcp's `functions` and `scheduler_jobs`, which the
doctor's deployment check reads.

`gcloud_environment` points the installed gcloud at all of this.
"""

import ast
import base64
import copy
import hashlib
import hmac
import io
import json
import re
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fakes import artifactregistry
from fakes.gcp import ApiError, OperationFailed, Request, _camel, _timestamp, conflict, iam, invalid, not_found

# The fake's URL prefix of each API gcloud is pointed at (api_endpoint_overrides), as google_apis.DISCOVERY maps
# them to discovery documents.
PREFIXES = {"pubsub": "/pubsub/", "cloudfunctions": "/cf/", "run": "/run/", "cloudscheduler": "/cs/",
            "cloudresourcemanager": "/crm/", "serviceusage": "/su/"}
UPLOAD = "/upload/"
UPLOAD_SECONDS = 30 * 60
# Pub/Sub's topic and subscription ids (Topic.name, Subscription.name).
_PUBSUB_ID = re.compile(r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
# Cloud Scheduler's JOB_ID (Job.name).
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,500}")
# functionId: "4-63 characters, valid characters are /a-z-/" (create's parameter); digits too, as the console's
# own default name ("function-1") has.
_FUNCTION_ID = re.compile(r"[a-z0-9-]{4,63}")
_DURATION = re.compile(r"(\d+)(?:\.\d+)?s")
# google.cloud.functions.v2 runtimes gcloud may name (cloud.google.com/functions/docs/runtime-support).
RUNTIMES = ("python310", "python311", "python312", "python313", "nodejs20", "nodejs22", "go122", "go123")
EMPTY_ETAG = "ACAB"  # the etag of a policy with no bindings, as IAM answers it


class DeployApis:
    def __init__(self, gcp):
        self.gcp = gcp
        self.topics: dict[str, dict] = {}          # projects/P/topics/T -> pubsub v1 Topic
        self.subscriptions: dict[str, dict] = {}   # projects/P/subscriptions/S -> pubsub v1 Subscription
        self.policies: dict[str, dict] = {}        # a topic's, subscription's or Run service's name -> iam v1 Policy
        self.uploads: dict[str, bytes] = {}        # gs://BUCKET/OBJECT -> what was PUT to its signed URL
        self._secret = hashlib.sha256(b"fake-gcp-url-signing").digest()
        self._serial = 0
        self._sent: dict[str, tuple[str, dict | None]] = {}  # operation name -> (verb, the Function sent)

    def state(self) -> tuple:
        """A copy of everything a deploy leaves, for a test to put back (`restore`)."""
        return copy.deepcopy((self.gcp.functions, self.gcp.scheduler_jobs, self.topics, self.subscriptions,
                              self.policies, self.uploads))

    def restore(self, state: tuple) -> None:
        with self.gcp._lock:
            (self.gcp.functions, self.gcp.scheduler_jobs, self.topics, self.subscriptions, self.policies,
             self.uploads) = copy.deepcopy(state)

    def routes(self) -> list:
        topic = r"/pubsub/v1/(?P<name>projects/(?P<project>[^/]+)/topics/(?P<short>[^/:]+))"
        subscription = r"/pubsub/v1/(?P<name>projects/(?P<project>[^/]+)/subscriptions/(?P<short>[^/:]+))"
        location = r"/cf/v2/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
        function = r"/cf/v2/(?P<name>projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/functions/[^/:]+)"
        service = r"/run/v1/(?P<name>projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/services/[^/:]+)"
        jobs = r"/cs/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/jobs"
        return [
            ("GET", topic, self._get_topic), ("PUT", topic, self._create_topic),
            ("GET", subscription, self._get_subscription), ("PUT", subscription, self._create_subscription),
            ("PATCH", subscription, self._patch_subscription),
            *[(verb, pattern + suffix, handler) for pattern in (topic, subscription, service)
              for verb, suffix, handler in (("GET", ":getIamPolicy", self._get_policy),
                                            ("POST", ":setIamPolicy", self._set_policy))],
            ("GET", function, self._get_function), ("POST", location + r"/functions", self._create_function),
            ("PATCH", function, self._patch_function),
            ("POST", location + r"/functions:generateUploadUrl", self._generate_upload_url),
            ("GET", location + r"/runtimes", self._list_runtimes),
            ("GET", location + r"/operations/(?P<op>[^/]+)", self._function_operation),
            ("POST", jobs, self._create_job), ("PATCH", jobs + r"/(?P<short>[^/]+)", self._patch_job),
            ("GET", r"/crm/v1/projects/(?P<project>[^/:]+)", self._get_project),
            ("GET", r"/su/v1/projects/(?P<project>[^/]+)/services/(?P<service>[^/:]+)", self._get_service),
        ]

    # -- who may: acting as a service account -------------------------------------------------------------
    def _act_as(self, request, project: str, email: str) -> None:
        """iam.serviceAccounts.actAs on the account a resource will run or sign as: a function's runtime and build
        accounts (cloud.google.com/functions/docs/securing/function-identity and .../securing/build-custom-sa:
        the deployer needs it on the runtime and the build service account), a push subscription's token account
        (cloud.google.com/pubsub/docs/create-push-subscription, "Authentication")."""
        if self.gcp.iam is None:
            return
        try:
            self.gcp.iam.check(request.caller, ("iam.serviceAccounts.actAs",),
                               f"projects/{project}/serviceAccounts/{email}", "iam.googleapis.com")
        except iam.Denied as denied:
            raise ApiError(denied.code, denied.status, denied.message, "forbidden", denied.details) from None

    # -- Pub/Sub --------------------------------------------------------------------------------------------
    @staticmethod
    def _pubsub_missing(name: str) -> ApiError:
        return ApiError(404, "NOT_FOUND", f"Resource not found (resource={name.rsplit('/', 1)[-1]}).", "notFound")

    def _get_topic(self, request, name, project, short):
        if name not in self.topics:
            raise self._pubsub_missing(name)
        return self.topics[name]

    def _create_topic(self, request, name, project, short):
        if not _PUBSUB_ID.fullmatch(short):
            raise invalid(f"Invalid [topics] name: ({name})")
        if name in self.topics:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource already exists in the project (resource={short}).",
                           "alreadyExists")
        self.topics[name] = {"name": name, **{k: v for k, v in (request.body or {}).items() if k != "name"}}
        return self.topics[name]

    def _get_subscription(self, request, name, project, short):
        if name not in self.subscriptions:
            raise self._pubsub_missing(name)
        return self.subscriptions[name]

    def _create_subscription(self, request, name, project, short):
        body = dict(request.body or {})
        if not _PUBSUB_ID.fullmatch(short):
            raise invalid(f"Invalid [subscriptions] name: ({name})")
        if name in self.subscriptions:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource already exists in the project (resource={short}).",
                           "alreadyExists")
        if body.get("topic") not in self.topics:
            raise self._pubsub_missing(body.get("topic") or "")
        subscription = {"name": name, "topic": body["topic"], "ackDeadlineSeconds": 10,
                        "messageRetentionDuration": "604800s", "expirationPolicy": {"ttl": "2678400s"},
                        "state": "ACTIVE", **{k: v for k, v in body.items() if k not in ("name", "topic")}}
        self._check_subscription(request, project, subscription)
        self.subscriptions[name] = subscription
        return subscription

    def _patch_subscription(self, request, name, project, short):
        body = request.body or {}
        if name not in self.subscriptions:
            raise self._pubsub_missing(name)
        mask = [path for path in (body.get("updateMask") or "").split(",") if path]
        if not mask:  # UpdateSubscriptionRequest.updateMask: "Must be specified and non-empty."
            raise invalid("Invalid update_mask provided in the UpdateSubscriptionRequest: the update_mask must be "
                          "specified and non-empty.")
        updated = json.loads(json.dumps(self.subscriptions[name]))
        for path in mask:
            if _camel(path.split(".")[0]) in ("name", "topic"):
                raise invalid(f"Invalid update_mask provided in the UpdateSubscriptionRequest: the '{path}' field "
                              "cannot be updated.")
            _apply(updated, body.get("subscription") or {}, path)
        self._check_subscription(request, project, updated)
        self.subscriptions[name] = updated
        return updated

    def _check_subscription(self, request, project: str, subscription: dict) -> None:
        deadline = int(subscription.get("ackDeadlineSeconds") or 10)
        if not 10 <= deadline <= 600:
            raise invalid(f"Invalid ack deadline given: {deadline}. The ack deadline must be between 10 and 600 "
                          "seconds.")
        retention = _seconds(subscription["messageRetentionDuration"], "message_retention_duration")
        if not 600 <= retention <= 31 * 86400:
            raise invalid("Invalid message_retention_duration: cannot be more than 31 days or less than 10 minutes.")
        dead = subscription.get("deadLetterPolicy")
        if dead is not None:
            if dead.get("deadLetterTopic") not in self.topics:  # "The operation will fail if the topic does not exist."
                raise self._pubsub_missing(dead.get("deadLetterTopic") or "")
            attempts = int(dead.get("maxDeliveryAttempts") or 5)
            if not 5 <= attempts <= 100:
                raise invalid(f"Invalid max_delivery_attempts: {attempts}. It must be between 5 and 100.")
        retry = subscription.get("retryPolicy")
        if retry is not None:
            low = _seconds(retry.get("minimumBackoff", "10s"), "minimum_backoff")
            high = _seconds(retry.get("maximumBackoff", "600s"), "maximum_backoff")
            if not (0 <= low <= 600 and 0 <= high <= 600 and low <= high):
                raise invalid("Invalid retry_policy: minimum_backoff and maximum_backoff must be between 0 and 600 "
                              "seconds, the minimum not above the maximum.")
        push = subscription.get("pushConfig") or {}
        if push.get("pushEndpoint") and not push["pushEndpoint"].startswith("https://"):
            # cloud.google.com/pubsub/docs/push: "The push endpoint must be a publicly accessible HTTPS address."
            raise invalid(f"Invalid push_endpoint given: {push['pushEndpoint']}. It must be an HTTPS URL.")
        if (push.get("oidcToken") or {}).get("serviceAccountEmail"):
            self._act_as(request, project, push["oidcToken"]["serviceAccountEmail"])

    # -- IAM policies of topics, subscriptions and Run services ------------------------------------------------
    def _resource(self, name: str) -> dict | None:
        if "/services/" in name:
            return next((f for f in self.gcp.functions.values()
                         if (f.get("serviceConfig") or {}).get("service") == name), None)
        if "/repositories/" in name:
            return self.gcp.artifact_registry.repositories.get(name)
        return self.topics.get(name) or self.subscriptions.get(name)

    def _missing(self, name: str) -> ApiError:
        if "/repositories/" in name:
            return artifactregistry.missing(name)
        if "/services/" in name:  # Cloud Run's own wording
            _, project, _, region, _, service = name.split("/")
            return ApiError(404, "NOT_FOUND", f"Resource '{service}' of kind 'SERVICE' in region '{region}' in project "
                            f"'{project}' does not exist.", "notFound")
        return self._pubsub_missing(name)

    def _get_policy(self, request, name, project, short=None, location=None):
        if self._resource(name) is None:
            raise self._missing(name)
        return self.policies.get(name) or {"etag": EMPTY_ETAG}

    def _set_policy(self, request, name, project, short=None, location=None):
        """iam v1 Policy, read-modify-write: an etag other than the current one is refused as IAM refuses it
        (cloud.google.com/iam/docs/policies#etag); each binding's role must exist and each member be one (a
        Google-managed service agent is named by its project's number: cloud.google.com/iam/docs/service-agents)."""
        if self._resource(name) is None:
            raise self._missing(name)
        policy = dict((request.body or {}).get("policy") or {})
        current = self.policies.get(name) or {"etag": EMPTY_ETAG}
        if policy.get("etag") not in (None, current["etag"]):
            raise ApiError(409, "ABORTED", "There were concurrent policy changes. Please retry the whole "
                           "read-modify-write with exponential backoff.", "aborted")
        number = self.gcp._project_number(project)
        for binding in policy.get("bindings", []):
            if binding.get("role") not in iam.role_permissions():
                raise invalid(f"Role {binding.get('role')} is not supported for this resource.")
            for member in binding.get("members") or []:
                agent = re.fullmatch(r"serviceAccount:service-(\d+)@gcp-sa-[a-z-]+\.iam\.gserviceaccount\.com", member)
                if agent and agent[1] != number or not re.fullmatch(
                        r"(user|serviceAccount|group|domain|principal|principalSet|deleted):.+|allUsers|"
                        r"allAuthenticatedUsers", member):
                    raise invalid(f"Service account {member.split(':', 1)[-1]} does not exist." if agent else
                                  f"Invalid member: {member}")
        self._serial += 1
        stored = {"version": policy.get("version", 1),
                  "etag": base64.b64encode(self._serial.to_bytes(8, "big")).decode()}
        if policy.get("bindings"):
            stored["bindings"] = policy["bindings"]
        self.policies[name] = stored
        return stored

    # -- Cloud Functions v2 ---------------------------------------------------------------------------------------
    def _get_function(self, request, name, project, location):
        if name not in self.gcp.functions:
            raise not_found_function(name)
        return self.gcp.functions[name]

    def _list_runtimes(self, request, project, location):
        return {"runtimes": [{"name": runtime, "displayName": runtime, "stage": "GA", "environment": "GEN_2"}
                             for runtime in RUNTIMES]}

    def _generate_upload_url(self, request, project, location):
        """A signed URL (GoogleAccessId, Expires, Signature) for a PUT of the source zip to a Google-owned bucket
        (here the fake's `UPLOAD` path): its expiry and signature are checked when it is used (`upload`)."""
        self._serial += 1
        bucket = f"gcf-v2-uploads-{self.gcp._project_number(project)}-{location}"
        blob = f"{hashlib.sha256(f'{project}/{self._serial}'.encode()).hexdigest()[:8]}-{self._serial}.zip"
        expires = int(time.time()) + UPLOAD_SECONDS
        signature = self._sign(bucket, blob, expires)
        url = f"{self.gcp._server.url}{UPLOAD}{bucket}/{blob}?GoogleAccessId=service-" \
              f"{self.gcp._project_number(project)}@gcf-admin-robot.iam.gserviceaccount.com&Expires={expires}" \
              f"&Signature={signature}"
        return {"uploadUrl": url, "storageSource": {"bucket": bucket, "object": blob}}

    def _sign(self, bucket: str, blob: str, expires: int) -> str:
        return hmac.new(self._secret, f"PUT\napplication/zip\n{expires}\n/{bucket}/{blob}".encode(),
                        hashlib.sha256).hexdigest()

    def upload(self, http, raw: bytes) -> None:
        """The PUT to a generateUploadUrl URL, as Cloud Storage's XML API answers it. The method's doc: "Source file
        type should be a zip file", "specify this header: content-type: application/zip", "Do not specify this
        header: Authorization" (the credentials' identity "does not have permissions to upload files to the
        URL"); a signed URL is refused once expired or altered (cloud.google.com/storage/docs/access-control/
        signed-urls)."""
        parts = urlsplit(http.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        bucket, _, blob = parts.path[len(UPLOAD):].partition("/")
        logged = Request(http.command, parts.path, query, None, 0, http.headers.get("User-Agent") or "", time.time(),
                         parts.query)
        with self.gcp._lock:
            self.gcp.requests.append(logged)
        logged.status = self._store_upload(http, raw, query, bucket, blob)

    def _store_upload(self, http, raw: bytes, query: dict, bucket: str, blob: str) -> int:
        expires = int(query.get("Expires", "0")) if query.get("Expires", "").isdigit() else 0
        if http.command != "PUT":
            return _xml(http, 405, "MethodNotAllowed", "The specified method is not allowed against this resource.")
        if http.headers.get("Authorization"):
            return _xml(http, 403, "AccessDenied", "Access denied: the signed URL is used with credentials whose "
                        "identity has no permission on the bucket.")
        if not hmac.compare_digest(query.get("Signature", ""), self._sign(bucket, blob, expires)) or \
                http.headers.get("Content-Type") != "application/zip":
            return _xml(http, 403, "SignatureDoesNotMatch", "The request signature we calculated does not match the "
                        "signature you provided (signed for PUT with Content-Type application/zip).")
        if expires < time.time():
            return _xml(http, 400, "ExpiredToken", "Invalid argument: the signed URL has expired.")
        try:
            zipfile.ZipFile(io.BytesIO(raw)).testzip()
        except zipfile.BadZipFile:
            return _xml(http, 400, "InvalidArgument", "The uploaded source is not a zip archive.")
        with self.gcp._lock:
            self.uploads[f"gs://{bucket}/{blob}"] = raw
        http.send_response(200)
        http.send_header("Content-Length", "0")
        http.end_headers()
        return 200

    def _create_function(self, request, project, location):
        function_id = request.query.get("functionId", "")
        if not _FUNCTION_ID.fullmatch(function_id):
            raise invalid(f"Invalid function id {function_id!r}: 4-63 characters of a-z, 0-9 and -.")
        name = f"projects/{project}/locations/{location}/functions/{function_id}"
        if name in self.gcp.functions:
            raise conflict(name)
        function = dict(json.loads(json.dumps(request.body or {})), name=name)
        self._check_function(request, project, function)
        self.gcp.functions[name] = function = self._fill(project, location, function_id, function)
        return self._deploying(function, "CREATE_FUNCTION", "create", request.body)

    def _patch_function(self, request, name, project, location):
        if name not in self.gcp.functions:
            raise not_found_function(name)
        if self._running(name):
            raise ApiError(409, "ABORTED", f"An operation on function {name} is already in progress. Please try "
                           "again later.", "aborted")
        mask = [path for path in (request.query.get("updateMask") or "").split(",") if path]
        updated = json.loads(json.dumps(self.gcp.functions[name]))
        for path in mask or list(request.body or {}):
            _apply(updated, request.body or {}, path)
        self._check_function(request, project, updated)
        updated["state"] = "DEPLOYING"
        self.gcp.functions[name] = updated
        return self._deploying(updated, "UPDATE_FUNCTION", "update", request.body)

    def _check_function(self, request, project: str, function: dict) -> None:
        build, service = function.get("buildConfig") or {}, function.get("serviceConfig") or {}
        if build.get("runtime") not in RUNTIMES:
            raise invalid(f"Runtime {build.get('runtime')!r} is not supported on 2nd gen: "
                          f"one of {', '.join(RUNTIMES)}.")
        storage = (build.get("source") or {}).get("storageSource") or {}
        if not storage:
            raise invalid("buildConfig.source: a function needs its source (storageSource from generateUploadUrl).")
        account = service.get("serviceAccountEmail") or \
            self.gcp.default_node_account(self.gcp._project_number(project))  # ServiceConfig's default
        self._act_as(request, project, account)
        if build.get("serviceAccount"):
            self._act_as(request, project, build["serviceAccount"].rsplit("/", 1)[-1])

    def _fill(self, project: str, location: str, function_id: str, function: dict) -> dict:
        """What Cloud Functions adds to a function it creates: its Cloud Run service, URLs and defaults."""
        number = self.gcp._project_number(project)
        service = function.setdefault("serviceConfig", {})
        service.setdefault("timeoutSeconds", 60)          # ServiceConfig.timeoutSeconds: "Defaults to 60 seconds."
        service.setdefault("availableMemory", "256M")     # ServiceConfig.availableMemory: "Defaults to 256M."
        service.setdefault("serviceAccountEmail", self.gcp.default_node_account(number))
        service.update(service=f"projects/{project}/locations/{location}/services/{function_id}",
                       uri=f"https://{function_id}-{number}.{location}.run.app", allTrafficOnLatestRevision=True)
        function.update(environment="GEN_2", state="DEPLOYING", createTime=_timestamp(), updateTime=_timestamp(),
                        url=f"https://{location}-{project}.cloudfunctions.net/{function_id}")
        return function

    def _running(self, name: str) -> bool:
        return any(not o.done and o.target == name for o in self.gcp._operations.values() if o.api == "cloudfunctions")

    def _deploying(self, function: dict, kind: str, verb: str, sent) -> dict:
        name = function["name"]
        project, location = name.split("/")[1], name.split("/")[3]

        def finish() -> dict:
            stored = self.gcp.functions[name]
            failure = self._build(stored)
            stored.update(state="FAILED" if failure else "ACTIVE", updateTime=_timestamp())
            if failure:
                raise OperationFailed(3, failure)
            revision = sum(1 for o in self.gcp._operations.values() if o.target == name and o.done)
            stored["serviceConfig"]["revision"] = f"{name.rsplit('/', 1)[-1]}-{revision:05d}-fake"
            return dict(stored, **{"@type": "type.googleapis.com/google.cloud.functions.v2.Function"})

        self._serial += 1
        operation = self.gcp._start(
            "cloudfunctions", kind, name, finish,
            name=f"projects/{project}/locations/{location}/operations/operation-{int(time.time() * 1000)}-"
                 f"{self._serial}")
        self._sent[operation.name] = (verb, sent)
        return self._operation_json(operation)

    def _build(self, function: dict) -> str | None:
        """Why the build or the first revision fails, if it does: the uploaded source must be there, a zip with
        main.py defining the entry point (BuildConfig.entryPoint: the function's id when unset, else "function"),
        as the Functions Framework loads it ("File main.py is expected to contain a function named ...":
        functions_framework/_function_registry.py)."""
        build = function["buildConfig"]
        storage = build["source"]["storageSource"]
        data = self.uploads.get(f"gs://{storage.get('bucket')}/{storage.get('object')}")
        if data is None:
            return f"Build failed: the source gs://{storage.get('bucket')}/{storage.get('object')} does not exist."
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if "main.py" not in archive.namelist():
                return "Build failed: missing main.py at the root of the source (Python runtimes load main.py)."
            tree = ast.parse(archive.read("main.py"))
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        target = build.get("entryPoint") or function["name"].rsplit("/", 1)[-1]
        if target not in defined and (build.get("entryPoint") or "function" not in defined):
            return (f"Could not create or update Cloud Run service {function['name'].rsplit('/', 1)[-1]}, Container "
                    f"Healthcheck failed. MissingTargetException: File /workspace/main.py is expected to contain a "
                    f"function named '{target}'.")
        return None

    def _operation_json(self, operation) -> dict:
        """google.longrunning.Operation with google.cloud.functions.v2.OperationMetadata: its stages are what
        gcloud's progress shows (BUILD, then SERVICE for an HTTP function)."""
        done, (verb, sent) = operation.done, self._sent[operation.name]
        stage = lambda name: {"name": name, "state": "COMPLETE" if done else  # noqa: E731
                              ("IN_PROGRESS" if name == "BUILD" else "NOT_STARTED")}
        metadata = {"@type": "type.googleapis.com/google.cloud.functions.v2.OperationMetadata",
                    "createTime": _timestamp(operation.started), "target": operation.target,
                    "verb": verb, "apiVersion": "v2", "operationType": operation.kind,
                    "stages": [stage("BUILD"), stage("SERVICE")]}
        if sent:
            metadata["requestResource"] = dict(sent, **{
                "@type": "type.googleapis.com/google.cloud.functions.v2.Function"})
        if done:
            metadata["endTime"] = _timestamp(operation.started + operation.seconds)
        return self.gcp._lro_json(operation, metadata)

    def _function_operation(self, request, project, location, op):
        return self._operation_json(self.gcp._operation(
            "cloudfunctions", f"projects/{project}/locations/{location}/operations/{op}"))

    # -- Cloud Scheduler v1 ---------------------------------------------------------------------------------------
    def _create_job(self, request, project, location):
        job = dict(request.body or {})
        parent = f"projects/{project}/locations/{location}"
        if not job.get("name", "").startswith(parent + "/jobs/") or \
                not _JOB_ID.fullmatch(job["name"][len(parent) + 6:]):
            raise invalid(f"Job name must be of the form {parent}/jobs/JOB_ID, JOB_ID of letters, numbers, hyphens "
                          f"or underscores (at most 500): {job.get('name')!r}")
        if job["name"] in self.gcp.scheduler_jobs:
            raise ApiError(409, "ALREADY_EXISTS", f"Job {job['name']} already exists.", "alreadyExists")
        if not job.get("schedule"):
            raise invalid("Job.schedule is required.")
        job = {"timeZone": "Etc/UTC", "retryConfig": {"maxRetryDuration": "0s", "minBackoffDuration": "5s",
                                                      "maxBackoffDuration": "3600s", "maxDoublings": 5},
               **job, "state": "ENABLED", "userUpdateTime": _timestamp()}
        self._check_job(project, job)
        self.gcp.scheduler_jobs[job["name"]] = job
        return job

    def _patch_job(self, request, project, location, short):
        name = f"projects/{project}/locations/{location}/jobs/{short}"
        if name not in self.gcp.scheduler_jobs:
            raise not_found(name)
        updated = json.loads(json.dumps(self.gcp.scheduler_jobs[name]))
        mask = [path for path in (request.query.get("updateMask") or "").split(",") if path]
        for path in mask or [key for key in (request.body or {}) if key != "name"]:
            _apply(updated, request.body or {}, path)
        updated["userUpdateTime"] = _timestamp()
        self._check_job(project, updated)
        self.gcp.scheduler_jobs[name] = updated
        return updated

    def _check_job(self, project: str, job: dict) -> None:
        target = job.get("pubsubTarget")
        if target is not None:
            if not re.fullmatch(rf"projects/{re.escape(project)}/topics/[^/]+", target.get("topicName") or ""):
                raise invalid(f"Invalid pubsubTarget.topicName {target.get('topicName')!r}: it must be "
                              f"projects/{project}/topics/TOPIC_ID, in the job's own project.")
            if not target.get("data") and not target.get("attributes"):
                raise invalid("Pubsub message must contain either non-empty data, or at least one attribute.")
        if len(job.get("schedule", "").split()) != 5 and not job.get("schedule", "").startswith("every "):
            raise invalid(f"Schedule has invalid format: {job.get('schedule')!r}.")

    # -- what gcloud reads on the side ------------------------------------------------------------------------
    def _get_project(self, request, project):
        """cloudresourcemanager v1 Project: gcloud reads the number (functions deploy, to compare the build
        account with the Compute Engine default)."""
        return {"projectNumber": self.gcp._project_number(project), "projectId": project, "name": project,
                "lifecycleState": "ACTIVE", "createTime": "2026-01-05T10:00:00.000Z"}

    def _get_service(self, request, project, service):
        """serviceusage v1 Service: every service is enabled but those in FakeGcp.disabled_services."""
        number = self.gcp._project_number(project)
        state = "DISABLED" if (project, service) in self.gcp.disabled_services else "ENABLED"
        return {"name": f"projects/{number}/services/{service}", "parent": f"projects/{number}", "state": state,
                "config": {"name": service}}


def not_found_function(name: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found", "notFound")


def _apply(into: dict, change: dict, path: str) -> None:
    """One field mask path (camelCase or snake_case, dotted) set from `change`, or cleared when `change` has it
    not (google.protobuf.FieldMask's update semantics)."""
    keys = [_camel(key) for key in path.split(".")]
    source, target = change, into
    for key in keys[:-1]:
        source = source.get(key) if isinstance(source, dict) else None
        target = target.setdefault(key, {})
    if isinstance(source, dict) and keys[-1] in source:
        target[keys[-1]] = json.loads(json.dumps(source[keys[-1]]))
    else:
        target.pop(keys[-1], None)


def _seconds(duration, field: str) -> int:
    found = _DURATION.fullmatch(str(duration))
    if found is None:
        raise invalid(f"Invalid value for {field}: {duration!r} is not a duration (google.protobuf.Duration: "
                      "seconds with an 's' suffix).")
    return int(found[1])


def _xml(http, status: int, code: str, message: str) -> int:
    payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message>"
               "</Error>").encode()
    http.send_response(status)
    http.send_header("Content-Type", "application/xml; charset=UTF-8")
    http.send_header("Content-Length", str(len(payload)))
    http.end_headers()
    http.wfile.write(payload)
    return status


class Elsewhere:
    """A proxy on 127.0.0.1 that refuses everything and notes what was asked of it (`asked`: a CONNECT's host or
    a proxied URL): gcloud sent through it reaches no host but the fake, and a test sees any it tried."""

    def __init__(self):
        asked = self.asked = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def refuse(self):
                asked.append(f"{self.command} {self.path}")
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_CONNECT = do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = refuse

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="elsewhere")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "Elsewhere":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def gcloud_environment(gcp, elsewhere: Elsewhere, config: Path, token_file: Path) -> dict[str, str]:
    """Environment variables that point the installed gcloud at `gcp` (its properties as CLOUDSDK_* variables),
    with a configuration directory of its own and the access token in `token_file`: every API deploy.yaml
    calls overridden (an override with a path is used as the API's base URL as it is, so it ends with "/"),
    no metadata-server probe, no update check, no usage report, no prompt; every other host through
    `elsewhere`, which refuses it."""
    base = gcp._server.url
    environ = {f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api.upper()}": f"{base}{prefix}" for api, prefix in PREFIXES.items()}
    proxies = {name: elsewhere.url for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    return {**environ, **proxies, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
            "CLOUDSDK_CONFIG": str(config), "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token_file),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true"}
