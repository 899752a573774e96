"""Each rlops service account, with exactly the roles `rlops iam` derives (docs/iam.md's table), against fakes
that enforce Google's IAM (tests/fakes/iam.py, tests/fakes/gcs_iam.py): what it does works, and without any
one of its roles the first call that needs it fails naming the permission and the role, with nothing changed.
"""

import copy
import json
import re
import shutil
import time
from pathlib import Path, PurePosixPath

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from fakes.iam import Iam
from fakes.ray import Clock, SimulatedRay
from least_privilege_support import PROJECT, Enforced, checked_roles
from rlops import cli, sites
from rlops.checkpoints import manifest
from rlops.cloud import base, compute
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.kube.gke_cluster import GkeCluster
from rlops.permissions import roles
from rlops.provision import accounts
from rlops.provision.service import target_of
from rlops.reaper import reap
from rlops.runs import checkpoint_transfers, message, train, watch
from rlops.state.bucket import of_environment, write_json
from rlops.state.pool import PoolStatus

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def enforced(cloud_fakes, gcs, specs, tmp_path, monkeypatch):
    """A fresh fake cloud, nothing applied, enforcing IAM; the gate given back after. (The module's applied world,
    `applied`, keeps its own fakes: each test names its policy.)"""
    gcp, kube = cloud_fakes
    gate = gcs.gate
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.05))
    gcp.iam = gate.iam = kube.iam = Iam(PROJECT)
    try:
        yield Enforced(gcp, gcp.iam, tmp_path, monkeypatch)
    finally:
        gate.iam = None


def test_the_docs_table_is_what_rlops_iam_derives():
    """The table moved from the README to docs/iam.md (issue 39, 6), which the README links."""
    table = (REPO / "docs" / "iam.md").read_text()
    assert accounts.render("markdown") in table
    assert "(docs/iam.md)" in (REPO / "README.md").read_text()


def test_rlops_iam_for_an_environment_names_where_each_role_is_granted(capsys):
    assert cli.main(["iam", "h200", "--format", "json"]) == 0
    apply = next(a for a in json.loads(capsys.readouterr().out) if a["key"] == "apply")
    where = {g["role"]: g["where"] for g in apply["grants"]}
    assert where["roles/storage.objectUser"] == "on gs://rlops-h200-example-state"
    assert "projects/rlops-h200-example/secrets/hf-token" in where["roles/secretmanager.secretAccessor"]
    assert where["roles/compute.networkAdmin"] == "project"


def test_apply_works_as_rlops_apply_with_its_roles_and_calls_only_what_it_declares(enforced, capsys):
    member = enforced.act_as("apply")
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    declared = {n.permission for n in accounts.account("apply").needs()}
    used = {permission for caller, permission, _ in enforced.iam.checked if caller == member}
    assert used and used - LIBRARIES_TRY <= declared, used - declared


# Asked by the client libraries on their own and let go when refused: google-cloud-storage reads a bucket's
# metadata in the background for its cache (google/cloud/storage/_bucket_metadata_cache.py).
LIBRARIES_TRY = {"storage.buckets.get"}


@pytest.mark.parametrize("role", [g.role for g in accounts.account("apply").grants()])
def test_without_any_one_of_its_roles_apply_stops_before_its_first_change_naming_what_is_missing(
        enforced, capsys, role):
    enforced.act_as("apply", without=role)
    assert cli.main(["apply", "--yes", "h200"]) == 1
    said = capsys.readouterr().err
    lacking = set(re.findall(r"([a-z]+(?:\.[A-Za-z]+)+) \(in (roles/[\w.]+)", said))
    assert lacking, said
    assert all(permission in roles()[granted].permissions for permission, granted in lacking)
    assert any(granted == role for _, granted in lacking) or all(
        permission in roles()[role].permissions for permission, _ in lacking), said
    assert enforced.gcp.mutations() == [], "apply changed something"


# -- the functions' accounts, on a GKE site as the functions open it ----------------------------------------------
# Ray is simulated (its jobs are not IAM's business: the Ray head is reached through the API server, whose GKE IAM
# permissions `rlops iam` declares but tests/fakes/kube.py does not check); everything on Google's side is real.

