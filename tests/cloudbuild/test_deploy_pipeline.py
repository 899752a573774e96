"""cloudbuild/deploy.yaml, its own scripts as Cloud Build runs them, with the installed gcloud calling the fake GCP
(tests/fakes/deploy_apis.py) as rlops-deploy holding exactly the roles `rlops iam` derives: the deploy works, twice
(create, then update), calls only what accounts.py declares, and without any one of those roles stops at the
first command that needs it, naming the permission. gcloud reaches no host but the fake.

gcloud takes about a second a command; the pipeline is some forty commands. So the two deploys run once for the
module (`deployed`), and a role's test runs only the step where the first deploy first needed that role, from
the state the first deploy had there.
"""

import io
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import google.auth.transport.requests
import pytest
import requests
from google.oauth2 import service_account

from conftest import REPO
from fakes import google_apis
from fakes.deploy_apis import Elsewhere, gcloud_environment
from fakes.gcp import FakeGcp
from fakes.iam import Iam
from least_privilege_support import PROJECT, Enforced, checked_roles
from pipelines_support import fill, load, scripts
from rlops.permissions import denied_permission, roles
from rlops.provision import accounts

pytestmark = [pytest.mark.servers,
              pytest.mark.skipif(shutil.which("gcloud") is None, reason="google-cloud-cli is not installed")]

REGION = "us-central1"
TARGETS = ("train", "watch", "snapshot", "reap")
BUILD = load("deploy.yaml")
STEPS = scripts(BUILD)  # every step is bash: `package` (python:3.11) and the gcloud steps (cloud-sdk)


