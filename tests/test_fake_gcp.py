"""The fake GCP control plane answers the real Google client libraries as the real APIs do."""

import ipaddress
import time

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, container_v1, lustre_v1
from google.protobuf import field_mask_pb2
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from fakes.gcp import FakeGcp

P, PN, REGION, ZONE = "proj", 123456789012, "us-central1", "us-central1-b"
SERVICE = "services/servicenetworking.googleapis.com"
DONE = compute_v1.Operation.Status.DONE


@pytest.fixture
def fake():
    server = FakeGcp(operation_seconds=0.05).start()
    yield server
    server.stop()


def gapic(fake: FakeGcp, api: str, client_class):
    return client_class(transport="rest", credentials=AnonymousCredentials(),
                        client_options={"api_endpoint": fake.endpoints[api]})


def servicenetworking(fake: FakeGcp):
    return discovery.build("servicenetworking", "v1", static_discovery=True, credentials=AnonymousCredentials(),
                           client_options={"api_endpoint": fake.endpoints["servicenetworking"]})


def wait_global(fake: FakeGcp, operation) -> compute_v1.Operation:
    done = gapic(fake, "compute", compute_v1.GlobalOperationsClient).wait(project=P, operation=operation.name)
    assert done.status == DONE
    return done


def make_network(fake: FakeGcp, name: str = "net", **fields) -> None:
    networks = gapic(fake, "compute", compute_v1.NetworksClient)
    fields.setdefault("auto_create_subnetworks", False)
    wait_global(fake, networks.insert(project=P, network_resource=compute_v1.Network(name=name, **fields)))


def make_subnet(fake: FakeGcp, name: str, cidr: str, network: str = "net"):
    subnets = gapic(fake, "compute", compute_v1.SubnetworksClient)
    operation = subnets.insert(project=P, region=REGION, subnetwork_resource=compute_v1.Subnetwork(
        name=name, network=f"projects/{P}/global/networks/{network}", ip_cidr_range=cidr))
    regional = gapic(fake, "compute", compute_v1.RegionOperationsClient)
    assert regional.wait(project=P, region=REGION, operation=operation.name).status == DONE


def sn_wait(sn, operation: dict) -> dict:
    for _ in range(200):
        if operation.get("done"):
            return operation
        time.sleep(0.01)
        operation = sn.operations().get(name=operation["name"]).execute()
    raise AssertionError("the service networking operation never finished")


def make_peering(fake: FakeGcp) -> None:
    addresses = gapic(fake, "compute", compute_v1.GlobalAddressesClient)
    wait_global(fake, addresses.insert(project=P, address_resource=compute_v1.Address(
        name="psa", network=f"projects/{P}/global/networks/net", purpose="VPC_PEERING", address_type="INTERNAL",
        prefix_length=20)))
    sn = servicenetworking(fake)
    body = {"network": f"projects/{PN}/global/networks/net", "reservedPeeringRanges": ["psa"]}
    assert "error" not in sn_wait(sn, sn.services().connections().create(parent=SERVICE, body=body).execute())


# -- Compute ------------------------------------------------------------------------------------
def test_a_network_appears_when_its_operation_is_done_and_a_second_insert_conflicts(fake):
    fake.operation_seconds = 0.3  # long enough to look while it runs
    networks = gapic(fake, "compute", compute_v1.NetworksClient)
    operations = gapic(fake, "compute", compute_v1.GlobalOperationsClient)
    profile = f"projects/{P}/global/networkProfiles/{ZONE}-vpc-roce"
    operation = networks.insert(project=P, network_resource=compute_v1.Network(
        name="net", mtu=8896, auto_create_subnetworks=False, network_profile=profile))
    first = operations.get(project=P, operation=operation.name)
    assert first.status in (compute_v1.Operation.Status.PENDING, compute_v1.Operation.Status.RUNNING)
    with pytest.raises(gexc.NotFound):
        networks.get(project=P, network="net")
    with pytest.raises(gexc.Conflict):
        networks.insert(project=P, network_resource=compute_v1.Network(name="net", auto_create_subnetworks=False))
    done = wait_global(fake, operation)
    assert done.target_link.endswith("/global/networks/net") and done.operation_type == "insert"
    network = networks.get(project=P, network="net")
    assert (network.mtu, network.auto_create_subnetworks) == (8896, False)
    assert network.routing_config.routing_mode == "REGIONAL"
    assert network.network_profile.endswith(profile)
    with pytest.raises(gexc.Conflict):
        networks.insert(project=P, network_resource=compute_v1.Network(name="net", auto_create_subnetworks=False))
    assert [r.path.rsplit("/", 1)[-1] for r in fake.mutations()] == ["networks"]  # polls and waits are not mutations