class Functions:
    """h200 applied as rlops-apply; `site(key)` opens it as the functions do, calling as account `key`."""

    def __init__(self, enforced: Enforced):
        self.enforced, self.clock = enforced, Clock(time.time())
        self.ray, self.events = SimulatedRay(self.clock), []

    def site(self, key: str, without: str | None = None):
        self.member = self.enforced.act_as(key, without)
        endpoints = Endpoints.from_environment()
        env = sites.load_environment("h200")
        cluster = GkeCluster(target_of("h200", env), env, endpoints)
        lustre_root, resources = sites.placement(env)
        self.cluster = cluster
        return sites.Site("h200", env, endpoints, self.ray, of_environment(env, endpoints), self.events.append,
                          cluster.scale, cluster.waiting, lustre_root, resources, checkpoints_here=False)

    def mine(self, suffix: str) -> list:
        return [r for r in self.enforced.gcp.mutations() if r.caller == self.member and r.path.endswith(suffix)]


class Applied:
    """h200 applied once for the module, as rlops-apply (with `idle.scale_reserved`: a reaped pool to wake), and
    what it left: each test starts from exactly that (`restore`), with a fresh IAM policy."""

    def __init__(self, gcp, kube, gate, upstream: str):
        self.gcp, self.kube, self.gate = gcp, kube, gate
        self.bucket = storage.Client(project="tests", credentials=AnonymousCredentials(),
                                     client_options={"api_endpoint": upstream}).bucket("rlops-h200-example-state")
        self.policy()

    def policy(self) -> Iam:
        self.gcp.iam = self.gate.iam = self.kube.iam = Iam(PROJECT)
        return self.gcp.iam

    def keep(self) -> None:
        self.cloud = copy.deepcopy((self.gcp._store, self.gcp.functions, self.gcp.scheduler_jobs))
        self.objects = copy.deepcopy((self.kube.objects, self.kube.owners))
        self.state = {blob.name: blob.download_as_bytes() for blob in self.bucket.list_blobs()}

    def restore(self) -> Iam:
        with self.gcp._lock:
            self.gcp._store, self.gcp.functions, self.gcp.scheduler_jobs = copy.deepcopy(self.cloud)
            self.gcp.requests.clear()
        with self.kube._lock:
            self.kube.objects, self.kube.owners = copy.deepcopy(self.objects)
        for blob in list(self.bucket.list_blobs()):
            blob.delete()
        for name, data in self.state.items():
            self.bucket.blob(name).upload_from_string(data)
        shutil.rmtree(self.gcp.lustre_files("rl-lustre"))
        return self.policy()


@pytest.fixture(scope="module")
def applied(gcs, tmp_path_factory):
    from conftest import PLANTED_TOKENS
    from fakes.gcp import FakeGcp
    from fakes.kube import FakeKube

    folder = tmp_path_factory.mktemp("applied")
    shutil.copytree(REPO / "environments", folder / "environments")
    spec = folder / "environments" / "h200.yaml"
    spec.write_text(spec.read_text().replace("  scale_down: [ray-workers, node-pools]\n",
                                             "  scale_down: [ray-workers, node-pools]\n  scale_reserved: true\n", 1))
    with FakeGcp(operation_seconds=0.1, storage_endpoint=gcs.url) as gcp, FakeKube(controller_delay=0.05) as kube:
        for secret, value in PLANTED_TOKENS.items():
            gcp.put_secret(f"projects/{PROJECT}/secrets/{secret}/versions/latest", value)
        gcp.put_reservation(PROJECT, "us-central1-b", "h200-reservation", "a3-ultragpu-8g", "nvidia-h200-141gb", 8,
                            count=4)
        world = Applied(gcp, kube, gcs.gate, gcs.url)
        world.environ = {"RLOPS_API_ENDPOINTS": json.dumps(gcp.endpoints), "RLOPS_KUBE_API": kube.url,
                         "RLOPS_ENVIRONMENTS": str(folder / "environments")}
        stale = world.bucket.client.lookup_bucket(world.bucket.name) or world.bucket.client.create_bucket(
            world.bucket.name)
        for blob in list(stale.list_blobs()):
            blob.delete()
        with pytest.MonkeyPatch.context() as patch:  # as long as the apply lasts: the module's other tests have theirs
            for name, value in world.environ.items():
                patch.setenv(name, value)
            patch.setattr(base, "RETRY", base.RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.05))
            Enforced(gcp, gcp.iam, folder, patch).act_as("apply")
            try:
                assert cli.main(["apply", "--yes", "h200"]) == 0
            finally:
                gcs.gate.iam = None  # the session's state bucket: enforcing only while a test of this world runs
        world.keep()
        yield world


