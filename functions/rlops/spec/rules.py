"""Rules that span several fields of a structurally valid spec: here those of its infrastructure (networks, pools,
cluster, Lustre, Ray), secrets and idle policy, and `check`, which runs them all; those of its recipes are in
`recipe_rules.py`.

Each rule yields `(path, message)` pairs: the path of the field that is wrong and a message of
the form "what is wrong; what would be right". No I/O: these are facts about the spec alone.
"""

import ipaddress
import re
from collections.abc import Callable, Iterator
from itertools import combinations

from rlops.spec import catalog
from rlops.spec.gcp_sections import Autoscaling, RayNode
from rlops.spec.model import GcpEnvironment, LocalEnvironment
from rlops.spec.recipe_rules import recipes
from rlops.spec.source import Finding, SpecPath, format_path

_SUFFIX = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "m": 1e-3}


def quantity(value: int | float | str) -> float:
    """A Kubernetes quantity as a plain number (cores, or bytes)."""
    if not isinstance(value, str):
        return float(value)
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", value)
    if match is None:  # the spec's Quantity pattern lets none through
        raise ValueError(f"{value} is not a Kubernetes quantity")
    number, suffix = match.groups()
    return float(number) * _SUFFIX[suffix]


def zone_in_region(env: GcpEnvironment) -> Iterator[Finding]:
    if not env.zone.startswith(env.region + "-"):
        yield ("zone",), f"zone {env.zone} is not in region {env.region}; use a zone such as {env.region}-b"


def cidrs_do_not_overlap(env: GcpEnvironment) -> Iterator[Finding]:
    ranges: list[tuple[tuple, ipaddress.IPv4Network]] = []
    nets = env.networks
    candidates = [(("networks", "gvnic", "subnet_cidr"), nets.gvnic.subnet_cidr)] if nets.gvnic else []
    candidates += [(("networks", "rdma", "subnet_cidrs", i), c) for i, c in enumerate(nets.rdma.subnet_cidrs)] \
        if nets.rdma else []
    candidates += [(("networks", "gpu_nics", "subnet_cidrs", i), c) for i, c in enumerate(nets.gpu_nics.subnet_cidrs)] \
        if nets.gpu_nics else []
    for path, text in candidates:
        try:
            ranges.append((path, ipaddress.IPv4Network(text, strict=True)))
        except ValueError as error:
            hint = f"use {ipaddress.IPv4Network(text, strict=False)}" if _loose(text) else "use e.g. 192.168.1.0/24"
            yield path, f"{error}; {hint}"
    psa = env.networks.private_service_access
    cidr = psa.address_cidr  # None when address is
    if cidr is not None:
        if _loose(cidr):
            network = ipaddress.IPv4Network(cidr, strict=False)
            if str(network.network_address) != psa.address:
                yield ("networks", "private_service_access", "address"), (
                    f"{psa.address} is not the start of a /{psa.prefix_length}; use {network.network_address}")
            else:
                ranges.append((("networks", "private_service_access", "address"), network))
        else:
            yield ("networks", "private_service_access", "address"), (
                f"{psa.address} is not an IPv4 address; use e.g. 10.112.0.0")
    if env.networks.cluster.auto_subnets:
        # First, so that an overlap is reported at the range the user typed rather than at auto_subnets.
        ranges.insert(0, (("networks", "cluster", "auto_subnets"),
                          ipaddress.IPv4Network(catalog.AUTO_MODE_SUBNET_RANGE)))
    for (path_a, net_a), (path_b, net_b) in combinations(ranges, 2):
        if net_a.overlaps(net_b):
            yield path_b, (f"{net_b} overlaps {net_a} at {format_path(path_a)}; "
                           "every pod and node range must be disjoint")
    for name in ("gvnic", "gpu_nics"):
        for i, text in enumerate(getattr(getattr(nets, name), "firewall_source_ranges", [])):
            if not _loose(text):
                yield ("networks", name, "firewall_source_ranges", i), (
                    f"{text} is not an IPv4 CIDR; use e.g. 192.168.0.0/16")


def _loose(text: str) -> bool:
    try:
        ipaddress.IPv4Network(text, strict=False)
        return True
    except ValueError:
        return False


