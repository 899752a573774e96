"""Issue 31: quota refusals in Google's shapes, said as quota by rlops; a node pool's zones as GKE takes them.

Compute refuses over quota with 403 `quotaExceeded` (or ends an insert's operation with QUOTA_EXCEEDED), GKE
with 403 "Insufficient regional quota"; each carries google/api/error_reason.proto's RESOURCE_QUOTA_EXCEEDED
ErrorInfo. A regional cluster's node pool is in the zones its request names (three of the region's where it names
none), which must be zones of the cluster's region; nodePools.update moves a pool's nodes in place.
"""

import json
import re

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.cloud import container_v1 as gke

from fakes.gcp import quota_error
from rlops import cli
from rlops.cloud import base

PROJECT = "rlops-h200-example"
FIREWALLS = f"POST /compute/v1/projects/{PROJECT}/global/firewalls"
CLUSTERS = f"POST /gke/v1/projects/{PROJECT}/locations/us-central1/clusters"
SYSTEM_POOL = f"projects/{PROJECT}/locations/us-central1/clusters/rl-h200/nodePools/default-pool"


@pytest.fixture
def fake(cloud_fakes, specs, monkeypatch):
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    return cloud_fakes[0]


def gapic(fake, api: str, client_class):
    return client_class(transport="rest", credentials=AnonymousCredentials(),
                        client_options={"api_endpoint": fake.endpoints[api]})


def test_a_compute_quota_refusal_carries_googles_reason_and_error_info(fake):
    fake.fail_next(1, status=quota_error("compute", PROJECT, "FIREWALLS", 200.0, None), match=FIREWALLS)
    rule = compute_v1.Firewall(name="rule", network=f"projects/{PROJECT}/global/networks/default",
                               allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["988"])])
    with pytest.raises(gexc.Forbidden) as refused:
        gapic(fake, "compute", compute_v1.FirewallsClient).insert(project=PROJECT, firewall_resource=rule)
    error = refused.value
    assert error.message.endswith(": Quota 'FIREWALLS' exceeded.  Limit: 200.0 globally.")
    assert error.errors[0]["reason"] == "quotaExceeded"
    assert (error.reason, error.domain) == ("RESOURCE_QUOTA_EXCEEDED", "googleapis.com")
    assert error.metadata["quota_metric"] == "compute.googleapis.com/firewalls"
    assert base.is_quota(error) and not base.is_transient(error)


@pytest.mark.parametrize("api, match, metric, region, said", [
    ("compute", FIREWALLS, "FIREWALLS", None, "compute: insert firewall"),
    ("container", CLUSTERS, "CPUS", "us-central1", "container: create cluster rl-h200"),
], ids=["compute", "gke"])
def test_a_quota_refusal_stops_apply_said_as_quota_not_as_a_permission(fake, capsys, api, match, metric, region, said):
    """Both answer 403, which alone reads as a missing permission; retried, the one injected refusal would pass."""
    fake.fail_next(1, status=quota_error(api, PROJECT, metric, 24.0, region, requested=400.0), match=match)
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert re.search(re.escape(said) + "[^:]*: " + re.escape(base.QUOTA_HINT), err), err
    assert "lacks a permission" not in err
    assert len([r for r in fake.requests if r.status == 403]) == 1


def test_an_insert_whose_operation_ends_over_quota_says_so(fake, capsys):
    fake.fail_operations(1, "insert", "QUOTA_EXCEEDED", "Quota 'NETWORKS' exceeded.  Limit: 15.0 globally.", details=[
        {"quotaInfo": {"metricName": "compute.googleapis.com/networks", "limitName": "NETWORKS-per-project",
                       "limit": 15}}])
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert f"QUOTA_EXCEEDED: Quota 'NETWORKS' exceeded.  Limit: 15.0 globally. ({base.QUOTA_HINT})" in err


def test_a_pool_outside_the_clusters_region_is_refused_and_one_without_zones_gets_three(fake):
    assert cli.main(["apply", "--yes", "h200"]) == 0
    client = gapic(fake, "container", gke.ClusterManagerClient)
    parent = f"projects/{PROJECT}/locations/us-central1/clusters/rl-h200"
    pool = gke.NodePool(name="elsewhere", initial_node_count=1, locations=["us-east1-b"],
                        config=gke.NodeConfig(machine_type="n2-standard-8"))
    with pytest.raises(gexc.BadRequest, match="'us-east1-b' is not a zone of the cluster's region 'us-central1'"):
        client.create_node_pool(parent=parent, node_pool=pool)
    with pytest.raises(gexc.BadRequest, match="'us-central1' is not a zone"):
        client.update_node_pool(request=gke.UpdateNodePoolRequest(name=SYSTEM_POOL, locations=["us-central1"]))
    del pool.locations[:]
    pool.name = "anywhere"
    client.create_node_pool(parent=parent, node_pool=pool)
    assert fake.resources("node_pool")["anywhere"]["locations"] == ["us-central1-a", "us-central1-b", "us-central1-c"]


def test_a_system_pool_in_three_zones_is_moved_to_the_environments_zone_in_place(fake, capsys):
    """As an rlops that sent no `locations` left it: GKE put it in three zones, the count per zone."""
    assert cli.main(["apply", "--yes", "h200"]) == 0
    pool = fake.resources("node_pool")["default-pool"]
    fake.put("node_pool", "default-pool", dict(pool, locations=["us-central1-a", "us-central1-b", "us-central1-c"]))
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    assert "node_locations" in capsys.readouterr().out
    before = len(fake.mutations())
    assert cli.main(["apply", "--yes", "h200"]) == 0
    changes = [(r.method, r.path, r.body) for r in fake.mutations()[before:] if "/nodePools" in r.path]
    assert changes == [("PUT", f"/gke/v1/{SYSTEM_POOL}", {"locations": ["us-central1-b"]})]
    assert fake.resources("node_pool")["default-pool"]["locations"] == ["us-central1-b"]
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, json.dumps(fake.resources("node_pool"))