@pytest.fixture
def functions(applied, tmp_path, monkeypatch):
    for name, value in applied.environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.05))
    iam = applied.restore()
    try:
        yield Functions(Enforced(applied.gcp, iam, tmp_path, monkeypatch))
    finally:
        applied.gate.iam = None


def reaped(site) -> None:
    """The pool as the reaper leaves it: scaled down, long idle."""
    long_ago = time.time() - 7 * 24 * 3600
    assert site.pool.write(PoolStatus(scaled_down=True, since=long_ago, created_at=long_ago), 0)


def train_message(site, run: str):
    request = message.parse(json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": run,
                                        "overrides": {}, "requested_by": "tests"}).encode())
    return request, message.settings(request, message.recipe_of(request, site.env))


def lacking_in(error: Exception) -> set[tuple[str, str]]:
    return set(re.findall(r"([a-z]+(?:\.[A-Za-z]+)+) \(in (roles/[\w.]+)", str(error)))


def test_train_wakes_a_reaped_pool_as_rlops_train(functions):
    site = functions.site("train")
    reaped(site)
    assert train.accept(site, *train_message(site, "woken")) == "submitted"
    assert functions.mine(":setSize"), "the wake resized the GPU pool"
    assert not site.pool.read()[0].scaled_down and site.records.get("woken")[0] is not None


@pytest.mark.parametrize("role", checked_roles("train"))
def test_train_without_any_one_of_its_roles_fails_naming_it_and_submits_nothing(functions, role):
    site = functions.site("train")
    reaped(site)  # as the reaper, whose account may
    site = functions.site("train", without=role)
    with pytest.raises(Failure) as failed:
        train.accept(site, *train_message(site, "woken"))
    assert any(permission in roles()[role].permissions for permission, _ in lacking_in(failed.value)), failed.value
    assert functions.ray.jobs == {}


def test_reap_scales_an_idle_pool_down_as_rlops_reap(functions):
    site = functions.site("reap")
    long_ago = time.time() - 7 * 24 * 3600
    assert site.pool.write(PoolStatus(created_at=long_ago, transitions=((long_ago, "up"),)), 0)
    decision, actions = reap.reap(site)
    assert decision.scale_down and functions.mine(":setSize"), (decision, actions)
    assert site.pool.read()[0].scaled_down


@pytest.mark.parametrize("role", checked_roles("reap"))
def test_reap_without_any_one_of_its_roles_fails_naming_it(functions, role):
    site = functions.site("reap")
    long_ago = time.time() - 7 * 24 * 3600
    assert site.pool.write(PoolStatus(created_at=long_ago, transitions=((long_ago, "up"),)), 0)
    site = functions.site("reap", without=role)
    with pytest.raises(Failure) as failed:
        reap.reap(site)
    assert any(permission in roles()[role].permissions for permission, _ in lacking_in(failed.value)), failed.value


def test_watch_follows_a_run_and_says_why_its_workers_wait_as_rlops_watch(functions):
    site = functions.site("train")
    assert train.accept(site, *train_message(site, "watched")) == "submitted"
    site = functions.site("watch")
    functions.ray.script("rlops.h200.watched.1", 0, [(10, 1)], 3600, "RUNNING")
    watch.tick(site)
    assert site.records.get("watched")[0].state in ("PENDING", "RUNNING")
    cluster = functions.cluster
    assert cluster.node_pools.problems(["gpu-pool"]) == {}
    assert compute.reservation(cluster.connection, PROJECT, "us-central1-b", "h200-reservation") is not None


@pytest.mark.parametrize("role", checked_roles("watch"))
def test_watch_without_any_one_of_its_roles_fails_naming_it(functions, role):
    site = functions.site("train")
    assert train.accept(site, *train_message(site, "watched")) == "submitted"
    functions.ray.script("rlops.h200.watched.1", 0, [(10, 1)], 3600, "RUNNING")
    site = functions.site("watch", without=role)
    cluster = functions.cluster
    with pytest.raises(Failure) as failed:
        watch.tick(site)
        cluster.waiting(False)
        cluster.node_pools.problems(["gpu-pool"])
        compute.reservation(cluster.connection, PROJECT, "us-central1-b", "h200-reservation")
    assert any(permission in roles()[role].permissions for permission, _ in lacking_in(failed.value)), failed.value


