"""plan, apply and destroy of the seed environments against the fake GCP control plane and fake-gcs-server.

The real Google client libraries send every request over HTTP to tests/fakes/gcp.py; the
assertions read its request log, as a reviewer would read the API's audit log.
"""

import ipaddress
import json
from collections import Counter

import pytest
from google.cloud import container_v1 as gke
from google.cloud import lustre_v1

from apply_support import applied
from rlops import cli
from rlops.cli import common
from rlops.cloud import base
from rlops.endpoints import Endpoints


@pytest.fixture
def fake(cloud_fakes, specs, monkeypatch):
    """A fresh fake cloud and cluster, and empty state buckets."""
    # Retry fast: the fake's faults are as frequent as a bad day, its waits are not as long.
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    return cloud_fakes[0]


def run(*argv) -> int:
    return cli.main(list(argv))


def bodies(fake, method: str, path_end: str) -> list[dict]:
    return [r.body for r in fake.mutations() if r.method == method and r.path.endswith(path_end)]


def test_apply_h200_sends_what_the_seed_sets_and_a_second_plan_is_empty(fake, capsys):
    assert run("apply", "--yes", "h200") == 0
    (pool_request,) = bodies(fake, "POST", "/clusters/rl-h200/nodePools")
    pool = gke.CreateNodePoolRequest.from_json(json.dumps(pool_request), ignore_unknown_fields=True).node_pool
    affinity = pool.config.reservation_affinity
    assert affinity.consume_reservation_type == gke.ReservationAffinity.Type.SPECIFIC_RESERVATION
    assert list(affinity.values) == ["h200-reservation"] and not pool.config.spot
    networks = [(n.network, n.subnetwork) for n in pool.network_config.additional_node_network_configs]
    assert networks == [("rl-gvnic-net", "rl-gvnic-sub")] + [("rl-rdma-net", f"rl-rdma-sub-{i}") for i in range(8)]
    assert (pool.config.accelerators[0].accelerator_type, pool.config.accelerators[0].accelerator_count) == (
        "nvidia-h200-141gb", 8)
    assert pool.autoscaling.enabled and pool.autoscaling.max_node_count == 2

    rdma = [b for b in bodies(fake, "POST", "/global/networks") if b["name"] == "rl-rdma-net"][0]
    assert rdma["networkProfile"].endswith("/networkProfiles/us-central1-b-vpc-roce")
    (cluster_request,) = bodies(fake, "POST", "/locations/us-central1/clusters")
    cluster = gke.CreateClusterRequest.from_json(json.dumps(cluster_request), ignore_unknown_fields=True).cluster
    assert cluster.addons_config.ray_operator_config.enabled
    assert cluster.addons_config.lustre_csi_driver_config.enabled
    assert not cluster.addons_config.lustre_csi_driver_config.enable_legacy_lustre_port
    assert cluster.network_config.enable_multi_networking
    # The regional cluster's system pool (the Ray head) in the zone of Lustre and the GPUs, not in three zones.
    (system,) = cluster.node_pools
    assert list(system.locations) == ["us-central1-b"]
    assert fake.resources("node_pool")["default-pool"]["locations"] == ["us-central1-b"]
    assert cluster.network_config.datapath_provider == gke.DatapathProvider.ADVANCED_DATAPATH

    (lustre_request,) = bodies(fake, "POST", "/instances")
    lustre = lustre_v1.Instance.from_json(json.dumps(lustre_request), ignore_unknown_fields=True)
    assert (lustre.capacity_gib, lustre.per_unit_storage_throughput, lustre.filesystem) == (18000, 500, "lustrefs")
    (address,) = bodies(fake, "POST", "/global/addresses")
    assert (address["purpose"], address["address"], address["prefixLength"]) == ("VPC_PEERING", "10.112.0.0", 20)
    # Lustre's port from the peered range, as Google's steps open it, though the instance has no GKE support flag.
    (lnet,) = [b for b in bodies(fake, "POST", "/global/firewalls") if b["name"] == "rl-lustre-lnet"]
    assert (lnet["allowed"], lnet["sourceRanges"]) == ([{"IPProtocol": "tcp", "ports": ["988"]}], ["10.112.0.0/20"])
    (peering,) = bodies(fake, "POST", "/connections")
    assert peering["network"] == "projects/123456789012/global/networks/rl-net"

    capsys.readouterr()
    before = len(fake.requests)
    assert run("plan", "h200", "--detailed-exitcode") == 0
    assert "No changes" in capsys.readouterr().out
    assert not [r for r in fake.requests[before:] if r.method != "GET"], "a plan must only read"


