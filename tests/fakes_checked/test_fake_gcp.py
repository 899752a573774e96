"""The fake GCP control plane answers the real Google client libraries as the real APIs do."""

import base64
import ipaddress
import os
import time
import uuid

import google_crc32c
import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, container_v1, lustre_v1, storage
from google.protobuf import field_mask_pb2
from google.rpc import code_pb2
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from conftest import until
from fakes.gcp import FakeGcp

pytestmark = pytest.mark.servers

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


# -- Managed Lustre: exportData and importData ---------------------------------------------------
INSTANCE = f"projects/{P}/locations/{ZONE}/instances/fs"
EXPORT, IMPORT = lustre_v1.TransferType.EXPORT, lustre_v1.TransferType.IMPORT


@pytest.fixture
def transfers(gcs, tmp_path):
    """A fake whose transfers use the session's fake-gcs-server, with an ACTIVE instance "fs"; an empty bucket."""
    server = FakeGcp(operation_seconds=0.05, storage_endpoint=gcs.url, files_root=tmp_path / "lustre").start()
    server.put("lustre_instance", "fs", lustre_instance(INSTANCE, "ACTIVE"))
    client = storage.Client(project=P, credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs.url})
    bucket = client.create_bucket(f"transfers-{uuid.uuid4().hex[:12]}")
    yield server, bucket
    server.stop()


def lustre_instance(name: str, state: str) -> dict:
    return {"name": name, "state": state, "capacityGib": "18000", "perUnitStorageThroughput": "1000",
            "filesystem": "lfs", "network": f"projects/{P}/global/networks/net"}


def export(fake: FakeGcp, uri: str, path: str = "/", **fields):
    return gapic(fake, "lustre", lustre_v1.LustreClient).export_data(request=lustre_v1.ExportDataRequest(
        name=fields.pop("name", INSTANCE), lustre_path=lustre_v1.LustrePath(path=path),
        gcs_path=lustre_v1.GcsPath(uri=uri), **fields))


def import_(fake: FakeGcp, uri: str, path: str = "/", **fields):
    return gapic(fake, "lustre", lustre_v1.LustreClient).import_data(request=lustre_v1.ImportDataRequest(
        name=fields.pop("name", INSTANCE), gcs_path=lustre_v1.GcsPath(uri=uri),
        lustre_path=lustre_v1.LustrePath(path=path), **fields))


def finish(operation, seconds: float = 30.0):
    """Polls until the operation is done (operation.result() would poll too, backing off by the second)."""
    deadline = time.monotonic() + seconds
    while not operation.done():
        assert time.monotonic() < deadline, f"{operation.operation.name} never finished"
        time.sleep(0.01)
    return operation


def counters(operation) -> tuple[int, ...]:
    """(found, bytes found, skipped, bytes skipped, copied, bytes copied, failed, bytes failed)."""
    c = operation.metadata.operation_metadata.counters
    return (c.found_objects_count, c.bytes_found_count, c.objects_skipped_count, c.bytes_skipped_count,
            c.objects_copied_count, c.bytes_copied_count, c.objects_failed_count, c.bytes_failed_count)


def crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def write(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def test_an_export_copies_every_file_under_its_relative_path_and_counts_while_it_runs(transfers):
    fake, bucket = transfers
    files = {"a/b/c.bin": os.urandom(3000), "a/b/d/empty.bin": b"", "a/top.json": b'{"step": 7}',
             "a/f.bin": os.urandom(1)}
    write(fake.lustre_files("fs"), {**files, "elsewhere/z.bin": b"not under /a/"})
    total = sum(len(data) for data in files.values())

    fake.operation_seconds = 1.5  # the copies are spread over it
    operation = export(fake, f"gs://{bucket.name}/x/", "/a/")
    fake.operation_seconds = 0.05
    started = operation.metadata.operation_metadata
    assert started.transfer_type == EXPORT and operation.metadata.target == INSTANCE
    assert (started.source_lustre_path.path, started.destination_gcs_path.uri) == ("/a/", f"gs://{bucket.name}/x/")
    assert counters(operation) == (4, total, 0, 0, 0, 0, 0, 0)  # what it will copy is known from the start
    copied, deadline = [0], time.monotonic() + 30
    while not operation.done():  # the progress as a client polling it sees it, until the operation is done
        assert time.monotonic() < deadline, f"{operation.operation.name} never finished"
        copied.append(counters(operation)[4])
        time.sleep(0.01)
    assert copied == sorted(copied) and any(0 < count < 4 for count in copied), copied
    assert counters(operation) == (4, total, 0, 0, 4, total, 0, 0)
    assert isinstance(operation.result(), lustre_v1.ExportDataResponse)
    assert operation.metadata.verb == "exportData" and operation.metadata.end_time

    objects = {blob.name: blob for blob in bucket.client.list_blobs(bucket)}
    assert set(objects) == {"x/b/c.bin", "x/b/d/empty.bin", "x/top.json", "x/f.bin"}
    for name, data in files.items():
        blob = objects["x/" + name.removeprefix("a/")]
        assert (blob.size, blob.crc32c) == (len(data), crc32c(data)), name
    assert [r.path.rsplit(":", 1)[-1] for r in fake.mutations()] == ["exportData"]


def test_a_second_export_copies_only_what_changed_and_deletes_nothing(transfers):
    fake, bucket = transfers
    root = fake.lustre_files("fs")
    write(root, {"ckpt/1.bin": b"one", "ckpt/2.bin": b"two", "ckpt/3.bin": b"three"})
    assert counters(finish(export(fake, f"gs://{bucket.name}/"))) == (3, 11, 0, 0, 3, 11, 0, 0)
    assert counters(finish(export(fake, f"gs://{bucket.name}/"))) == (0, 0, 3, 11, 0, 0, 0, 0)
    (root / "ckpt/2.bin").write_bytes(b"TWO")  # same size, other bytes
    (root / "ckpt/3.bin").unlink()
    again = finish(export(fake, f"gs://{bucket.name}"))  # the bucket alone: no trailing slash needed
    assert counters(again) == (1, 3, 1, 3, 1, 3, 0, 0)
    assert {blob.name: blob.download_as_bytes() for blob in bucket.client.list_blobs(bucket)} == {
        "ckpt/1.bin": b"one", "ckpt/2.bin": b"TWO", "ckpt/3.bin": b"three"}


def test_an_import_copies_the_objects_under_the_prefix_into_an_existing_directory_byte_for_byte(transfers):
    fake, bucket = transfers
    shard = os.urandom(70_000)
    for name, data in {"in/ckpt/shard-0.bin": shard, "in/ckpt/meta.json": b"{}", "in/ckpt/": b"",
                       "elsewhere/x.bin": b"x"}.items():
        bucket.blob(name).upload_from_string(data)
    root = fake.lustre_files("fs")

    missing = finish(import_(fake, f"gs://{bucket.name}/in/", "/restore"))
    with pytest.raises(gexc.NotFound, match="/restore does not exist"):  # LustrePath: "must already exist"
        missing.result()
    assert missing.metadata.operation_metadata.error_summaries[0].error_code == code_pb2.NOT_FOUND

    write(root, {"restore/ckpt/meta.json": b"{}"})  # already there, the same: skipped
    operation = import_(fake, f"gs://{bucket.name}/in/", "/restore/")
    assert operation.metadata.operation_metadata.transfer_type == IMPORT
    assert operation.metadata.operation_metadata.destination_lustre_path.path == "/restore/"
    assert counters(finish(operation)) == (1, len(shard), 1, 2, 1, len(shard), 0, 0)
    assert isinstance(operation.result(), lustre_v1.ImportDataResponse)
    assert (root / "restore/ckpt/shard-0.bin").read_bytes() == shard
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "restore/ckpt/meta.json", "restore/ckpt/shard-0.bin"]


def test_a_transfer_google_refuses_is_refused_before_it_starts(transfers):
    fake, bucket = transfers
    with pytest.raises(gexc.BadRequest, match="must end with a forward slash"):
        export(fake, f"gs://{bucket.name}/x")
    with pytest.raises(gexc.BadRequest, match="must end with a forward slash"):
        import_(fake, f"gs://{bucket.name}/in")
    with pytest.raises(gexc.BadRequest, match="must start with '/'"):
        export(fake, f"gs://{bucket.name}/", "a/")
    with pytest.raises(gexc.BadRequest, match="gcs_path.uri is required"):
        export(fake, "")
    with pytest.raises(gexc.BadRequest, match="gs://<bucket_name>"):
        export(fake, f"s3://{bucket.name}/")
    with pytest.raises(gexc.BadRequest, match="must be a UUID"):
        export(fake, f"gs://{bucket.name}/", request_id="retry-1")
    with pytest.raises(gexc.NotFound):
        export(fake, f"gs://{bucket.name}/", name=f"projects/{P}/locations/{ZONE}/instances/nothing")
    fake.put("lustre_instance", "young", lustre_instance(f"projects/{P}/locations/{ZONE}/instances/young", "CREATING"))
    with pytest.raises(gexc.BadRequest, match="CREATING: data can be transferred when it is ACTIVE"):
        import_(fake, f"gs://{bucket.name}/", name=f"projects/{P}/locations/{ZONE}/instances/young")
    assert not fake.mutations(), "a refused transfer started something"