# What each transport's machines need besides the cluster network (gpus/catalog.yaml, transports).
_NETWORKS_OF = {"gvnic-and-rdma": ("gvnic", "rdma"), "per-nic": ("gpu_nics",), "none": ()}


def gpu_networks(env: GcpEnvironment) -> Iterator[Finding]:
    """The networks the GPU machines' NICs need, and only those: GPUDirect-RDMA a gVNIC network and an RDMA network of
    a subnet per RDMA NIC, GPUDirect-TCPX(O) a VPC per GPU NIC, A2 none. One stack per environment: the pools share
    the in-cluster network objects and the NCCL installer."""
    machine = env.machine
    for i, pool in enumerate(env.gpu_pools[1:], start=1):
        other = catalog.GPU_MACHINES[pool.machine_type]
        if (other.transport, other.installer) != (machine.transport, machine.installer):
            yield ("gpu_pools", i, "machine_type"), (
                f"{pool.machine_type} uses {other.transport.title} but gpu_pools[0] ({machine.name}) uses "
                f"{machine.transport.title}; one environment builds one GPU network stack, so put this pool in an "
                "environment of its own")
    wanted = _NETWORKS_OF[machine.transport.extra_networks]
    for name in ("gvnic", "rdma", "gpu_nics"):
        given = getattr(env.networks, name) is not None
        if given and name not in wanted:
            yield ("networks", name), (f"{machine.name} ({machine.transport.title}) uses no networks.{name}; remove it"
                                       + (f" and give networks.{', networks.'.join(wanted)}" if wanted else ""))
        elif not given and name in wanted:
            yield ("networks",), f"{machine.name} ({machine.transport.title}) needs networks.{name}; add it"
    subnets = env.networks.rdma if "rdma" in wanted else env.networks.gpu_nics if "gpu_nics" in wanted else None
    if subnets is not None and len(subnets.subnet_cidrs) != machine.gpu_nics:
        name = "rdma" if "rdma" in wanted else "gpu_nics"
        yield ("networks", name, "subnet_cidrs"), (
            f"{len(subnets.subnet_cidrs)} subnets but {machine.name} has {machine.gpu_nics} GPU NICs; give exactly one "
            f"subnet per NIC ({machine.gpu_nics})")
    profile = env.networks.rdma.profile if env.networks.rdma else None
    if profile is not None and profile != catalog.rdma_network_profile(env.zone):
        yield ("networks", "rdma", "profile"), (
            f"profile {profile} is not the RDMA profile of zone {env.zone}; "
            f"use {catalog.rdma_network_profile(env.zone)} or leave it unset")


def accelerator_fits_machine(env: GcpEnvironment) -> Iterator[Finding]:
    for i, pool in enumerate(env.gpu_pools):
        machine = catalog.GPU_MACHINES[pool.machine_type]
        if pool.accelerator.type != machine.accelerator:
            yield ("gpu_pools", i, "accelerator", "type"), (
                f"{pool.machine_type} carries {machine.accelerator}, not {pool.accelerator.type}; "
                f"use {machine.accelerator}, or the machine type that carries {pool.accelerator.type}")
        if pool.accelerator.count != machine.accelerators_per_node:
            yield ("gpu_pools", i, "accelerator", "count"), (
                f"{pool.machine_type} has exactly {machine.accelerators_per_node} GPUs; "
                f"set count: {machine.accelerators_per_node}")
        if pool.spot and not machine.spot:
            yield ("gpu_pools", i, "spot"), (
                f"{pool.machine_type} is not offered as Spot VMs; it comes as {machine.capacity}: "
                "set reservation: NAME")


