"""The cloud resources an environment spec asks for, as a dependency graph.

Each resource carries its desired fields in rlops's own flat vocabulary (not any API's JSON), so
the diff and its classification are plain dictionary work; the adapters in `rlops.cloud` are the
only place that knows how a field is spelled on the wire. No I/O here.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from rlops.ownership import labels_for
from rlops.resource_shapes import Resource
from rlops.spec import images
from rlops.spec.model import GcpEnvironment


class Mutability(Enum):
    MUTABLE = "mutable"          # changed in place by an update call
    IMMUTABLE = "immutable"      # a change means delete and create again
    GROW_ONLY = "grow-only"      # may increase in place; a decrease is refused


@dataclass(frozen=True)
class Kind:
    name: str
    fields: dict[str, Mutability]
    # Replacing or deleting one of these loses something that cannot be recreated as it was.
    destructive: bool


# The table's legend: one letter per mutability, so a kind's fields fit on a line or two.
M, I, G = Mutability.MUTABLE, Mutability.IMMUTABLE, Mutability.GROW_ONLY  # noqa: E741
KINDS = {k.name: k for k in [
    Kind("network", {"auto_create_subnetworks": I, "mtu": M, "network_profile": I, "routing_mode": M}, True),
    Kind("subnetwork", {"network": I, "region": I, "ip_cidr_range": I}, True),
    Kind("firewall", {"network": I, "direction": I, "allowed": M, "source_ranges": M}, False),
    Kind("address", {"network": I, "purpose": I, "address_type": I, "prefix_length": I, "address": I}, True),
    # A workload policy holds no data; Compute changes none of these in place (resourcePolicies.patch takes only
    # snapshot schedules and group placement), so a change replaces it, and the pools that name it with it.
    Kind("resource_policy", {"region": I, "workload_type": I, "accelerator_topology": I}, False),
    Kind("connection", {"network": I, "reserved_peering_ranges": M}, True),
    Kind("cluster", {
        "location": I, "network": I, "workload_pool": M, "datapath_provider": I, "enable_multi_networking": I,
        "use_ip_aliases": I, "release_channel": M, "min_master_version": M, "ray_operator": M, "lustre_csi_driver": M,
        "lustre_legacy_port": M, "lustre_multi_nic": M, "dns_endpoint": M}, True),
    Kind("node_pool", {
        "cluster": I, "machine_type": I, "disk_size_gb": I, "accelerator_type": I, "accelerator_count": I,
        "gpu_driver_version": I, "reservation": I, "spot": I, "additional_networks": I,
        # NodePool.placementPolicy is set at creation only (nodePools.update has no field for it).
        "placement_type": I, "placement_policy": I,
        # GKE changes a pool's zones in place (nodePools.update `locations`), adding or removing nodes.
        "node_locations": M, "autoscaling": M, "min_nodes": M, "max_nodes": M,
        # NodeConfig.gcfsConfig, which nodePools.update takes (UpdateNodePoolRequest.gcfsConfig): new nodes stream.
        "image_streaming": M}, True),
    Kind("lustre_instance", {
        "zone": I, "capacity_gib": G, "per_unit_storage_throughput": I, "filesystem": I, "network": I,
        "gke_support_enabled": I}, True),
    # The image cache: what it holds is fetched again from the upstream on the next pull, so nothing is lost with
    # it. A repository's format, mode and upstream are set at creation (repositories.patch changes neither the
    # mode nor the upstream); who may read it is its IAM policy (setIamPolicy).
    Kind("remote_repository", {"location": I, "upstream": I, "readers": M}, False),
]}


# Deleted only after these are gone, though not built on them: a cluster's pods mount the Lustre instance.
DELETED_AFTER = {"lustre_instance": ("cluster",)}


def build(env_name: str, env: GcpEnvironment) -> list[Resource]:
    """Every cloud resource of `env`, dependencies before dependents."""
    labels = labels_for(env_name)
    nets = env.networks
    cluster_net = nets.cluster.name

    def resource(kind: str, name: str, desired: dict, depends_on: Iterable[str] = (),
                 created_with: str | None = None) -> Resource:
        return Resource(kind, name, desired, tuple(depends_on), created_with, labels)

    graph = [resource("network", cluster_net, {"auto_create_subnetworks": nets.cluster.auto_subnets,
                                               "mtu": nets.cluster.mtu, "network_profile": None,
                                               "routing_mode": "REGIONAL"})]
    nic_networks = _gpu_nic_networks(env, resource)
    graph += nic_networks
    nic_subnets = [[r.desired["network"], r.name] for r in nic_networks if r.kind == "subnetwork"]
    psa = nets.private_service_access
    graph += [
        resource("address", psa.range_name, {"network": cluster_net, "purpose": "VPC_PEERING",
                                             "address_type": "INTERNAL", "prefix_length": psa.prefix_length,
                                             "address": psa.address},
                 [f"network/{cluster_net}"]),
        resource("connection", cluster_net, {"network": cluster_net, "reserved_peering_ranges": [psa.range_name]},
                 [f"address/{psa.range_name}"]),
    ]
    # The Lustre servers reach the nodes from the peered range, whatever the GKE support. Google's steps open
    # tcp:988,tcp:6988 from it for either case (the VPC setup of GKE's Managed Lustre guides, as in
    # AI-Hypercomputer/xpk's Lustre docs); which port is used, per "Lustre communication ports" of
    # docs.cloud.google.com/managed-lustre/docs/lustre-csi-driver-new-volume: 988 from GKE 1.33.2-gke.4780000 on,
    # 6988 (the legacy port) on older nodes and, on every node version, for an instance made with
    # gke-support-enabled. This rule opens the port in use, 6988 too only where that legacy port is.
    ports = ["988", "6988"] if env.lustre.gke_support else ["988"]
    graph.append(resource("firewall", f"{env.lustre.name}-lnet", {
        "network": cluster_net, "direction": "INGRESS", "source_ranges": [psa.address_cidr],
        "allowed": [["tcp", *ports]]}, [f"network/{cluster_net}"]))
    cluster = env.cluster
    system = cluster.system_pool
    graph.append(resource("cluster", cluster.name, {
        "location": env.region, "network": cluster_net, "workload_pool": f"{env.project.id}.svc.id.goog"
        if cluster.workload_identity else None,
        "datapath_provider": "ADVANCED_DATAPATH" if cluster.dataplane_v2 else "LEGACY_DATAPATH",
        "enable_multi_networking": cluster.multi_networking, "use_ip_aliases": cluster.ip_alias,
        "release_channel": cluster.release_channel, "min_master_version": cluster.version,
        "ray_operator": cluster.addons.ray_operator, "lustre_csi_driver": cluster.addons.lustre_csi_driver,
        "lustre_legacy_port": cluster.addons.lustre_legacy_port,
        "lustre_multi_nic": cluster.addons.lustre_multi_nic, "dns_endpoint": cluster.dns_endpoint,
        "system_pool": _system_pool_fields(env)}, [f"network/{cluster_net}"]))
    graph.append(resource("node_pool", system.name, _system_pool_fields(env), [f"cluster/{cluster.name}"],
                          created_with=f"cluster/{cluster.name}"))
    for pool in env.gpu_pools:
        placement, policy = pool.placement_used, None
        if placement and placement.workload_type:
            policy = env.workload_policy_name(pool)
            graph.append(resource("resource_policy", policy, {
                "region": env.region, "workload_type": placement.workload_type,
                "accelerator_topology": placement.accelerator_topology}))
        graph.append(resource("node_pool", pool.name, {
            "cluster": cluster.name, "machine_type": pool.machine_type, "disk_size_gb": pool.disk_size_gb,
            "accelerator_type": pool.accelerator.type, "accelerator_count": pool.accelerator.count,
            "gpu_driver_version": pool.accelerator.driver_version.upper(), "reservation": pool.reservation,
            "spot": pool.spot,
            "additional_networks": nic_subnets,
            "placement_type": placement.type if placement else "TYPE_UNSPECIFIED", "placement_policy": policy or "",
            "node_locations": [env.zone], "initial_node_count": pool.autoscaling.min_nodes, "autoscaling": True,
            "min_nodes": pool.autoscaling.min_nodes, "max_nodes": pool.autoscaling.max_nodes,
            "image_streaming": env.ray.image_cache,
        }, [f"cluster/{cluster.name}"] + [f"subnetwork/{sub}" for _, sub in nic_subnets]
           + ([f"resource_policy/{policy}"] if policy else [])))
    cache = images.upstream(env.ray.image) if env.ray.image_cache else None
    if cache is not None:
        graph.append(resource("remote_repository", cache.repository, {
            "location": env.region, "upstream": cache.remote, "readers": [f"serviceAccount:{node_account(env)}"]}))
    graph.append(resource("lustre_instance", env.lustre.name, {
        "zone": env.zone, "capacity_gib": env.lustre.capacity_gib,
        "per_unit_storage_throughput": env.lustre.throughput_mb_per_tib, "filesystem": env.lustre.filesystem,
        # Compared with the live instance, never sent: Google deprecated it, and rlops creates none with it.
        "network": cluster_net, "gke_support_enabled": env.lustre.gke_support}, [f"connection/{cluster_net}"]))
    return graph


def _gpu_nic_networks(env: GcpEnvironment, resource: Callable[..., Resource]) -> list[Resource]:
    """The networks, subnets and firewalls of the GPU machines' extra NICs, each subnet in NIC order (the order the
    node pool attaches them, and so eth1, eth2, ...): for GPUDirect-RDMA a gVNIC network with its subnet and
    internal firewall, then an RDMA network in the zone's RoCE profile with a subnet per RDMA NIC (GKE's A3 Ultra /
    A4 / A4X pages); for GPUDirect-TCPX(O) a network, subnet and internal firewall per GPU NIC, numbered from 1
    (cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx); for A2 none."""
    nets, graph = env.networks, []

    def vpc(name: str, mtu: int, profile: str | None = None) -> Resource:
        return resource("network", name, {"auto_create_subnetworks": False, "mtu": mtu, "network_profile": profile,
                                          "routing_mode": "REGIONAL"})

    def subnet(name: str, network: str, cidr: str) -> Resource:
        return resource("subnetwork", name, {"network": network, "region": env.region, "ip_cidr_range": cidr},
                        [f"network/{network}"])

    def internal(name: str, network: str, sources: list[str]) -> Resource:
        return resource("firewall", name, {"network": network, "direction": "INGRESS", "source_ranges": list(sources),
                                           "allowed": [["tcp", "0-65535"], ["udp", "0-65535"], ["icmp"]]},
                        [f"network/{network}"])

    if nets.gvnic is not None:
        network = f"{nets.gvnic.prefix}-net"
        graph += [vpc(network, nets.gvnic.mtu), subnet(f"{nets.gvnic.prefix}-sub", network, nets.gvnic.subnet_cidr),
                  internal(f"{nets.gvnic.prefix}-internal", network, nets.gvnic.firewall_source_ranges)]
    if nets.rdma is not None:
        network = f"{nets.rdma.prefix}-net"
        graph.append(vpc(network, nets.rdma.mtu,
                         f"projects/{env.project.id}/global/networkProfiles/{env.rdma_profile}"))
        graph += [subnet(f"{nets.rdma.prefix}-sub-{i}", network, cidr) for i, cidr in enumerate(nets.rdma.subnet_cidrs)]
    if nets.gpu_nics is not None:
        for n, cidr in enumerate(nets.gpu_nics.subnet_cidrs, start=1):
            prefix, network = nets.gpu_nics.prefix, f"{nets.gpu_nics.prefix}-net-{n}"
            graph += [vpc(network, nets.gpu_nics.mtu), subnet(f"{prefix}-sub-{n}", network, cidr),
                      internal(f"{prefix}-internal-{n}", network, nets.gpu_nics.firewall_source_ranges)]
    return graph


def _system_pool_fields(env: GcpEnvironment) -> dict:
    system = env.cluster.system_pool
    scaling = system.autoscaling
    return {"name": system.name, "cluster": env.cluster.name, "machine_type": system.machine_type,
            "disk_size_gb": system.disk_size_gb,
            "accelerator_type": None, "accelerator_count": 0, "gpu_driver_version": None, "reservation": None,
            # A regional cluster's pool is in three zones unless told, each with the node counts below; the Ray head
            # it holds belongs in the zone of the Lustre instance and the GPUs.
            "spot": False, "additional_networks": [], "node_locations": [env.zone],
            "initial_node_count": system.initial_nodes, "autoscaling": scaling is not None,
            "min_nodes": scaling.min_nodes if scaling else None, "max_nodes": scaling.max_nodes if scaling else None,
            # The Ray head runs the image too.
            "image_streaming": env.ray.image_cache}


def node_account(env: GcpEnvironment) -> str:
    """The nodes' service account: the Compute Engine default one, as rlops names none for its pools."""
    return f"{env.project.number}-compute@developer.gserviceaccount.com"


def topological(resources: list[Resource]) -> list[Resource]:
    """`resources` with every resource after the ones it depends on (stable otherwise)."""
    by_key = {r.key: r for r in resources}
    done: set[str] = set()
    ordered: list[Resource] = []

    def visit(resource: Resource, trail: tuple[str, ...]) -> None:
        if resource.key in done:
            return
        if resource.key in trail:
            raise ValueError(f"dependency cycle: {' -> '.join(trail + (resource.key,))}")
        for dependency in resource.depends_on:
            if dependency in by_key:
                visit(by_key[dependency], trail + (resource.key,))
        done.add(resource.key)
        ordered.append(resource)

    for resource in resources:
        visit(resource, ())
    return ordered