def test_environments_of_one_project_share_their_list_calls_and_keep_their_own_resources(fake, specs, capsys):
    assert run("apply", "--yes", "h200") == 0
    seed = (specs / "h200.yaml").read_text()
    for copy in ("h200-two", "h200-three"):  # the same project, resources named apart
        (specs / f"{copy}.yaml").write_text(seed.replace("rl-", f"{copy.split('-')[1]}-"))
    capsys.readouterr()
    before = len(fake.requests)
    assert run("plan", "h200", "h200-two", "h200-three", "--detailed-exitcode") == 2
    out = capsys.readouterr().out
    gets = Counter(r.path for r in fake.requests[before:] if r.method == "GET")
    for listed in ("/global/networks", "/global/firewalls", "/global/addresses", "/regions/us-central1/subnetworks",
                   "/locations/us-central1/clusters", "/locations/us-central1-b/instances"):
        (path,) = [p for p in gets if p.endswith(listed)]
        assert gets[path] == 1, f"{path} listed {gets[path]} times for three environments of one project"
    peerings = [r for r in fake.requests[before:] if r.path.endswith("/connections")]
    assert sorted(r.query["network"].rsplit("/", 1)[1] for r in peerings) == ["rl-net", "three-net", "two-net"]
    plans = {p.split(":", 1)[0]: p for p in out.split("Plan for environment ")[1:]}
    assert plans["h200"].startswith("h200: 0 to create, 0 to update, 0 to replace, 0 to delete")
    assert plans["h200-two"].startswith("h200-two: 19 to create")
    assert "cluster/two-h200" in plans["h200-two"] and "rl-" not in plans["h200-two"]


def test_the_json_plan_carries_cluster_object_changes_as_data_without_their_values(fake, capsys):
    assert run("plan", "h200", "--format", "json") == 0
    (plan,) = json.loads(capsys.readouterr().out)
    objects = {(o["kind"], o["name"]): o for o in plan["cluster_objects"]}
    assert objects[("RayCluster", "ray-cluster")] == {
        "kind": "RayCluster", "name": "ray-cluster", "namespace": "default", "action": "create", "fields": [],
        "reason": None, "restarts_pods": None}
    assert objects[("PersistentVolume", "rl-lustre-pv")]["namespace"] is None  # cluster-scoped
    assert "HF_TOKEN" not in json.dumps(plan) and "hf_" not in json.dumps(plan)


def test_a_cluster_list_with_a_zone_missing_is_asked_again_not_planned_as_a_new_cluster(fake, capsys):
    assert run("apply", "--yes", "h200") == 0
    capsys.readouterr()
    fake.unanswered_zones.append("us-central1-b")
    assert run("plan", "h200", "--detailed-exitcode") == 0
    assert "0 to create" in capsys.readouterr().out
    assert not fake.unanswered_zones
    lists = [r for r in fake.requests if r.method == "GET" and r.path.endswith("/locations/us-central1/clusters")]
    assert len(lists) >= 2


def test_apply_b200_spot_without_gke_support_opens_the_lnet_port(fake):
    assert run("apply", "--yes", "b200-spot") == 0
    (pool_request,) = bodies(fake, "POST", "/nodePools")
    pool = gke.CreateNodePoolRequest.from_json(json.dumps(pool_request), ignore_unknown_fields=True).node_pool
    assert pool.config.spot and not pool.config.reservation_affinity.values
    lnet = [b for b in bodies(fake, "POST", "/global/firewalls") if b["name"].endswith("-lnet")]
    assert lnet and lnet[0]["allowed"] == [{"IPProtocol": "tcp", "ports": ["988"]}]
    assert lnet[0]["sourceRanges"] == ["10.112.0.0/22"]
    (lustre_request,) = bodies(fake, "POST", "/instances")
    assert lustre_request.get("gkeSupportEnabled", False) is False
    # The Lustre servers answer from the peered range: it must be the one the LNet firewall admits.
    (address,) = bodies(fake, "POST", "/global/addresses")
    assert (address["address"], address["prefixLength"]) == ("10.112.0.0", 22)
    (instance,) = fake.resources("lustre_instance").values()
    server = ipaddress.ip_address(instance["mountPoint"].split("@")[0])
    assert any(server in ipaddress.ip_network(source) for source in lnet[0]["sourceRanges"]), instance["mountPoint"]
    assert run("plan", "b200-spot", "--detailed-exitcode") == 0


