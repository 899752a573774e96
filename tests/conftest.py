from pathlib import Path

import pytest

from fakes.gcs import fake_gcs

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = REPO / "environments"


@pytest.fixture
def environments_dir() -> Path:
    return ENVIRONMENTS


@pytest.fixture(scope="session")
def gcs():
    """fake-gcs-server for the state bucket, one for the session (STORAGE_EMULATOR_HOST is set while it runs)."""
    with fake_gcs() as server:
        yield server


@pytest.fixture
def state_buckets(gcs):
    """The seed environments' state buckets, empty."""
    from rlops.state.bucket import client

    storage = client("test")
    for name in ("rlops-h200-example-state", "rlops-b200-example-state"):
        bucket = storage.lookup_bucket(name) or storage.create_bucket(name)
        for blob in bucket.list_blobs():
            blob.delete()
    return gcs