def test_names_missing_networks_and_overlapping_ranges_are_refused(fake):
    networks = gapic(fake, "compute", compute_v1.NetworksClient)
    for bad in ("Bad_Name", "1net", "n" * 64, "net-"):
        with pytest.raises(gexc.BadRequest, match="resource.name"):
            networks.insert(project=P, network_resource=compute_v1.Network(name=bad))
    with pytest.raises(gexc.BadRequest, match="mtu"):
        networks.insert(project=P, network_resource=compute_v1.Network(name="net", mtu=9000,
                                                                      auto_create_subnetworks=False))
    with pytest.raises(gexc.BadRequest, match="cannot be found"):
        make_subnet(fake, "sub", "10.0.0.0/24")
    make_network(fake)
    make_subnet(fake, "sub", "10.0.0.0/24")
    with pytest.raises(gexc.BadRequest, match="conflicts with existing subnetwork 'sub'"):
        make_subnet(fake, "sub2", "10.0.0.128/25")
    make_subnet(fake, "sub2", "10.0.1.0/24")
    addresses = gapic(fake, "compute", compute_v1.GlobalAddressesClient)
    with pytest.raises(gexc.BadRequest, match="prefixLength"):
        addresses.insert(project=P, address_resource=compute_v1.Address(
            name="psa", network=f"projects/{P}/global/networks/net", purpose="VPC_PEERING", address_type="INTERNAL"))
    with pytest.raises(gexc.NotFound):
        gapic(fake, "compute", compute_v1.FirewallsClient).delete(project=P, firewall="nothing")


def test_a_network_in_use_cannot_be_deleted_until_what_uses_it_is_gone(fake):
    make_network(fake)
    make_subnet(fake, "sub", "10.0.0.0/24")
    networks = gapic(fake, "compute", compute_v1.NetworksClient)
    with pytest.raises(gexc.BadRequest, match="already being used by .*/subnetworks/sub") as refused:
        networks.delete(project=P, network="net")
    assert refused.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    subnets = gapic(fake, "compute", compute_v1.SubnetworksClient)
    operation = subnets.delete(project=P, region=REGION, subnetwork="sub")
    gapic(fake, "compute", compute_v1.RegionOperationsClient).wait(project=P, region=REGION, operation=operation.name)
    wait_global(fake, networks.delete(project=P, network="net"))
    assert not fake.resources("network") and not fake.resources("subnetwork")


# -- Service Networking --------------------------------------------------------------------------
def test_peering_wants_the_project_number_an_existing_network_and_allocated_ranges(fake):
    make_network(fake)
    connections = servicenetworking(fake).services().connections()
    with pytest.raises(HttpError) as by_id:
        connections.create(parent=SERVICE, body={"network": f"projects/{P}/global/networks/net",
                                                 "reservedPeeringRanges": ["psa"]}).execute()
    assert by_id.value.resp.status == 400 and "PROJECT_NUMBER" in str(by_id.value)
    with pytest.raises(HttpError, match="psa"):
        connections.create(parent=SERVICE, body={"network": f"projects/{PN}/global/networks/net",
                                                 "reservedPeeringRanges": ["psa"]}).execute()
    with pytest.raises(HttpError, match="cannot be found"):
        connections.create(parent=SERVICE, body={"network": f"projects/{PN}/global/networks/other",
                                                 "reservedPeeringRanges": ["psa"]}).execute()
    make_peering(fake)
    (found,) = connections.list(parent=SERVICE, network=f"projects/{PN}/global/networks/net").execute()["connections"]
    assert found["reservedPeeringRanges"] == ["psa"] and found["peering"] == "servicenetworking-googleapis-com"
    with pytest.raises(gexc.BadRequest, match="already being used by 'peering"):
        gapic(fake, "compute", compute_v1.GlobalAddressesClient).delete(project=P, address="psa")


