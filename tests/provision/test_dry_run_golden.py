"""What `apply --dry-run` would send for each shipped GCP environment, checked in: a change to any request shows in
review.

After an intended change: `RLOPS_UPDATE_GOLDEN=1 make test`, then review the diff of tests/golden/.
"""

import os

import pytest

from conftest import REPO
from rlops import cli

GOLDEN = REPO / "tests" / "golden"


# The POSTs each makes: networks, subnets and firewalls per GPU NIC (TCPX 4, TCPXO 8, RDMA a gVNIC and an RDMA
# network with 8 subnets, A2 none), the PSA range, peering, cluster, GPU pool, the image cache and its IAM policy,
# and Lustre.
POSTS = {"h200": 21, "b200-spot": 21, "h100": 21, "h100-mega": 33, "a100": 9}


@pytest.mark.parametrize("environment", POSTS)
def test_dry_run_transcript_matches_the_checked_in_one(environment, capsys, monkeypatch):
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(REPO / "environments"))
    monkeypatch.delenv("RLOPS_API_ENDPOINTS", raising=False)
    assert cli.main(["apply", environment, "--dry-run", "--offline"]) == 0
    transcript = capsys.readouterr().out
    golden = GOLDEN / f"{environment}.apply-dry-run.txt"
    if os.environ.get("RLOPS_UPDATE_GOLDEN"):
        golden.write_text(transcript)
    assert transcript == golden.read_text(), (
        f"the requests changed; if intended, RLOPS_UPDATE_GOLDEN=1 and review {golden}")
    # Only requests were recorded: nothing left for Google's real endpoints but the lines in the file.
    requests = [line for line in transcript.splitlines() if not line.startswith("#")]
    assert all(line.split(" ", 2)[1].startswith("https://") for line in requests)
    assert len([line for line in requests if line.startswith("POST")]) == POSTS[environment]