def pool_placement(env: GcpEnvironment) -> Iterator[Finding]:
    """Each pool's placement is one its machine offers, the one it requires if it requires one (A4X's workload
    policy), and within what that placement can hold: a 1x72 topology is one NVLink domain of 72 GPUs, 18 A4X
    nodes ("NODE_COUNT ... must be 18 nodes or less ... to obtain the GPU topology of 1x72 in one subblock",
    Cluster Toolkit's GKE A4X Max guide; its Slurm resume.py counts hosts per topology the same way). Compact
    placement needs a single zone, which rlops gives every GPU pool (env.zone)."""
    for i, pool in enumerate(env.gpu_pools):
        machine = catalog.GPU_MACHINES[pool.machine_type]
        offered = [placement.name for placement in machine.placements]
        required = machine.required_placement
        if required and pool.placement not in (None, required.name):
            yield ("gpu_pools", i, "placement"), (
                f"{pool.machine_type} pools need the {required.title} that GKE's A4X node pools name; set "
                f"placement: {required.name} or leave it unset")
        elif pool.placement not in (None, "none") and pool.placement not in offered:
            yield ("gpu_pools", i, "placement"), (
                f"{pool.machine_type} offers placement {' or '.join(offered) or 'none'}, not {pool.placement}; use "
                f"{' or '.join([*offered, 'none'])}")
        placement = pool.placement_used
        nodes = (placement.topology_gpus // machine.accelerators_per_node
                 if placement and placement.topology_gpus else None)
        if placement and nodes and pool.autoscaling.max_nodes > nodes:
            yield ("gpu_pools", i, "autoscaling", "max_nodes"), (
                f"{pool.autoscaling.max_nodes} nodes, but the {placement.accelerator_topology} workload policy holds "
                f"{nodes} {pool.machine_type} nodes ({placement.topology_gpus} GPUs, one NVLink domain); use at most "
                f"{nodes}, and another pool for more")
        if placement and placement.workload_type and len(env.workload_policy_name(pool)) > 63:
            yield ("gpu_pools", i, "name"), (
                f"the pool's workload policy is named CLUSTER-POOL, {env.workload_policy_name(pool)} "
                f"({len(env.workload_policy_name(pool))} characters), and a Compute name takes at most 63; shorten "
                "this name or cluster.name")


def pool_capacity(env: GcpEnvironment) -> Iterator[Finding]:
    names: dict[str, int] = {env.cluster.system_pool.name: -1}
    for i, pool in enumerate(env.gpu_pools):
        if pool.name in names:
            yield ("gpu_pools", i, "name"), f"node pool name {pool.name} is used twice; give each pool its own name"
        names[pool.name] = i
        if pool.reservation and pool.spot:
            yield ("gpu_pools", i, "spot"), "a pool consumes a reservation or runs on Spot, not both; remove one"
        if not pool.reservation and not pool.spot:
            yield ("gpu_pools", i), "no capacity source; set reservation: NAME or spot: true"
        yield from _autoscaling(pool.autoscaling, ("gpu_pools", i, "autoscaling"))
        if pool.ray_workers is not None and pool.ray_workers > pool.autoscaling.max_nodes:
            yield ("gpu_pools", i, "ray_workers"), (
                f"{pool.ray_workers} Ray workers need {pool.ray_workers} nodes but the pool grows to "
                f"{pool.autoscaling.max_nodes}; the rest would stay Pending. Use at most {pool.autoscaling.max_nodes}")
    if env.cluster.system_pool.autoscaling:
        yield from _autoscaling(env.cluster.system_pool.autoscaling, ("cluster", "system_pool", "autoscaling"))


def _autoscaling(scaling: Autoscaling, path: SpecPath) -> Iterator[Finding]:
    if scaling.min_nodes > scaling.max_nodes:
        yield path + ("min_nodes",), (
            f"min_nodes {scaling.min_nodes} is above max_nodes {scaling.max_nodes}; make min <= max")


def cluster_features(env: GcpEnvironment) -> Iterator[Finding]:
    cluster = env.cluster
    if cluster.multi_networking and not cluster.dataplane_v2:
        yield ("cluster", "dataplane_v2"), "multi-networking needs Dataplane V2; set dataplane_v2: true"
    if not cluster.multi_networking and env.machine.transport.extra_networks != "none":
        yield ("cluster", "multi_networking"), (
            f"the GPU pools attach the {env.machine.transport.title} NIC networks, which needs multi_networking: true")
    if env.ray.multi_nic and not cluster.multi_networking and env.machine.transport.extra_networks != "none":
        yield ("ray", "multi_nic"), "multi-NIC pods need cluster.multi_networking: true"
    if not cluster.addons.ray_operator:
        yield ("cluster", "addons", "ray_operator"), (
            "rlops runs the RayCluster through GKE's RayOperator add-on; set ray_operator: true")
    if not cluster.addons.lustre_csi_driver:
        yield ("cluster", "addons", "lustre_csi_driver"), (
            "the Ray pods mount Lustre through the Lustre CSI driver; set lustre_csi_driver: true")
    if not cluster.workload_identity:
        yield ("cluster", "workload_identity"), (
            "Ray pods reach Google APIs through workload identity; set workload_identity: true")