# -- Managed Lustre ------------------------------------------------------------------------------
def test_lustre_checks_tiers_polls_as_an_lro_grows_only_and_holds_its_peering(fake):
    lustre = gapic(fake, "lustre", lustre_v1.LustreClient)
    parent = f"projects/{P}/locations/{ZONE}"

    def instance(capacity, throughput=500, filesystem="lustrefs"):
        return lustre_v1.Instance(capacity_gib=capacity, per_unit_storage_throughput=throughput, filesystem=filesystem,
                                  network=f"projects/{P}/global/networks/net", gke_support_enabled=True)
    with pytest.raises(gexc.BadRequest, match="cannot be found"):
        lustre.create_instance(parent=parent, instance=instance(18000), instance_id="fs")
    make_network(fake)
    with pytest.raises(gexc.BadRequest, match="private services access"):
        lustre.create_instance(parent=parent, instance=instance(18000), instance_id="fs")
    make_peering(fake)
    for capacity, throughput in ((9000, 500), (27000, 500), (36000, 125), (4500, 1000), (18000, 300)):
        with pytest.raises(gexc.BadRequest):
            lustre.create_instance(parent=parent, instance=instance(capacity, throughput), instance_id="fs")
    with pytest.raises(gexc.BadRequest, match="filesystem"):
        lustre.create_instance(parent=parent, instance=instance(18000, filesystem="toolongname"), instance_id="fs")

    fake.operation_seconds = 0.3
    operation = lustre.create_instance(parent=parent, instance=instance(18000), instance_id="fs")
    fake.operation_seconds = 0.05
    assert lustre.get_instance(name=f"{parent}/instances/fs").state == lustre_v1.Instance.State.CREATING
    while not operation.done():
        time.sleep(0.01)
    created = operation.result()
    assert operation.metadata.verb == "create"
    assert created.state == lustre_v1.Instance.State.ACTIVE and created.capacity_gib == 18000
    ip, filesystem = created.mount_point.split("@tcp:/")
    psa = fake.resources("address")["psa"]
    assert filesystem == "lustrefs"
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(f"{psa['address']}/{psa['prefixLength']}")

    mask = field_mask_pb2.FieldMask(paths=["capacity_gib"])
    path = f"{parent}/instances/fs"
    with pytest.raises(gexc.BadRequest, match="only grow"):
        lustre.update_instance(instance=lustre_v1.Instance(name=path, capacity_gib=9000), update_mask=mask)
    with pytest.raises(gexc.BadRequest, match="immutable"):
        lustre.update_instance(instance=lustre_v1.Instance(name=path, per_unit_storage_throughput=1000),
                               update_mask=field_mask_pb2.FieldMask(paths=["per_unit_storage_throughput"]))
    assert lustre.update_instance(instance=lustre_v1.Instance(name=path, capacity_gib=36000),
                                  update_mask=mask).result().capacity_gib == 36000

    # Service networking accepts the disconnect, and its operation fails while Lustre still uses the peering.
    sn = servicenetworking(fake)
    disconnect = sn.services().connections().deleteConnection(
        name=f"{SERVICE}/connections/servicenetworking-googleapis-com",
        body={"consumerNetwork": f"projects/{PN}/global/networks/net"}).execute()
    assert "still using this connection" in sn_wait(sn, disconnect)["error"]["message"]
    assert set(fake.resources("connection")) == {"net"}