@pytest.mark.parametrize("env_name", ["h200", "b200-spot"])
def test_no_request_carries_lustres_deprecated_gke_support_fields(fake, env_name):
    """lustre_v1 Instance.gke_support_enabled ("Deprecated: No longer required for GKE instance creation") and GKE's
    LustreCsiDriverConfig.enable_legacy_lustre_port (deprecated from node version 1.33.2-gke.4655000): the
    fake accepts both, as Google still does; rlops sends neither."""
    assert run("apply", "--yes", env_name) == 0
    sent = [json.dumps(r.body) for r in fake.requests if r.body]
    assert sent and not [body for body in sent if "gkeSupportEnabled" in body or "enableLegacyLustrePort" in body]


def test_apply_converges_with_30_percent_of_calls_failing(fake):
    fake.fail_rate = 0.3
    assert run("apply", "--yes", "h200") == 0
    failed = [r for r in fake.requests if r.status in (429, 503)]
    assert len(failed) > 10, "the faults were not injected"
    fake.fail_rate = 0.0
    assert run("plan", "h200", "--detailed-exitcode") == 0
    created = [r.body["name"] for r in fake.mutations() if r.method == "POST" and r.path.endswith("/networks")]
    assert sorted(created) == sorted(set(created)), "a network was created twice"


def test_drift_in_the_console_is_planned_back_to_the_spec(fake, capsys):
    assert run("apply", "--yes", "h200") == 0
    pool = fake.resources("node_pool")["gpu-pool"]
    pool["autoscaling"]["maxNodeCount"] = 5
    fake.put("node_pool", "gpu-pool", pool)
    capsys.readouterr()
    assert run("plan", "h200", "--detailed-exitcode") == 2
    out = capsys.readouterr().out
    assert "~ node_pool/gpu-pool" in out and "max_nodes: 5 -> 2" in out
    assert run("apply", "--yes", "h200") == 0
    assert bodies(fake, "POST", "gpu-pool:setAutoscaling")
    assert run("plan", "h200", "--detailed-exitcode") == 0


def test_a_resource_rlops_does_not_own_and_that_differs_is_refused(fake, capsys):
    fake.put("network", "rl-gvnic-net", {"name": "rl-gvnic-net", "mtu": 1460, "autoCreateSubnetworks": False})
    assert run("plan", "h200", "--detailed-exitcode") == 1
    assert "network/rl-gvnic-net exists but is not managed by rlops" in capsys.readouterr().out
    assert run("apply", "--yes", "h200") == 1
    assert not fake.mutations(), "a refused plan changed something"


def test_lustre_shrink_is_refused_and_growth_is_an_update(fake, specs, capsys):
    assert run("apply", "--yes", "h200") == 0
    spec = specs / "h200.yaml"
    original = spec.read_text()
    spec.write_text(original.replace("capacity_gib: 18000", "capacity_gib: 36000"))
    capsys.readouterr()
    assert run("plan", "h200", "--detailed-exitcode") == 2
    assert "capacity_gib: 18000 -> 36000" in capsys.readouterr().out
    assert run("apply", "--yes", "h200") == 0
    assert int(fake.resources("lustre_instance")["rl-lustre"]["capacityGib"]) == 36000
    spec.write_text(original)
    capsys.readouterr()
    assert run("plan", "h200") == 1
    assert "capacity_gib can only grow" in capsys.readouterr().out


def test_destroy_keeps_lustre_and_what_it_needs_unless_told_twice(fake, capsys):
    assert run("apply", "--yes", "h200") == 0
    assert applied("h200")
    assert run("destroy", "h200", "--yes") == 0
    assert not applied("h200")  # the next push applies it again
    assert set(fake.resources("lustre_instance")) == {"rl-lustre"}
    assert "rl-net" in fake.resources("network") and "rl-lustre-range" in fake.resources("address")
    assert not fake.resources("cluster") and not fake.resources("node_pool") and not fake.resources("subnetwork")
    assert "kept, with its data" in capsys.readouterr().out
    # --delete-data alone is not enough: the spec must say delete too.
    assert run("destroy", "h200", "--yes", "--delete-data") == 0
    assert set(fake.resources("lustre_instance")) == {"rl-lustre"}


def test_a_permission_failure_stops_apply_naming_the_api_resource_and_permission(fake, capsys):
    fake.fail_next(1, status=403, match="POST /compute/v1/projects/rlops-h200-example/global/networks")
    assert run("apply", "--yes", "h200") == 1
    err = capsys.readouterr().err
    assert "compute: insert network" in err and ("lacks compute.networks.create (in roles/compute.editor, "
                                                 "roles/compute.networkAdmin or roles/compute.admin)") in err
    assert not applied("h200")  # so the next push tries again
    # What did get created is recorded, so the re-run only does the rest.
    assert run("apply", "--yes", "h200") == 0
    assert applied("h200")
    assert run("plan", "h200", "--detailed-exitcode") == 0