def one_namespace(env: GcpEnvironment) -> Iterator[Finding]:
    """The Ray pods and their service account in one namespace: Kubernetes' ServiceAccount admission refuses a
    pod whose serviceAccountName is not an account of the pod's own namespace, so KubeRay could make no pod.
    Refused here rather than the account silently following ray.namespace: the account's namespace is part of
    the workload-identity principal IAM is granted to (PROJECT.svc.id.goog[NAMESPACE/NAME]), which the user
    grants outside rlops, so moving it is the user's visible choice, and a spec that says `namespace: default`
    keeps meaning what it says."""
    account, ray = env.cluster.service_account.namespace, env.ray.namespace
    if account != ray:
        yield ("cluster", "service_account", "namespace"), (
            f"the service account is in namespace {account} but the Ray pods run in {ray} (ray.namespace), and a "
            f"pod can use only a service account of its own namespace; set namespace: {ray} here (and grant IAM "
            f"to {ray}/{env.cluster.service_account.name}), or ray.namespace: {account}")


def lustre_tier(env: GcpEnvironment) -> Iterator[Finding]:
    lustre = env.lustre
    tier = catalog.LUSTRE_TIERS[lustre.throughput_mb_per_tib]
    capacity, speed = lustre.capacity_gib, lustre.throughput_mb_per_tib
    step = tier.step_at(capacity)
    if capacity < tier.minimum:
        yield ("lustre", "capacity_gib"), f"at {speed} MB/s/TiB the minimum is {tier.minimum} GiB; use {tier.minimum}"
    elif capacity > tier.maximum:
        yield ("lustre", "capacity_gib"), f"at {speed} MB/s/TiB the maximum is {tier.maximum} GiB"
    elif capacity % step:
        lower = capacity // step * step
        yield ("lustre", "capacity_gib"), (
            f"at {speed} MB/s/TiB capacity goes in steps of {step} GiB "
            f"({'from ' + str(tier.minimum) if step == tier.minimum else 'above ' + str(tier.threshold)}); "
            f"use {lower} or {lower + step}")
    if env.networks.private_service_access.address is None:
        yield ("networks", "private_service_access"), (
            "the Lustre servers reach the nodes from the peered range, and the firewall for it needs that range; set "
            "address (e.g. 10.112.0.0; for a range Google placed already, its address: gcloud compute addresses "
            "describe RANGE --global --format='value(address)')")
    if lustre.gke_support != env.cluster.addons.lustre_legacy_port:
        yield ("lustre", "gke_support"), (
            f"gke_support is {str(lustre.gke_support).lower()} but cluster.addons.lustre_legacy_port is "
            f"{str(env.cluster.addons.lustre_legacy_port).lower()}; the two go together, set both to the same value")


def ray_cluster(env: GcpEnvironment) -> Iterator[Finding]:
    ray = env.ray
    if ray.image.endswith(":latest"):
        yield ("ray", "image"), (
            "the image is not pinned; use a version tag such as nvcr.io/nvidia/nemo-rl:v0.5.0 or a digest")
    shipped = catalog.NEMO_RL_IMAGE_RAY.get(ray.image)
    if shipped and shipped != ray.ray_version:
        yield ("ray", "ray_version"), (
            f"{ray.image} ships Ray {shipped}, not {ray.ray_version}; set ray_version: \"{shipped}\"")
    system = catalog.CPU_MACHINES.get(env.cluster.system_pool.machine_type)
    if system:
        yield from _fits(ray.head, system.vcpus, system.memory_gib, ("ray", "head"),
                         f"system pool machine {env.cluster.system_pool.machine_type}")
    for pool in env.gpu_pools:
        machine = catalog.GPU_MACHINES[pool.machine_type]
        yield from _fits(ray.worker, machine.vcpus, machine.memory_gib, ("ray", "worker"),
                         f"GPU machine {pool.machine_type}")
    tuned = {pool.accelerator.type for pool in env.gpu_pools
             if catalog.GPU_MACHINES[pool.machine_type].nccl_tuner_config}
    for accelerator in sorted(tuned - set(ray.nccl_tuner_config)):
        yield ("ray", "nccl_tuner_config"), f"no tuner config for {accelerator}; add {accelerator}: PATH"