# -- GKE -----------------------------------------------------------------------------------------
def test_gke_runs_one_operation_per_cluster_and_checks_what_a_cluster_refers_to(fake):
    make_network(fake)
    make_network(fake, "extra")
    make_subnet(fake, "extra-sub", "192.168.0.0/24", network="extra")
    gke = gapic(fake, "container", container_v1.ClusterManagerClient)
    location = f"projects/{P}/locations/{REGION}"
    system = container_v1.NodePool(name="system", initial_node_count=1,
                                   config=container_v1.NodeConfig(machine_type="n2-standard-8"))
    cluster = container_v1.Cluster(
        name="c", network="missing", initial_cluster_version="1.33", node_pools=[system],
        network_config=container_v1.NetworkConfig(datapath_provider=container_v1.DatapathProvider.ADVANCED_DATAPATH,
                                                  enable_multi_networking=True),
        ip_allocation_policy=container_v1.IPAllocationPolicy(use_ip_aliases=True))
    with pytest.raises(gexc.BadRequest, match="network"):
        gke.create_cluster(parent=location, cluster=cluster)
    cluster.network = "net"
    fake.operation_seconds = 0.3
    create = gke.create_cluster(parent=location, cluster=cluster)
    fake.operation_seconds = 0.05
    assert gke.get_cluster(name=f"{location}/clusters/c").status == container_v1.Cluster.Status.PROVISIONING
    extra = container_v1.AdditionalNodeNetworkConfig(network="extra", subnetwork="extra-sub")
    gpu = container_v1.NodePool(name="gpu", config=container_v1.NodeConfig(machine_type="a3-ultragpu-8g"),
                                network_config=container_v1.NodeNetworkConfig(additional_node_network_configs=[extra]))
    with pytest.raises(gexc.BadRequest, match="incompatible operation") as busy:
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu)
    assert create.name in str(busy.value)
    wait_gke(gke, location, create)

    found = gke.get_cluster(name=f"{location}/clusters/c")
    assert found.status == container_v1.Cluster.Status.RUNNING and found.current_master_version == "1.33.2-gke.1475000"
    assert [pool.name for pool in found.node_pools] == ["system"]
    two = container_v1.ClusterUpdate(desired_master_version="1.34",
                                     desired_release_channel=container_v1.ReleaseChannel(channel=1))
    with pytest.raises(gexc.BadRequest, match="one update"):
        gke.update_cluster(name=f"{location}/clusters/c", update=two)
    gpu.network_config.additional_node_network_configs[0].subnetwork = "missing-sub"
    with pytest.raises(gexc.BadRequest, match="missing-sub"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu)
    gpu.network_config.additional_node_network_configs[0].subnetwork = "extra-sub"
    wait_gke(gke, location, gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu))
    assert gke.get_node_pool(name=f"{location}/clusters/c/nodePools/gpu").status == container_v1.NodePool.Status.RUNNING
    with pytest.raises(gexc.BadRequest, match="already being used by 'node pool gpu'"):
        gapic(fake, "compute", compute_v1.SubnetworksClient).delete(project=P, region=REGION, subnetwork="extra-sub")

    wait_gke(gke, location, gke.delete_cluster(name=f"{location}/clusters/c"))
    with pytest.raises(gexc.NotFound):
        gke.get_cluster(name=f"{location}/clusters/c")
    assert not fake.resources("node_pool")


def wait_gke(gke, location: str, operation) -> None:
    for _ in range(200):
        current = gke.get_operation(name=f"{location}/operations/{operation.name}")
        if current.status == container_v1.Operation.Status.DONE:
            return
        time.sleep(0.01)
    raise AssertionError("the GKE operation never finished")


# -- faults and the request log -------------------------------------------------------------------
def test_injected_faults_are_the_errors_clients_see_and_the_log_records_them(fake):
    networks = gapic(fake, "compute", compute_v1.NetworksClient)
    fake.fail_rate = 0.5
    outcomes = {}
    for i in range(20):
        try:
            networks.insert(project=P, network_resource=compute_v1.Network(name=f"n{i}", auto_create_subnetworks=False))
            outcomes[f"n{i}"] = 200
        except (gexc.TooManyRequests, gexc.ServiceUnavailable) as error:
            outcomes[f"n{i}"] = error.code
    fake.fail_rate = 0.0
    accepted = [name for name, status in outcomes.items() if status == 200]
    assert set(outcomes.values()) == {200, 429, 503}
    assert [r.status for r in fake.requests] == list(outcomes.values())
    assert [r.body["name"] for r in fake.mutations()] == accepted
    time.sleep(0.1)  # every accepted insert is done; a refused one did nothing
    assert set(fake.resources("network")) == set(accepted)

    # Compute and GKE reads retry a 503 themselves (their default retry); Lustre's do not.
    start = len(fake.requests)
    fake.fail_next(1, status=503)
    assert networks.get(project=P, network=accepted[0]).name == accepted[0]
    assert [r.status for r in fake.requests[start:]] == [503, 200]

    lustre = gapic(fake, "lustre", lustre_v1.LustreClient)
    fake.fail_next(1, status=503, match="GET /lustre/")
    networks_before = len(fake.requests)
    with pytest.raises(gexc.NotFound):
        networks.get(project=P, network="net")  # not matched: answered as usual
    with pytest.raises(gexc.ServiceUnavailable):
        lustre.get_instance(name=f"projects/{P}/locations/{ZONE}/instances/x")
    with pytest.raises(gexc.NotFound):
        lustre.get_instance(name=f"projects/{P}/locations/{ZONE}/instances/x")
    log = fake.requests[networks_before:]
    assert [(r.method, r.status) for r in log] == [("GET", 404), ("GET", 503), ("GET", 404)]
    assert log[1].path == f"/lustre/v1/projects/{P}/locations/{ZONE}/instances/x" and "gapic/" in log[1].user_agent
    assert log[1].query.get("$alt") == "json;enum-encoding=int"