class Pipeline:
    """A build workspace (the checkout's functions/, environments/ and requirements.lock), the fake GCP enforcing
    IAM, and the installed gcloud pointed at it, calling as rlops-deploy."""

    def __init__(self, gcp: FakeGcp, elsewhere: Elsewhere, folder: Path, patch: pytest.MonkeyPatch):
        self.gcp, self.folder, self.patch = gcp, folder, patch
        self.workspace = folder / "workspace"
        for name in ("functions", "environments"):
            shutil.copytree(REPO / name, self.workspace / name, ignore=shutil.ignore_patterns("__pycache__",
                                                                                              "*.egg-info"))
        shutil.copy(REPO / "requirements.lock", self.workspace)
        builtin = {"PROJECT_ID": PROJECT, "PROJECT_NUMBER": gcp._project_number(PROJECT), "LOCATION": REGION}
        # dynamicSubstitutions: _REGION is the trigger's $LOCATION
        self.values = builtin | {key: fill(str(value), builtin) for key, value in BUILD["substitutions"].items()}
        self.environ = {**os.environ, **gcloud_environment(gcp, elsewhere, folder / "gcloud", folder / "token")}

    def act_as_deploy(self, without: str | None = None) -> str:
        """A fresh IAM policy in which rlops-deploy holds its roles (but `without`), and gcloud's access token: one
        the fake's OAuth endpoint minted for the account's key file, as google-auth gets it."""
        self.gcp.iam = Iam(PROJECT)
        member = Enforced(self.gcp, self.gcp.iam, self.folder, self.patch).act_as("deploy", without)
        credentials = service_account.Credentials.from_service_account_file(
            os.environ["GOOGLE_APPLICATION_CREDENTIALS"], scopes=["https://www.googleapis.com/auth/cloud-platform"])
        credentials.refresh(google.auth.transport.requests.Request())
        (self.folder / "token").write_text(credentials.token)
        return member

    def step(self, step: str) -> subprocess.CompletedProcess:
        """One step's script, its substitutions filled in and `$$` made `$` as Cloud Build does, run by bash -ec."""
        return subprocess.run(["bash", "-ec", fill(STEPS[step], self.values)], cwd=self.workspace, env=self.environ,
                              capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


class Deployed:
    """What the two deploys left and did: the state before each step of the first and after each deploy, the
    requests and permission checks of each step."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.before: dict[str, tuple] = {}             # step -> the fake's deploy state as the first deploy met it
        self.checked: dict[str, set[str]] = {}          # step -> permissions checked in the first deploy
        self.after: list[tuple] = []                    # the state after each deploy
        self.requests: list[list] = []                  # each deploy's requests
        self.permissions: set[str] = set()              # checked in either

    def run(self, first: bool) -> None:
        gcp = self.pipeline.gcp
        start = len(gcp.requests)
        for step in STEPS:
            seen = len(gcp.iam.checked)
            if first:
                self.before[step] = gcp.deploy_apis.state()
            done = self.pipeline.step(step)
            assert done.returncode == 0, (step, done.stderr[-3000:])
            if first:
                self.checked[step] = {permission for _, permission, _ in gcp.iam.checked[seen:]}
        self.permissions |= {permission for _, permission, _ in gcp.iam.checked}
        self.after.append(gcp.deploy_apis.state())
        self.requests.append(list(gcp.requests[start:]))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    with FakeGcp(operation_seconds=0.05) as gcp, Elsewhere() as elsewhere, pytest.MonkeyPatch.context() as patch:
        pipeline = Pipeline(gcp, elsewhere, tmp_path_factory.mktemp("deploy"), patch)
        pipeline.act_as_deploy()
        world = Deployed(pipeline)
        world.run(first=True)
        world.run(first=False)
        world.elsewhere = list(elsewhere.asked)
        yield world
        gcp.iam = None


def functions_of(state: tuple) -> dict[str, dict]:
    return {name.rsplit("/", 1)[-1]: function for name, function in state[0].items()}


def test_the_deploy_as_rlops_deploy_leaves_the_functions_topics_subscriptions_and_schedule(deployed):
    functions, jobs, topics, subscriptions, policies, uploads = deployed.after[0]
    number = deployed.pipeline.values["PROJECT_NUMBER"]
    found = functions_of(deployed.after[0])
    assert sorted(found) == sorted(f"rlops-{target}" for target in TARGETS)
    for target in TARGETS:
        function = found[f"rlops-{target}"]
        assert function["state"] == "ACTIVE" and function["environment"] == "GEN_2"
        assert function["buildConfig"]["entryPoint"] == target and function["buildConfig"]["runtime"] == "python311"
        assert function["buildConfig"]["serviceAccount"].endswith(
            f"/rlops-function-build@{PROJECT}.iam.gserviceaccount.com")
        service = function["serviceConfig"]
        assert service["serviceAccountEmail"] == f"rlops-{target}@{PROJECT}.iam.gserviceaccount.com"
        assert service["environmentVariables"] == {"RLOPS_ENVIRONMENTS": "environments", "RLOPS_PROJECT": PROJECT}
        assert (service["availableMemory"], service["timeoutSeconds"]) == ("1Gi", 540)
        # only the push subscriptions' identity may call it: roles/run.invoker on its Cloud Run service, no one else
        assert policies[service["service"]]["bindings"] == [
            {"members": [f"serviceAccount:rlops-push@{PROJECT}.iam.gserviceaccount.com"], "role": "roles/run.invoker"}]
        source = function["buildConfig"]["source"]["storageSource"]
        with zipfile.ZipFile(io.BytesIO(uploads[f"gs://{source['bucket']}/{source['object']}"])) as zipped:
            shipped = set(zipped.namelist())
        # the package step's: the pinned closure as requirements.txt, and the specs beside main.py
        assert {"main.py", "requirements.txt", "environments/h200.yaml", "rlops/__init__.py"} <= shipped
    assert sorted(topics) == sorted(f"projects/{PROJECT}/topics/rlops-{name}"
                                    for name in ("train", "events", "tick", "dead-letter"))
    agent = f"serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com"
    dead_letter = f"projects/{PROJECT}/topics/rlops-dead-letter"
    assert policies[dead_letter]["bindings"] == [{"members": [agent], "role": "roles/pubsub.publisher"}]
    kept = subscriptions[f"projects/{PROJECT}/subscriptions/rlops-dead-letter"]
    assert kept["topic"] == dead_letter and kept["messageRetentionDuration"] == "604800s"
    for target, topic in (("train", "train"), ("watch", "tick"), ("snapshot", "tick"), ("reap", "tick")):
        name = f"projects/{PROJECT}/subscriptions/rlops-{target}"
        subscription = subscriptions[name]
        assert subscription["topic"] == f"projects/{PROJECT}/topics/rlops-{topic}"
        assert subscription["pushConfig"] == {
            "pushEndpoint": found[f"rlops-{target}"]["serviceConfig"]["uri"],
            "oidcToken": {"serviceAccountEmail": f"rlops-push@{PROJECT}.iam.gserviceaccount.com"}}
        assert subscription["ackDeadlineSeconds"] == 600
        assert subscription["deadLetterPolicy"] == {"deadLetterTopic": dead_letter, "maxDeliveryAttempts": 5}
        assert subscription["retryPolicy"] == {"minimumBackoff": "10s", "maximumBackoff": "600s"}
        assert policies[name]["bindings"] == [{"members": [agent], "role": "roles/pubsub.subscriber"}]
    job = jobs[f"projects/{PROJECT}/locations/{REGION}/jobs/rlops-tick"]
    assert (job["schedule"], job["state"], job["pubsubTarget"]) == (
        "* * * * *", "ENABLED", {"topicName": f"projects/{PROJECT}/topics/rlops-tick", "data": "e30="})


def test_a_second_deploy_updates_in_place_and_leaves_the_same(deployed):
    first, second = deployed.after
    verbs = {(r.method, google_apis.method_id(r.method, r.path)) for r in deployed.requests[1]}
    assert not {method for _, method in verbs if method and method.endswith(".create")}, verbs
    assert {("PATCH", "cloudfunctions.projects.locations.functions.patch"),
            ("PATCH", "pubsub.projects.subscriptions.patch"),
            ("PATCH", "cloudscheduler.projects.locations.jobs.patch")} <= verbs
    for name, function in functions_of(second).items():
        assert function["state"] == "ACTIVE"
        assert function["serviceConfig"]["revision"] != functions_of(first)[name]["serviceConfig"]["revision"]
        assert function["buildConfig"]["source"] != functions_of(first)[name]["buildConfig"]["source"]  # uploaded anew
    assert _timeless(second[1:5]) == _timeless(first[1:5])  # the jobs, topics, subscriptions and policies
    policies = second[4]
    assert all("bindings" in policy and len(policy["bindings"]) == 1 for policy in policies.values())


def _timeless(value):
    """`value` without the times and etags a write changes (an update writes the same otherwise)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("Time") and k != "etag"}
    return [_timeless(v) for v in value] if isinstance(value, list | tuple) else value


