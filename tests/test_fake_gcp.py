"""The fake GCP control plane refuses what the real APIs refuse, through the real client libraries."""

import time

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, lustre_v1
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from fakes.gcp import FakeGcp
from rlops.cloud.base import Connection


@pytest.fixture
def fake():
    with FakeGcp(operation_seconds=0.05) as server:
        yield server


@pytest.fixture
def connection(fake):
    return Connection(credentials=AnonymousCredentials(), endpoints=fake.endpoints)


def wait_global(connection, operation) -> compute_v1.Operation:
    operations = connection.gapic("compute", compute_v1.GlobalOperationsClient)
    for _ in range(100):
        current = operations.get(project="p", operation=operation.name)
        if current.status == compute_v1.Operation.Status.DONE:
            return current
        time.sleep(0.02)
    raise AssertionError("operation never finished")


def make_network(connection, name="net"):
    networks = connection.gapic("compute", compute_v1.NetworksClient)
    wait_global(connection, networks.insert(project="p", network_resource=compute_v1.Network(name=name, mtu=8896)))
    return networks


def test_a_network_appears_when_its_operation_is_done_and_a_second_insert_conflicts(connection):
    networks = connection.gapic("compute", compute_v1.NetworksClient)
    operation = networks.insert(project="p", network_resource=compute_v1.Network(name="net", mtu=8896))
    with pytest.raises(gexc.NotFound):
        networks.get(project="p", network="net")
    with pytest.raises(gexc.Conflict):
        networks.insert(project="p", network_resource=compute_v1.Network(name="net"))
    wait_global(connection, operation)
    assert networks.get(project="p", network="net").mtu == 8896


def test_bad_names_missing_networks_and_networks_in_use_are_refused(connection):
    networks = connection.gapic("compute", compute_v1.NetworksClient)
    with pytest.raises(gexc.BadRequest):
        networks.insert(project="p", network_resource=compute_v1.Network(name="Bad_Name"))
    subnets = connection.gapic("compute", compute_v1.SubnetworksClient)
    subnet = compute_v1.Subnetwork(name="sub", network="projects/p/global/networks/net", ip_cidr_range="10.0.0.0/24")
    with pytest.raises(gexc.BadRequest):
        subnets.insert(project="p", region="r", subnetwork_resource=subnet)
    make_network(connection)
    subnets.insert(project="p", region="r", subnetwork_resource=subnet)
    time.sleep(0.1)  # the subnet's operation is done by now
    with pytest.raises(gexc.BadRequest, match="in use|being used"):
        networks.delete(project="p", network="net")


def test_peering_wants_the_project_number_and_an_allocated_range(connection, fake):
    make_network(connection)
    sn = discovery.build("servicenetworking", "v1", static_discovery=True, credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": fake.endpoints["servicenetworking"]})
    connections = sn.services().connections()
    parent = "services/servicenetworking.googleapis.com"
    with pytest.raises(HttpError) as by_id:
        connections.create(parent=parent, body={"network": "projects/p/global/networks/net",
                                                "reservedPeeringRanges": []}).execute()
    assert by_id.value.resp.status == 400 and "PROJECT_NUMBER" in str(by_id.value)
    with pytest.raises(HttpError):
        connections.create(parent=parent, body={"network": "projects/123/global/networks/net",
                                                "reservedPeeringRanges": ["missing-range"]}).execute()


def test_lustre_checks_the_capacity_step_of_its_tier_and_polls_as_an_lro(connection, fake):
    networks = make_network(connection)
    lustre = connection.gapic("lustre", lustre_v1.LustreClient)
    instance = lustre_v1.Instance(capacity_gib=4500, per_unit_storage_throughput=1000, filesystem="fs",
                                  network="projects/p/global/networks/net")
    with pytest.raises(gexc.BadRequest, match="multiple of 9000"):
        lustre.create_instance(parent="projects/p/locations/z", instance=instance, instance_id="l")
    instance.capacity_gib = 9000
    with pytest.raises(gexc.BadRequest, match="private services access"):
        lustre.create_instance(parent="projects/p/locations/z", instance=instance, instance_id="l")
    assert networks  # the network exists; only the peering is missing


def test_injected_faults_are_the_errors_clients_see(connection, fake):
    lustre = connection.gapic("lustre", lustre_v1.LustreClient)
    fake.fail_next(1, status=429)
    with pytest.raises(gexc.TooManyRequests):
        lustre.get_instance(name="projects/p/locations/z/instances/x")
    fake.fail_next(1, status=503)
    with pytest.raises(gexc.ServiceUnavailable):
        lustre.get_instance(name="projects/p/locations/z/instances/x")
    with pytest.raises(gexc.NotFound):
        lustre.get_instance(name="projects/p/locations/z/instances/x")
    assert [r.status for r in fake.requests] == [429, 503, 404]