def test_an_unknown_path_is_a_google_json_404(fake):
    answer = requests.get(f"{fake.endpoints['compute']}/compute/v1/projects/{P}/global/routers", timeout=5)
    assert answer.status_code == 404 and answer.json()["error"]["status"] == "NOT_FOUND"
    assert answer.json()["error"]["errors"][0]["reason"] == "notFound"


def _post(fake: FakeGcp, api: str, path: str, body: dict, method: str = "POST") -> requests.Response:
    base = fake.endpoints[api]
    return requests.request(method, f"{base}{path}", json=body, timeout=5)


NETWORK = {"name": "net", "autoCreateSubnetworks": False}
FIREWALL = {"name": "fw", "network": f"projects/{P}/global/networks/net", "allowed": [{"IPProtocol": "tcp"}]}
LUSTRE = {"capacityGib": "18000", "perUnitStorageThroughput": "1000", "filesystem": "lfs",
          "network": f"projects/{P}/global/networks/net"}
NETWORKS = f"/compute/v1/projects/{P}/global/networks"
FIREWALLS = f"/compute/v1/projects/{P}/global/firewalls"
INSTANCES = f"/v1/projects/{P}/locations/{ZONE}/instances?instanceId=lfs"


@pytest.mark.parametrize("api, path, body, said", [
    ("compute", NETWORKS, {**NETWORK, "bogusField": 1}, 'Unknown name "bogusField" at \'resource\''),
    ("compute", NETWORKS, {**NETWORK, "selfLink": "x"}, "'resource.selfLink': the field is output only"),
    ("compute", NETWORKS, {**NETWORK, "id": "7"}, "'resource.id': the field is output only"),
    ("compute", NETWORKS, {"autoCreateSubnetworks": False}, "Required field 'resource.name'"),
    ("compute", NETWORKS, {"name": "net"}, "resource.autoCreateSubnetworks"),
    ("compute", NETWORKS, {**NETWORK, "mtu": "a lot"}, "Invalid value at 'resource.mtu' (TYPE_INT32)"),
    ("compute", NETWORKS + "?bogus=1", NETWORK, 'Unknown name "bogus": Cannot bind query parameter'),
    ("compute", f"/compute/v1/projects/{P}/global/addresses", {"name": "a", "addressType": "INTERNEL"},
     "Invalid value at 'resource.addressType' (INTERNEL)"),
    ("compute", FIREWALLS, {**FIREWALL, "allowed": [{"IPProtocol": "icmp", "ports": ["1"]}]},
     "Ports can only be given with"),
    ("gke", f"/v1/projects/{P}/locations/{REGION}/clusters/c/nodePools",
     {"nodePool": {"name": "p", "placementPolicy": {"type": "SPREAD"}}},
     "Invalid value at 'nodePool.placementPolicy.type' (SPREAD)"),
    ("gke", f"/v1/projects/{P}/locations/{REGION}/clusters", {"cluster": {"name": "c", "status": "RUNNING"}},
     "'cluster.status': the field is output only"),
    ("lustre", INSTANCES, {**LUSTRE, "mountPoint": "x"}, "'instance.mountPoint': the field is output only"),
    ("lustre", INSTANCES, {**LUSTRE, "bogus": 1}, 'has no field named "bogus"'),
    ("lustre", INSTANCES, {k: v for k, v in LUSTRE.items() if k != "filesystem"},
     "Required field 'instance.filesystem'"),
])
def test_a_request_google_refuses_is_refused_with_googles_error_shape(fake, api, path, body, said):
    answer = _post(fake, {"gke": "container"}.get(api, api), path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and said in error["message"], error["message"]
    assert not fake.mutations(), "a refused request changed something"


def test_what_google_accepts_the_fake_accepts_and_what_only_its_semantics_refuse(fake):
    make_network(fake)
    firewalls = gapic(fake, "compute", compute_v1.FirewallsClient)
    rule = compute_v1.Firewall(name="fw", network=f"projects/{P}/global/networks/net", source_ranges=["2001:db8::/32"],
                               allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["988"])])
    wait_global(fake, firewalls.insert(project=P, firewall_resource=rule))  # IPv6 sourceRanges are Google's too
    nameless = _post(fake, "compute", f"{FIREWALLS}/fw", {"sourceRanges": ["10.0.0.0/8"]}, method="PATCH")
    assert nameless.status_code == 400 and "Required field 'resource.name'" in nameless.json()["error"]["message"]
    lustre = gapic(fake, "lustre", lustre_v1.LustreClient)
    for capacity, throughput in ((10_017_000, 1000), (1_539_000, 1000), (1_602_000, 1000)):
        with pytest.raises(gexc.BadRequest, match="capacity_gib"):
            lustre.create_instance(parent=f"projects/{P}/locations/{ZONE}", instance_id="lfs", instance=lustre_v1.Instance(
                capacity_gib=capacity, per_unit_storage_throughput=throughput, filesystem="lfs",
                network=f"projects/{P}/global/networks/net"))
    answer = _post(fake, "lustre", INSTANCES, {"capacityGib": "472000", "filesystem": "lfs",
                                               "network": f"projects/{P}/global/networks/net",
                                               "dynamicTierOptions": {"mode": "DEFAULT_CACHE"}})
    # The Dynamic tier passes every check but the peering this network does not have yet.
    assert answer.status_code == 400 and "private services access" in answer.json()["error"]["message"]


