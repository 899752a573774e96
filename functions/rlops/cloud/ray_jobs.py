"""Ray's job API (ray.job_submission.JobSubmissionClient) on an environment's Ray head.

Submission is exactly-once by submission id: look the id up first, submit only when Ray does not
know it, and take Ray's answer to a duplicate POST (HTTP 500 "... already exists") as "already
submitted" — two deliveries of one message may race between the look-up and the POST.
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rlops.errors import Failure

if TYPE_CHECKING:
    from ray.job_submission import JobDetails

ACTIVE = ("PENDING", "RUNNING")  # Ray's job statuses before the job has ended


META_PREFIX = "rlops-"  # of the metadata keys rlops puts on a job it submits


class _Described(Protocol):
    """A job's metadata: Ray's `JobDetails`, or the `JobRequest` it was submitted from."""

    @property
    def metadata(self) -> Mapping[str, str] | None: ...


def described(job: _Described) -> dict[str, str] | None:
    """What rlops put in a job's metadata, without the prefix; None for a job rlops did not submit."""
    metadata = job.metadata or {}
    if META_PREFIX + "run" not in metadata:
        return None
    return {key[len(META_PREFIX):]: value for key, value in metadata.items() if key.startswith(META_PREFIX)}


def status_of(job: "JobDetails") -> str:
    """A listed job's status as text: Ray's JobDetails carry a JobStatus enum, the REST answers a string."""
    return str(getattr(job.status, "value", job.status))


class RayError(Failure):
    """Ray's head did not answer as asked (unreachable, or a node's logs gone with the node)."""


@dataclass(frozen=True)
class JobView:
    """What Ray says of one job rlops submitted, as the watcher reads it (times in ms since the epoch)."""

    submission_id: str
    status: str
    message: str = ""
    error_type: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    driver_node_id: str | None = None
    meta: dict = field(default_factory=dict)  # `described(job)`

    @classmethod
    def of(cls, job: "JobDetails") -> "JobView":
        # A job Ray ran without a submission (a driver's own) has no id; rlops's jobs always have one.
        return cls(job.submission_id or "", status_of(job), job.message or "", job.error_type, job.start_time,
                   job.end_time, job.driver_node_id, described(job) or {})


@dataclass(frozen=True)
class JobRequest:
    submission_id: str
    entrypoint: str
    metadata: dict[str, str]
    runtime_env: dict = field(default_factory=dict)
    entrypoint_num_cpus: float | None = None
    entrypoint_resources: dict[str, float] = field(default_factory=dict)


class RayJobs:
    def __init__(self, address: str, headers: dict[str, str] | None = None):
        from ray.job_submission import JobSubmissionClient  # noqa: PLC0415 cold start: Ray loads with a Ray head

        self.address, self.headers = address, headers or {}
        self.client = JobSubmissionClient(address, headers=headers)

    def find(self, submission_id: str) -> "JobDetails | None":
        """The job's details, or None when Ray does not know the id."""
        try:
            return self.client.get_job_info(submission_id)
        except RuntimeError as error:
            if "status code 404" in str(error):
                return None
            raise

    def submit_once(self, request: JobRequest) -> bool:
        """True if this call submitted the job; False if it was already there."""
        if self.find(request.submission_id) is not None:
            return False
        try:
            self.client.submit_job(entrypoint=request.entrypoint, submission_id=request.submission_id,
                                   metadata=request.metadata, runtime_env=request.runtime_env or None,
                                   entrypoint_num_cpus=request.entrypoint_num_cpus,
                                   entrypoint_resources=request.entrypoint_resources or None)
        except RuntimeError as error:
            if "already exists" in str(error):
                return False
            raise
        return True

    def all(self) -> "list[JobDetails]":
        return self.client.list_jobs()

    def logs(self, submission_id: str) -> str:
        return self.client.get_job_logs(submission_id)

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM, then SIGKILL after Ray's grace period; the job ends STOPPED a moment
        later); True if it was pending or running, False if it had already ended."""
        return self.client.stop_job(submission_id)

    def tail(self, submission_id: str, driver_node_id: str, lines: int) -> str:
        """The last `lines` lines of the job's output, read on the driver's node (the job API reads them all).

        `format=text`: Ray 2.33-2.44 put a status byte before each chunk unless asked not to; later
        versions always send text and ignore the parameter.
        """
        query = urllib.parse.urlencode({"submission_id": submission_id, "node_id": driver_node_id, "lines": lines,
                                        "format": "text"})
        request = urllib.request.Request(f"{self.address}/api/v0/logs/file?{query}", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as error:
            raise RayError(f"the last {lines} lines of {submission_id}: {error}") from error

    def nodes(self) -> list[dict]:
        return nodes(self.address, self.headers)


def nodes(dashboard: str, headers: dict[str, str] | None = None) -> list[dict]:
    """Every node the cluster has known, alive or dead: node_id, state, labels, start/end times, state_message."""
    request = urllib.request.Request(f"{dashboard}/api/v0/nodes?limit=1000&detail=1", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]["result"]["result"]


class JobsUnknown(RayError):
    """The Ray head did not say which jobs run; the message is what was answered instead."""


def active_jobs(dashboard: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> list[str]:
    """The ids of the jobs pending or running on a Ray head (Ray's GET /api/jobs/: a JSON list of jobs).

    Anything else raises `JobsUnknown` saying what came instead: not knowing is not "none". Through the API
    server's service proxy that is a 503 "no endpoints available for service" (no head pod the service may send
    to: not running, or failing its readiness probe behind a service that hides unready pods), a 503 "error
    trying to reach service" (the pod is there, its dashboard does not answer), a 404 (no head service), a
    timeout, a refused connection or a body that is not a list of jobs.
    """
    request = urllib.request.Request(f"{dashboard}/api/jobs/", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise JobsUnknown(f"{error.code} {_said(error.read())}") from error
    except (urllib.error.URLError, OSError) as error:  # timeouts included
        raise JobsUnknown(f"no answer: {getattr(error, 'reason', None) or error}") from error
    try:
        jobs = json.loads(body)
    except ValueError:
        jobs = None
    if not isinstance(jobs, list) or not all(isinstance(job, dict) for job in jobs):
        raise JobsUnknown(f"{response.status}, but not a list of jobs: {_said(body)}")
    return [str(job.get("submission_id") or job.get("job_id")) for job in jobs if job.get("status") in ACTIVE]


def _said(body: bytes) -> str:
    """An answer in one short line: a Kubernetes Status by its message, anything else by its first characters."""
    text = body.decode("utf-8", "replace")
    try:
        status = json.loads(text)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status" and status.get("message"):
        return status["message"]
    text = " ".join(text.split())
    return (text[:120] + "...") if len(text) > 120 else (text or "(an empty body)")


def alive_nodes(dashboard: str) -> list[dict]:
    return [node for node in nodes(dashboard) if node["state"] == "ALIVE"]