def test_one_transfer_runs_per_instance_and_a_retried_request_gets_its_operation(transfers):
    fake, bucket = transfers
    write(fake.lustre_files("fs"), {"f.bin": b"f"})
    request_id = str(uuid.uuid4())
    with fake.holding_operations():
        first = export(fake, f"gs://{bucket.name}/", request_id=request_id)
        with pytest.raises(gexc.Conflict, match="unable to queue the operation"):
            import_(fake, f"gs://{bucket.name}/")
        assert export(fake, f"gs://{bucket.name}/", request_id=request_id).operation.name == first.operation.name
    assert counters(finish(first))[4] == 1
    assert counters(finish(import_(fake, f"gs://{bucket.name}/"))) == (0, 0, 1, 1, 0, 0, 0, 0)


def test_a_missing_bucket_or_lustre_path_fails_the_operation(transfers):
    fake, _ = transfers
    write(fake.lustre_files("fs"), {"f.bin": b"f"})
    nowhere = finish(export(fake, "gs://no-such-bucket-for-lustre/x/"))
    with pytest.raises(gexc.NotFound, match="gs://no-such-bucket-for-lustre does not exist"):
        nowhere.result()
    (summary,) = nowhere.metadata.operation_metadata.error_summaries
    assert (summary.error_code, summary.error_count) == (code_pb2.NOT_FOUND, 1)
    assert counters(nowhere)[4] == 0
    with pytest.raises(gexc.NotFound, match="Lustre path /gone/ does not exist"):
        finish(export(fake, "gs://no-such-bucket-for-lustre/", "/gone/")).result()


def test_a_transfer_that_fails_part_way_counts_what_failed_and_ends_with_an_error(transfers):
    fake, bucket = transfers
    files = {f"shard-{i}.bin": os.urandom(100 + i) for i in range(4)}
    write(fake.lustre_files("fs"), files)
    fake.fail_transfers(1, copied=1, code=code_pb2.PERMISSION_DENIED, message="storage.objects.create denied")
    operation = finish(export(fake, f"gs://{bucket.name}/run/"))
    with pytest.raises(gexc.PermissionDenied, match="3 of 4 objects failed"):
        operation.result()
    sizes = [len(files[name]) for name in sorted(files)]
    assert counters(operation) == (4, sum(sizes), 0, 0, 1, sizes[0], 3, sum(sizes[1:]))
    (summary,) = operation.metadata.operation_metadata.error_summaries
    assert (summary.error_code, summary.error_count) == (code_pb2.PERMISSION_DENIED, 3)
    assert [entry.uri for entry in summary.error_log_entries] == [
        f"gs://{bucket.name}/run/shard-{i}.bin" for i in (1, 2, 3)]
    assert [blob.name for blob in bucket.client.list_blobs(bucket)] == ["run/shard-0.bin"]
    retried = finish(export(fake, f"gs://{bucket.name}/run/"))  # the hook was for one transfer
    assert counters(retried) == (3, sum(sizes[1:]), 1, sizes[0], 3, sum(sizes[1:]), 0, 0)