def checkpoint_of(functions, site, run: str, step: int) -> None:
    """A complete NeMo RL checkpoint of `run` on the Lustre instance, and its manifest in the state bucket, as the
    snapshot's hashing job leaves them."""
    record = site.records.get(run)[0]
    root = functions.enforced.gcp.lustre_files("rl-lustre")
    folder = root / PurePosixPath(record.checkpoint_dir).relative_to(site.env.ray.lustre_mount) / f"step_{step}"
    (folder / "policy").mkdir(parents=True)
    for name, data in {"training_info.json": b'{"step": 2}', "config.yaml": b"a: 1\n", "train_dataloader.pt": b"dl",
                       "policy/weights.bin": b"\0" * 4096}.items():
        (folder / name).write_bytes(data)
    content = manifest.build(folder, run)
    write_json(site.bucket.blob(site.records.layout.manifest(run, step)), content, 0)


@pytest.fixture
def exportable(functions, monkeypatch):
    monkeypatch.setattr(checkpoint_transfers, "POLL_SECONDS", 0.05)
    site = functions.site("train")
    assert train.accept(site, *train_message(site, "exported")) == "submitted"
    checkpoint_of(functions, site, "exported", 2)
    gcp = functions.enforced.gcp
    gcp.iam.grant(gcp.lustre_agent(PROJECT), "roles/storage.objectUser", on=f"projects/_/buckets/{site.bucket.name}")
    return functions


def test_snapshot_exports_a_checkpoint_with_lustres_exportdata_as_rlops_snapshot(exportable):
    site = exportable.site("snapshot")
    event = checkpoint_transfers.export_checkpoint(site, "exported", None, None)
    assert event["type"] == "checkpoint-exported" and event["objects"] == 4
    assert exportable.mine(":exportData")


# The snapshot's hashing job reaches Ray through the API server (container.developer's services.proxy); Ray is
# simulated here, so that role is shown needed by the train, watch and reap tests' use of the same API server.
@pytest.mark.parametrize("role", [r for r in checked_roles("snapshot") if r != "roles/container.developer"])
def test_snapshot_without_any_one_of_its_roles_fails_naming_it(exportable, role):
    site = exportable.site("snapshot", without=role)
    with pytest.raises(Failure) as failed:
        checkpoint_transfers.export_checkpoint(site, "exported", None, None)
    assert any(permission in roles()[role].permissions for permission, _ in lacking_in(failed.value)), failed.value


def test_an_export_fails_naming_what_lustres_service_agent_lacks_on_the_bucket(exportable):
    gcp = exportable.enforced.gcp
    gcp.iam.forget(gcp.lustre_agent(PROJECT))
    site = exportable.site("snapshot")
    with pytest.raises(Failure) as failed:
        checkpoint_transfers.export_checkpoint(site, "exported", None, None)
    assert "gcp-sa-lustre.iam.gserviceaccount.com" in str(failed.value)
    assert any(p == "storage.objects.create" for p, _ in lacking_in(failed.value)), failed.value


# -- the plan pipeline's account ------------------------------------------------------------------------------------

def test_plan_offline_and_live_with_the_doctors_table_work_as_rlops_plan(functions, capsys):
    enforced = functions.enforced
    enforced.act_as("plan")
    assert cli.main(["plan", "h200", "--offline"]) == 0
    enforced.act_as("plan-live")
    capsys.readouterr()
    assert cli.main(["plan", "h200"]) == 0, capsys.readouterr().err
    assert cli.main(["doctor", "h200", "--as", "none", "--format", "markdown"]) == 0, capsys.readouterr()


# The GitHub token reaches the plan pipeline through Cloud Build's availableSecrets, as rlops-plan; h200's GPU pool
# consumes a reservation, so its doctor reads no GPU quota (the b200 seed's does).
@pytest.mark.parametrize("role", checked_roles("plan-live", but=("roles/secretmanager.secretAccessor",
                                                                 "roles/cloudquotas.viewer")))
def test_a_live_plan_without_any_one_of_its_roles_fails_naming_it(functions, capsys, role):
    enforced = functions.enforced
    enforced.gcp.deploy(PROJECT)  # deployed: the doctor's deployment check reads the functions and the schedule
    enforced.act_as("plan-live", without=role)
    capsys.readouterr()
    planned = cli.main(["plan", "h200"])
    doctored = cli.main(["doctor", "h200", "--as", "none", "--format", "json"])
    said = capsys.readouterr()
    assert 1 in (planned, doctored)
    lacking = lacking_in(said.err + said.out)
    assert any(permission in roles()[role].permissions for permission, _ in lacking), said