def test_the_deploy_calls_only_what_accounts_py_declares_and_nothing_off_the_machine(deployed):
    declared = {need.permission for need in accounts.account("deploy").needs()}
    assert deployed.permissions and deployed.permissions <= declared, deployed.permissions - declared
    called = {google_apis.method_id(r.method, r.path) for run in deployed.requests for r in run}
    uploads = [r for run in deployed.requests for r in run if r.path.startswith("/upload/")]
    assert len(uploads) == 2 * len(TARGETS) and all(r.status == 200 for r in uploads)
    assert called - {None} == set(accounts.DEPLOY_METHODS), (called ^ set(accounts.DEPLOY_METHODS)) - {None}
    assert deployed.elsewhere == []


def test_what_the_fake_plants_as_a_deploy_is_what_the_real_one_leaves(deployed):
    """FakeGcp.deploy(), which the doctor's tests use, against what the pipeline made: the fields the doctor
    reads."""
    planted = FakeGcp()
    planted.deploy(PROJECT, REGION)
    real = deployed.after[0]
    assert planted.functions.keys() == real[0].keys() and planted.scheduler_jobs.keys() == real[1].keys()
    for name, function in planted.functions.items():
        for path in (("state",), ("environment",), ("serviceConfig", "uri"), ("serviceConfig", "serviceAccountEmail"),
                     ("buildConfig", "entryPoint"), ("buildConfig", "runtime")):
            assert _at(function, path) == _at(real[0][name], path), (name, path)
    for name, job in planted.scheduler_jobs.items():
        assert {k: job[k] for k in ("schedule", "state", "pubsubTarget", "timeZone")} == \
            {k: real[1][name][k] for k in ("schedule", "state", "pubsubTarget", "timeZone")}