def test_an_instances_files_are_its_own_and_go_with_it_and_with_the_fake():
    fake = FakeGcp(operation_seconds=0.05).start()
    fake.put("lustre_instance", "fs", lustre_instance(INSTANCE, "ACTIVE"))
    root = fake.lustre_files(INSTANCE)
    write(root, {"f.bin": b"f"})
    assert fake.lustre_files("fs") == root and fake.lustre_files("other") != root
    finish(gapic(fake, "lustre", lustre_v1.LustreClient).delete_instance(name=INSTANCE))
    assert not root.exists()  # deleted data is not recoverable (managed-lustre/docs/back-up-instance-data)
    fake.stop()
    assert not root.parent.exists()


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
    # The fake's clock stands still while the cluster is being created: what GKE says meanwhile does not depend on
    # how fast this machine answers.
    frozen: list[float | None] = [time.time()]
    fake.clock = lambda: time.time() if frozen[0] is None else frozen[0]
    fake.operation_seconds = 0.3
    create = gke.create_cluster(parent=location, cluster=cluster)
    fake.operation_seconds = 0.05
    assert gke.get_cluster(name=f"{location}/clusters/c").status == container_v1.Cluster.Status.PROVISIONING
    extra = container_v1.AdditionalNodeNetworkConfig(network="extra", subnetwork="extra-sub")
    gpu = container_v1.NodePool(name="gpu", config=container_v1.NodeConfig(machine_type="a3-ultragpu-8g"),
                                network_config=container_v1.NodeNetworkConfig(additional_node_network_configs=[extra]))
    with pytest.raises(gexc.BadRequest, match="Cluster is currently being created, deleted, updated or repaired"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=gpu)  # while the cluster is created
    frozen[0] = None
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
    # Every accepted insert's operation ends (they run 0.05 s); a refused one did nothing.
    until(lambda: set(fake.resources("network")) == set(accepted), "the accepted inserts to be done", timeout=10)

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
            lustre.create_instance(parent=f"projects/{P}/locations/{ZONE}", instance_id="lfs",
                                   instance=lustre_v1.Instance(
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


def test_a_workload_policy_is_a_regional_compute_resource_a_pool_names_and_holds(fake):
    """Compute's resourcePolicies through google-cloud-compute (discovery-checked like every collection), and the
    node pool's placementPolicy as GKE takes it: a named policy of the pool's region, within its topology's nodes,
    compact placement in one zone, A4X never without one, and a policy in use kept."""
    policies = gapic(fake, "compute", compute_v1.ResourcePoliciesClient)
    regional = gapic(fake, "compute", compute_v1.RegionOperationsClient)
    workload = compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology="1x72")
    with pytest.raises(gexc.BadRequest, match="acceleratorTopology and maxTopologyDistance"):
        policies.insert(project=P, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(
            name="wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_="HIGH_THROUGHPUT", accelerator_topology="1x72", max_topology_distance="BLOCK")))
    for workload_body, said in (({"type": "LOW_LATENCY"}, "(LOW_LATENCY)"),  # the discovery document's enum
                                ({"acceleratorTopology": "1x72"}, "needs a type")):
        refused = _post(fake, "compute", f"/compute/v1/projects/{P}/regions/{REGION}/resourcePolicies",
                        {"name": "wp", "workloadPolicy": workload_body})
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
    operation = policies.insert(project=P, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(
        name="wp", workload_policy=workload))
    assert regional.wait(project=P, region=REGION, operation=operation.name).status == DONE
    got = policies.get(project=P, region=REGION, resource_policy="wp")
    assert (got.workload_policy.accelerator_topology, got.region.rsplit("/", 1)[-1]) == ("1x72", REGION)
    assert [p.name for p in policies.list(project=P, region=REGION)] == ["wp"]
    assert not list(policies.list(project=P, region="europe-west4"))

    make_network(fake)
    gke = gapic(fake, "container", container_v1.ClusterManagerClient)
    location = f"projects/{P}/locations/{REGION}"
    cluster = container_v1.Cluster(name="c", network="net", initial_cluster_version="1.33",
                                   node_pools=[container_v1.NodePool(name="system", initial_node_count=1)])
    wait_gke(gke, location, gke.create_cluster(parent=location, cluster=cluster))
    compact = container_v1.NodePool.PlacementPolicy.Type.COMPACT
    gb200 = container_v1.NodeConfig(machine_type="a4x-highgpu-4g", accelerators=[container_v1.AcceleratorConfig(
        accelerator_type="nvidia-gb200", accelerator_count=4)])
    pool = container_v1.NodePool(name="gpu", locations=[ZONE], config=gb200, initial_node_count=0,
                                 autoscaling=container_v1.NodePoolAutoscaling(enabled=True, max_node_count=19))
    with pytest.raises(gexc.BadRequest, match="a4x-highgpu-4g nodes need a placement policy"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=pool)
    pool.placement_policy = container_v1.NodePool.PlacementPolicy(type_=compact, policy_name="missing")
    with pytest.raises(gexc.BadRequest, match="resource policy 'missing' was not found"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=pool)
    pool.placement_policy.policy_name = "wp"
    with pytest.raises(gexc.BadRequest, match=r"19 nodes of 4 GPUs do not fit accelerator topology 1x72 .*18 nodes"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=pool)
    pool.locations = [ZONE, f"{REGION}-c"]
    pool.autoscaling.max_node_count = 18
    with pytest.raises(gexc.BadRequest, match="single zone"):
        gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=pool)
    pool.locations = [ZONE]
    wait_gke(gke, location, gke.create_node_pool(parent=f"{location}/clusters/c", node_pool=pool))
    assert gke.get_node_pool(name=f"{location}/clusters/c/nodePools/gpu").placement_policy.policy_name == "wp"
    with pytest.raises(gexc.BadRequest, match="already being used by 'node pool gpu'"):
        policies.delete(project=P, region=REGION, resource_policy="wp")
    wait_gke(gke, location, gke.delete_node_pool(name=f"{location}/clusters/c/nodePools/gpu"))
    operation = policies.delete(project=P, region=REGION, resource_policy="wp")
    assert regional.wait(project=P, region=REGION, operation=operation.name).status == DONE
    assert not list(policies.list(project=P, region=REGION))


def artifactregistry(fake: FakeGcp):
    return discovery.build("artifactregistry", "v1", static_discovery=True, credentials=AnonymousCredentials(),
                           client_options={"api_endpoint": fake.endpoints["artifactregistry"]})


@pytest.mark.parametrize("repository_id, body, said", [
    ("nvcr", {"format": "DOCKER", "mode": "REMOTE_REPOSITORY"}, "needs a remoteRepositoryConfig"),
    ("nvcr", {"format": "DOCKER", "mode": "REMOTE_REPOSITORY", "remoteRepositoryConfig": {"dockerRepository": {
        "customRepository": {"uri": "http://nvcr.io"}}}}, "is not an https URI"),
    ("nvcr", {"format": "DOCKER", "remoteRepositoryConfig": {"dockerRepository": {"publicRepository": "DOCKER_HUB"}}},
     "only for a REMOTE_REPOSITORY"),
    ("Nvcr.io", {"format": "DOCKER"}, "Invalid repository ID"),
    ("nvcr-", {"format": "DOCKER"}, "Invalid repository ID"),
    ("nvcr", {"format": "DOCKER", "mode": "REMOTE"}, "mode"),  # not an enum value of the discovery document
    ("nvcr", {"format": "DOCKER", "registryUri": "x"}, "registryUri"),  # output only
])
def test_artifact_registry_refuses_what_google_refuses(fake, repository_id, body, said):
    repositories = artifactregistry(fake).projects().locations().repositories()
    with pytest.raises(HttpError) as refused:
        repositories.create(parent=f"projects/{P}/locations/us-central1", repositoryId=repository_id,
                            body=body).execute()
    assert refused.value.resp.status == 400 and said in str(refused.value)


def test_an_artifact_registry_remote_repository_is_created_and_deleted_by_operations_and_never_twice(fake):
    client = artifactregistry(fake)
    repositories, operations = client.projects().locations().repositories(), client.projects().locations().operations()
    parent, name = f"projects/{P}/locations/us-central1", f"projects/{P}/locations/us-central1/repositories/nvcr"
    body = {"format": "DOCKER", "mode": "REMOTE_REPOSITORY",
            "remoteRepositoryConfig": {"dockerRepository": {"customRepository": {"uri": "https://nvcr.io"}}}}

    def finished(operation: dict) -> dict:
        until(lambda: operations.get(name=operation["name"]).execute().get("done"), "the operation")
        return operations.get(name=operation["name"]).execute()

    created = repositories.create(parent=parent, repositoryId="nvcr", body=body).execute()
    assert not created.get("done")  # a long-running operation, not the repository
    assert finished(created)["response"]["registryUri"] == f"us-central1-docker.pkg.dev/{P}/nvcr"
    with pytest.raises(HttpError) as twice:
        repositories.create(parent=parent, repositoryId="nvcr", body=body).execute()
    assert twice.value.resp.status == 409
    assert finished(repositories.delete(name=name).execute()).get("error") is None
    with pytest.raises(HttpError) as gone:
        repositories.get(name=name).execute()
    assert gone.value.resp.status == 404


def test_a_request_whose_client_dies_before_its_body_is_whole_is_not_acted_on(fake):
    """A process killed mid-request (the crash tests kill apply at every step) sends headers and part of a body; a
    server acts on no such request (RFC 9112 section 6.3), so neither does the fake."""
    import socket
    from urllib.parse import urlsplit

    endpoint = urlsplit(fake.endpoints["artifactregistry"])
    body = b'{"format": "DOCKER", "mode": "REMOTE_REPOSITORY", "remoteRepositoryConfig": {}}'
    with socket.create_connection((endpoint.hostname, endpoint.port)) as connection:
        connection.sendall(f"POST {endpoint.path}/v1/projects/{P}/locations/us-central1/repositories?repositoryId=nvcr "
                           f"HTTP/1.1\r\nHost: {endpoint.netloc}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        connection.shutdown(socket.SHUT_WR)
        assert connection.recv(1024) == b""  # closed, unanswered
    assert fake.artifact_registry.repositories == {} and fake.requests == []