def test_destroy_goes_in_reverse_dependency_order_and_deletes_lustre_only_when_told_twice(fake, specs, capsys):
    assert run("apply", "--yes", "h200") == 0
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("deletion_policy: retain", "deletion_policy: delete"))
    assert "deletion_policy: delete" in spec.read_text()
    start = len(fake.requests)
    assert run("destroy", "h200", "--yes", "--delete-data") == 0
    assert all(not fake.resources(kind) for kind in ("network", "subnetwork", "firewall", "address", "connection",
                                                     "cluster", "node_pool", "lustre_instance"))
    order = [r.path for r in fake.requests[start:]
             if r.method == "DELETE" or (r.method == "POST" and r.path.endswith("/servicenetworking-googleapis-com"))]
    position = {path.rsplit("/", 1)[-1].split(":")[0]: i for i, path in enumerate(order)}
    assert position["gpu-pool"] < position["rl-h200"] < position["rl-lustre"]  # node pool, cluster, Lustre
    assert position["rl-lustre"] < position["servicenetworking-googleapis-com"] < position["rl-lustre-range"]
    assert position["rl-rdma-sub-0"] < position["rl-rdma-net"]


@pytest.mark.parametrize("busy_with", ["SET_NODE_POOL_SIZE", "UPDATE_CLUSTER", "CREATE_NODE_POOL", "CREATE_CLUSTER"])
def test_gke_busy_with_another_operation_is_waited_out_not_failed(fake, busy_with):
    """In each of GKE's wordings: "incompatible operation", "Operation operation-X is currently upgrading cluster
    ... Please wait and try again once it is done." and "Cluster is currently being created, deleted, updated or
    repaired" (the last two were final before: an apply right after a cluster's creation or during an auto-upgrade
    failed)."""
    assert run("apply", "--yes", "h200") == 0
    # Another actor keeps the cluster busy: the first tries of the node pool update are refused as GKE does.
    pool = fake.resources("node_pool")["gpu-pool"]
    pool["autoscaling"]["maxNodeCount"] = 1
    fake.put("node_pool", "gpu-pool", pool)
    fake.fail_next(2, match=":setAutoscaling", busy=busy_with)
    assert run("apply", "--yes", "h200") == 0
    refused = [r for r in fake.requests if r.path.endswith(":setAutoscaling") and r.status == 400]
    assert len(refused) == 2
    assert run("plan", "h200", "--detailed-exitcode") == 0


def test_render_takes_the_lustre_address_from_the_live_instance(fake, capsys):
    assert run("render", "h200") == 1
    assert "does not exist (yet)" in capsys.readouterr().err
    assert run("apply", "--yes", "h200") == 0
    capsys.readouterr()
    assert run("render", "h200") == 0
    ip = fake.resources("lustre_instance")["rl-lustre"]["mountPoint"].split("@")[0]
    assert f"ip: {ip}" in capsys.readouterr().out


@pytest.mark.parametrize("env_name", ["h200", "b200-spot"])
def test_in_place_updates_of_networks_and_firewalls_are_requests_google_accepts(fake, specs, capsys, env_name):
    """The patch paths, through the fake that checks every request against compute.v1's discovery document (a
    firewall patch needs its `name`)."""
    assert run("apply", "--yes", env_name) == 0
    spec = specs / f"{env_name}.yaml"
    spec.write_text(spec.read_text().replace("firewall_source_ranges: [192.168.0.0/16]",
                                             "firewall_source_ranges: [192.168.0.0/16, 172.16.0.0/12]")
                    .replace("  gvnic:\n", "  gvnic:\n    mtu: 8244\n", 1))
    capsys.readouterr()
    assert run("plan", env_name, "--detailed-exitcode") == 2
    assert run("apply", "--yes", env_name) == 0, capsys.readouterr().err
    (firewall,) = [b for b in bodies(fake, "PATCH", "-internal")]
    assert firewall["name"].endswith("-gvnic-internal") and firewall["sourceRanges"][-1] == "172.16.0.0/12"
    assert [b["mtu"] for b in bodies(fake, "PATCH", "-gvnic-net")] == [8244]
    assert run("plan", env_name, "--detailed-exitcode") == 0


@pytest.mark.parametrize("env_name, pool, grown", [("h200", "gpu-pool", ("max_nodes: 2}", "max_nodes: 3}")),
                                                   ("b200-spot", "a4-pool", ("max_nodes: 8}", "max_nodes: 9}"))])