def _at(value: dict, path: tuple):
    for key in path:
        value = value[key]
    return value


def exclusive(role: str) -> set[str]:
    """What deploy needs that this role grants and none of its other roles does."""
    grants = accounts.account("deploy").grants()
    mine = next(g for g in grants if g.role == role)
    return {p for p in mine.permissions if not any(p in roles()[g.role].permissions for g in grants if g.role != role)}


@pytest.mark.parametrize("role", checked_roles("deploy"))
def test_without_any_one_of_its_roles_the_deploy_stops_at_the_first_command_that_needs_it(deployed, role):
    needed = exclusive(role)
    step = next((step for step in STEPS if deployed.checked[step] & needed), None)
    assert step is not None, f"{role}: the deploy never needed {sorted(needed)}"
    pipeline = deployed.pipeline
    gcp = pipeline.gcp
    gcp.deploy_apis.restore(deployed.before[step])
    try:
        pipeline.act_as_deploy(without=role)
        start = len(gcp.requests)
        done = pipeline.step(step)
    finally:
        pipeline.act_as_deploy()
    assert done.returncode != 0
    # the step stopped at the refusal: its last request is the one the fake refused (403 PERMISSION_DENIED)
    assert gcp.requests[-1].status == 403 and len(gcp.requests) > start, done.stderr[-2000:]
    said = done.stderr[done.stderr.find("ERROR:"):]  # gcloud's words for it (each command group has its own)
    assert denied_permission(said) in needed, (role, said)