def test_a_gpu_pool_is_checked_against_its_reservation_key_and_its_rdma_profiles_zone(fake):
    profile = f"projects/{P}/global/networkProfiles/{ZONE}-vpc-roce"
    make_network(fake)
    make_network(fake, "rdma", network_profile=profile, mtu=8896)
    make_subnet(fake, "rdma-sub", "192.168.1.0/24", network="rdma")
    gke = gapic(fake, "container", container_v1.ClusterManagerClient)
    location = f"projects/{P}/locations/{REGION}"
    cluster = container_v1.Cluster(
        name="c", network="net", initial_cluster_version="1.33",
        node_pools=[container_v1.NodePool(name="system", initial_node_count=1)],
        network_config=container_v1.NetworkConfig(datapath_provider=container_v1.DatapathProvider.ADVANCED_DATAPATH,
                                                  enable_multi_networking=True),
        ip_allocation_policy=container_v1.IPAllocationPolicy(use_ip_aliases=True))
    wait_gke(gke, location, gke.create_cluster(parent=location, cluster=cluster))
    rdma = container_v1.AdditionalNodeNetworkConfig(network="rdma", subnetwork="rdma-sub")
    gpu = container_v1.NodePool(name="gpu", locations=[f"{REGION}-a"],
                                config=container_v1.NodeConfig(machine_type="a3-ultragpu-8g"),
                                network_config=container_v1.NodeNetworkConfig(additional_node_network_configs=[rdma]))
    with pytest.raises(gexc.BadRequest, match=f"must all be in {ZONE}"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu)
    gpu.locations = [ZONE]
    gpu.config.reservation_affinity = container_v1.ReservationAffinity(
        consume_reservation_type=container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION, key="name",
        values=["h200-reservation"])
    with pytest.raises(gexc.BadRequest, match="compute.googleapis.com/reservation-name"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu)
    gpu.config.reservation_affinity.key = "compute.googleapis.com/reservation-name"
    wait_gke(gke, location, gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu))