def _fits(node: RayNode, vcpus: int, memory_gib: float, path: SpecPath, where: str) -> Iterator[Finding]:
    # GKE keeps back part of every node for itself, so a pod asking for the whole machine stays Pending.
    usable_cpus, usable_gib = vcpus - 2, int(memory_gib * 0.85)
    if quantity(node.cpu) > usable_cpus:
        yield path + ("cpu",), (
            f"{node.cpu} CPUs do not fit {where} ({vcpus} vCPUs, less GKE's reserve); ask for at most {usable_cpus}")
    if quantity(node.memory) > usable_gib * 2**30:
        yield path + ("memory",), (
            f"{node.memory} does not fit {where} ({memory_gib:g} GiB, less GKE's reserve); "
            f"ask for at most {usable_gib}Gi")


def secrets_and_idle(env: GcpEnvironment | LocalEnvironment) -> Iterator[Finding]:
    gcp = isinstance(env, GcpEnvironment)
    for name, ref in env.secrets.items():
        sources = [source for source in ("secret_manager", "env", "file") if getattr(ref, source) is not None]
        if len(sources) != 1:
            yield ("secrets", name), (
                f"{'no source' if not sources else 'several sources: ' + ', '.join(sources)}; "
                f"give exactly one of {'secret_manager' if gcp else 'env or file'}")
        elif gcp and sources != ["secret_manager"]:
            yield ("secrets", name, sources[0]), (
                "a GCP environment reads secrets from Secret Manager only; "
                "use secret_manager: projects/P/secrets/NAME/versions/latest")
        elif not gcp and sources == ["secret_manager"]:
            yield ("secrets", name, "secret_manager"), (
                "the local environment has no Secret Manager; use env: VAR or file: PATH")
    if not gcp and "node-pools" in env.idle.scale_down:
        yield ("idle", "scale_down"), "the local environment has no node pools; use [ray-workers]"
    if gcp and env.cluster.addons.lustre_multi_nic:
        yield ("cluster", "addons", "lustre_multi_nic"), (
            "true needs every standard NIC of a node in one VPC, and the GPU nodes' second gVNIC NIC is in "
            "networks.gvnic, another VPC, where Lustre cannot be reached; leave it false (Lustre uses the primary NIC)")
    if gcp and "node-pools" in env.idle.scale_down and "ray-workers" not in env.idle.scale_down:
        yield ("idle", "scale_down"), (
            "[node-pools] alone saves nothing: the RayCluster's workers stay, go Pending on the removed nodes, and "
            "GKE's cluster autoscaler brings the nodes back for them; use [ray-workers, node-pools]")
    if gcp and "node-pools" in env.idle.scale_down:
        for i, pool in enumerate(env.gpu_pools):
            if pool.autoscaling.min_nodes > 0:
                yield ("gpu_pools", i, "autoscaling", "min_nodes"), (
                    f"{pool.autoscaling.min_nodes}: the idle reaper resizes this pool to 0 and GKE's autoscaler would "
                    "bring it back to min_nodes; set min_nodes: 0, or idle.scale_down: [ray-workers]")


GCP_RULES: list[Callable] = [zone_in_region, cidrs_do_not_overlap, gpu_networks, accelerator_fits_machine,
                             pool_placement, pool_capacity, cluster_features, one_namespace, lustre_tier, ray_cluster,
                             recipes, secrets_and_idle]
LOCAL_RULES: list[Callable] = [recipes, secrets_and_idle]


def check(env: GcpEnvironment | LocalEnvironment) -> list[Finding]:
    rules = GCP_RULES if isinstance(env, GcpEnvironment) else LOCAL_RULES
    return [finding for rule in rules for finding in rule(env)]