def test_a_signed_upload_url_takes_one_zip_put_without_credentials():
    """generateUploadUrl's rules (its doc): a zip, content-type application/zip, no Authorization; the URL as
    signed."""
    with FakeGcp() as gcp:
        url = f"{gcp._server.url}/cf/v2/projects/{PROJECT}/locations/{REGION}/functions:generateUploadUrl"
        answer = requests.post(url, json={}, timeout=10).json()
        upload, zipped = answer["uploadUrl"], _zip({"main.py": "def train(event):\n    pass\n"})
        headers = {"Content-Type": "application/zip"}
        assert requests.put(upload, data=zipped, headers={**headers, "Authorization": "Bearer x"}, timeout=10) \
            .status_code == 403
        assert requests.put(upload, data=zipped, headers={"Content-Type": "application/octet-stream"}, timeout=10) \
            .status_code == 403
        assert requests.put(upload.replace("Expires=", "Expires=1"), data=zipped, headers=headers, timeout=10) \
            .status_code == 403
        assert requests.put(upload, data=b"not a zip", headers=headers, timeout=10).status_code == 400
        assert requests.put(upload, data=zipped, headers=headers, timeout=10).status_code == 200
        storage = answer["storageSource"]
        assert gcp.deploy_apis.uploads[f"gs://{storage['bucket']}/{storage['object']}"] == zipped


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def test_the_deploy_apis_refuse_what_google_refuses():
    """The rules deploy_apis enforces, each as its API answers a request that breaks it."""
    with FakeGcp(operation_seconds=0) as gcp:
        base = gcp._server.url

        def call(method: str, path: str, body=None, **query) -> requests.Response:
            return requests.request(method, f"{base}{path}", json=body, params=query, timeout=10)

        topics, subscriptions = f"/pubsub/v1/projects/{PROJECT}/topics", f"/pubsub/v1/projects/{PROJECT}/subscriptions"
        assert call("PUT", f"{topics}/goog-x", {"name": f"projects/{PROJECT}/topics/goog-x"}).status_code == 400
        assert call("PUT", f"{topics}/topic1", {"name": f"projects/{PROJECT}/topics/topic1"}).status_code == 200
        assert call("PUT", f"{topics}/topic1", {"name": f"projects/{PROJECT}/topics/topic1"}).status_code == 409
        subscription = {"name": f"projects/{PROJECT}/subscriptions/sub1", "topic": f"projects/{PROJECT}/topics/topic1"}
        for wrong, code in (({"ackDeadlineSeconds": 601}, 400), ({"messageRetentionDuration": "60s"}, 400),
                            ({"deadLetterPolicy": {"deadLetterTopic": f"projects/{PROJECT}/topics/none"}}, 404),
                            ({"deadLetterPolicy": {"deadLetterTopic": f"projects/{PROJECT}/topics/topic1",
                                                   "maxDeliveryAttempts": 4}}, 400),
                            ({"retryPolicy": {"minimumBackoff": "700s"}}, 400),
                            ({"pushConfig": {"pushEndpoint": "http://example.com/"}}, 400),
                            ({"topic": f"projects/{PROJECT}/topics/none"}, 404)):
            assert call("PUT", f"{subscriptions}/sub1", {**subscription, **wrong}).status_code == code, wrong
        assert call("PUT", f"{subscriptions}/sub1", subscription).status_code == 200
        assert call("PATCH", f"{subscriptions}/sub1",
                    {"subscription": subscription, "updateMask": ""}).status_code == 400
        policy = call("GET", f"{topics}/topic1:getIamPolicy").json()
        binding = {"role": "roles/pubsub.publisher",
                   "members": ["serviceAccount:service-1@gcp-sa-pubsub.iam.gserviceaccount.com"]}
        # Not this project's service agent.
        assert call("POST", f"{topics}/topic1:setIamPolicy",
                    {"policy": {**policy, "bindings": [binding]}}).status_code == 400
        number = gcp._project_number(PROJECT)
        binding["members"] = [f"serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com"]
        assert call("POST", f"{topics}/topic1:setIamPolicy",
                    {"policy": {**policy, "bindings": [binding]}}).status_code == 200
        assert call("POST", f"{topics}/topic1:setIamPolicy", {"policy": {**policy, "bindings": []}}).status_code == 409
        jobs = f"/cs/v1/projects/{PROJECT}/locations/{REGION}/jobs"
        job = {"name": f"projects/{PROJECT}/locations/{REGION}/jobs/tick", "schedule": "* * * * *",
               "pubsubTarget": {"topicName": "projects/other/topics/topic1", "data": "e30="}}
        assert call("POST", jobs, job).status_code == 400  # the topic must be in the job's project
        # a function whose source has no entry point of that name: its operation fails, the function FAILED
        upload = call("POST", f"/cf/v2/projects/{PROJECT}/locations/{REGION}/functions:generateUploadUrl", {}).json()
        requests.put(upload["uploadUrl"], data=_zip({"main.py": "def other(event):\n    pass\n"}),
                     headers={"Content-Type": "application/zip"}, timeout=10).raise_for_status()
        function = {"buildConfig": {"runtime": "python311", "entryPoint": "train",
                                    "source": {"storageSource": upload["storageSource"]}}}
        operation = call("POST", f"/cf/v2/projects/{PROJECT}/locations/{REGION}/functions", function,
                         functionId="rlops-train").json()
        done = call("GET", f"/cf/v2/{operation['name']}").json()
        assert done["done"] and "is expected to contain a function named 'train'" in done["error"]["message"]
        assert gcp.functions[f"projects/{PROJECT}/locations/{REGION}/functions/rlops-train"]["state"] == "FAILED"
