import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.gcs import fake_gcs
from fakes.gcs_iam import GcsIam

# The local stack's fixtures (module-scoped: one stack per module that asks for it) and helpers; the pipelines'
# harness and its fixtures (`github`, `workspace`).
pytest_plugins = ["local_stack", "pipelines_support"]
# The other helpers shared by several test modules: pytest rewrites their asserts as it does the tests' own.
pytest.register_assert_rewrite("apply_support", "interleavings_support", "least_privilege_support", "plans_support",
                               "render_support")

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = REPO / "environments"
# Set by `make test-fast`: the tier with no server and no other process, which this file enforces.
FAST = os.environ.get("RLOPS_TEST_FAST") == "1"


def pytest_addoption(parser):
    parser.addoption("--reverse", action="store_true",
                     help="run the tests in reverse order: one that passes only after another fails")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (`--dist loadgroup`)
def pytest_collection_modifyitems(config, items):
    """Every test on the fake GCS server (the state bucket; the fake GCP and cluster stand on it) starts servers.
    The tests of a module that share a module-scoped fixture (a local stack, a Ray head, a deploy) run on one xdist
    worker, one after another, unless the module names its group itself: spread over workers, each worker would
    build the fixture again."""
    for item in items:
        if "gcs" in item.fixturenames:
            item.add_marker("servers")
        if item.get_closest_marker("xdist_group") is None and any(
                definitions[-1].scope == "module" for definitions in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    if config.getoption("reverse"):
        items.reverse()


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f"this test {what}, which `make test-fast` runs without: mark it @pytest.mark.servers")
    return refused


@pytest.fixture(scope="session", autouse=True)
def _fast_tier_refuses_servers():
    """Under `make test-fast` a test that starts a server or a process unmarked fails loudly instead of slowing the
    fast tier down. Only while tests run: pytest-xdist's workers are processes the session itself starts."""
    if not FAST:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "listen", _refuse("listens on a socket (a server)"))
        patch.setattr(subprocess.Popen, "__init__", _refuse("starts a process"))
        yield


@pytest.fixture(autouse=True)
def _a_new_function_instance():
    """Each test meets `functions/main.py` as a new Cloud Functions instance would: its endpoints are read once per
    instance (a cache), and another test's instance points at that test's fakes."""
    main = sys.modules.get("main")
    if main is not None:
        main._endpoints.cache_clear()


@pytest.fixture
def environments_dir() -> Path:
    return ENVIRONMENTS


@pytest.fixture(scope="session")
def gcs():
    """fake-gcs-server for the state bucket, one for the session, behind Cloud Storage's IAM (`server.gate`,
    enforcing nothing until a test gives it a policy); STORAGE_EMULATOR_HOST names the gate while it runs, and
    `server.url` is fake-gcs-server's own."""
    import os

    with fake_gcs() as server, GcsIam(None, server.url) as gate:
        before, os.environ["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"], gate.url
        server.gate = gate
        try:
            yield server
        finally:
            os.environ["STORAGE_EMULATOR_HOST"] = before


@pytest.fixture
def state_buckets(gcs):
    """The seed environments' state buckets, empty."""
    from rlops.endpoints import Endpoints
    from rlops.state.bucket import client

    storage = client("test", Endpoints.from_environment())
    for name in ("rlops-h200-example-state", "rlops-b200-example-state"):
        bucket = storage.lookup_bucket(name) or storage.create_bucket(name)
        for blob in bucket.list_blobs():
            blob.delete()
    return gcs


PLANTED_TOKENS = {"hf-token": "hf_PlantedTokenValue0123456789abcdefXYZ", "wandb-api-key": "5" * 40}


@pytest.fixture
def cloud_fakes(state_buckets, monkeypatch):
    """The fake GCP control plane (with the seeds' secret versions) and the fake cluster API, both pointed at."""
    import json

    from fakes.gcp import FakeGcp
    from fakes.kube import FakeKube

    with FakeGcp(operation_seconds=0.1) as gcp, FakeKube(controller_delay=0.05) as kube:
        for project in ("rlops-h200-example", "rlops-b200-example"):
            for secret, value in PLANTED_TOKENS.items():
                gcp.put_secret(f"projects/{project}/secrets/{secret}/versions/latest", value)
        # The h200 seed's reservation: a3-ultragpu-8g VMs in us-central1-b, room for the tests that grow the pool.
        gcp.put_reservation("rlops-h200-example", "us-central1-b", "h200-reservation", "a3-ultragpu-8g",
                            "nvidia-h200-141gb", 8, count=4)
        monkeypatch.setenv("RLOPS_API_ENDPOINTS", json.dumps(gcp.endpoints))
        monkeypatch.setenv("RLOPS_KUBE_API", kube.url)
        yield gcp, kube


@pytest.fixture
def specs(monkeypatch, tmp_path):
    """The seed specs in a folder of their own, for tests to edit."""
    folder = tmp_path / "environments"
    shutil.copytree(REPO / "environments", folder)
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(folder))
    return folder


def workload_words(entrypoint: str, run_dir: str | None = None) -> list[str]:
    """A job's command after its checkpoint gate (`rlops.checkpoints.gate`, which every attempt runs first, on the
    run's own directory); the gate's presence and directory are checked."""
    import shlex

    words = shlex.split(entrypoint)
    split = words.index("&&")
    assert words[:5] == ["python", "-m", "rlops.checkpoints.gate", "--run-dir", run_dir or words[4]], words[:split]
    return words[split + 1:]


def until(condition, what: str, timeout: float = 60, poll: float = 0.05) -> None:
    """Wait for `condition` (polled every `poll` seconds), failing after `timeout` seconds naming `what`."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout}s waiting for {what}"
        time.sleep(poll)