def test_every_write_path_of_a_seed_is_a_request_google_accepts(fake, specs, capsys, env_name, pool, grown):
    """Create, the cluster's update, the pool's autoscaling, Lustre's growth, the reaper's resize and destroy, each
    checked by the fake against the discovery documents and Lustre's protos (a refusal is a 400)."""
    from rlops.cloud.base import Connection
    from rlops.cloud.container import NodePools
    from rlops.provision.service import target_of

    assert run("apply", "--yes", env_name) == 0
    spec = specs / f"{env_name}.yaml"
    capacity = "capacity_gib: 18000" if env_name == "h200" else "capacity_gib: 36000"
    spec.write_text(spec.read_text().replace("release_channel: REGULAR", "release_channel: RAPID")
                    .replace(*grown).replace(capacity, "capacity_gib: 54000"))
    assert run("apply", "--yes", env_name) == 0, capsys.readouterr().err
    assert {r.method for r in fake.mutations()} >= {"POST", "PUT", "PATCH"}
    _, env = common.load_gcp(env_name)
    node_pools = NodePools(target_of(env.name, env.spec), Connection.to(Endpoints.from_environment()))
    assert node_pools.resize(pool, 0).wait(60) is None
    assert run("destroy", env_name, "--yes") == 0
    refused = [f"{r.method} {r.path} {r.status}" for r in fake.requests if r.status == 400]
    assert refused == [], refused
    assert any(r.path.endswith(":setSize") for r in fake.mutations())
    assert any(r.method == "DELETE" and "/nodePools/" in r.path for r in fake.mutations())


def test_the_image_cache_is_created_with_its_reader_kept_while_shared_and_streaming_follows_the_spec(
        fake, specs, capsys):
    assert run("apply", "--yes", "h200") == 0
    name = "projects/rlops-h200-example/locations/us-central1/repositories/rlops-nvcr-io"
    repository = fake.artifact_registry.repositories[name]
    assert (repository["mode"], repository["remoteRepositoryConfig"]["dockerRepository"]) == (
        "REMOTE_REPOSITORY", {"customRepository": {"uri": "https://nvcr.io"}})
    (binding,) = fake.deploy_apis.policies[name]["bindings"]
    assert binding == {"role": "roles/artifactregistry.reader",
                       "members": ["serviceAccount:123456789012-compute@developer.gserviceaccount.com"]}
    assert fake.resources("node_pool")["gpu-pool"]["config"]["gcfsConfig"] == {"enabled": True}
    assert run("plan", "h200", "--detailed-exitcode") == 0

    # Another environment of the project and region uses the same cache: h200 turning it off, or its destroy,
    # leaves it.
    (specs / "h200-two.yaml").write_text((specs / "h200.yaml").read_text().replace("rl-", "two-"))
    with_cache = (specs / "h200.yaml").read_text()
    (specs / "h200.yaml").write_text(with_cache.replace("ray:\n", "ray:\n  image_cache: false\n", 1))
    capsys.readouterr()
    assert run("apply", "--yes", "h200") == 0
    assert "kept: remote_repository/rlops-nvcr-io (the image cache of h200-two too)" in capsys.readouterr().out
    assert name in fake.artifact_registry.repositories
    assert not fake.resources("node_pool")["gpu-pool"]["config"]["gcfsConfig"].get("enabled")  # proto3 omits false
    (specs / "h200.yaml").write_text(with_cache)
    assert run("apply", "--yes", "h200") == 0
    capsys.readouterr()
    assert run("destroy", "h200", "--yes") == 0
    assert "kept: remote_repository/rlops-nvcr-io (the image cache of h200-two too)" in capsys.readouterr().out
    assert name in fake.artifact_registry.repositories
    (specs / "h200-two.yaml").unlink()
    assert run("apply", "--yes", "h200") == 0
    assert run("destroy", "h200", "--yes") == 0
    assert name not in fake.artifact_registry.repositories

    # Off: the pools stop streaming, in place, and the cache is no longer h200's.
    assert run("apply", "--yes", "h200") == 0
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("  image: nvcr.io", "  image_cache: false\n  image: nvcr.io"))
    capsys.readouterr()
    assert run("apply", "--yes", "h200") == 0
    assert "gcfsConfig" in str(bodies(fake, "PUT", "/nodePools/gpu-pool"))
    assert fake.resources("node_pool")["gpu-pool"]["config"]["gcfsConfig"] == {}
    assert name not in fake.artifact_registry.repositories
    assert run("plan", "h200", "--detailed-exitcode") == 0
