"""The doctor's checks of what the cloud offers where the spec asks: machine types, reservations, quotas (Compute's
and the GPU family's), GKE versions, Managed Lustre's locations, the PSA range, the RDMA network profile."""

import ipaddress
import re

from google.api_core import exceptions as gexc
from google.cloud import cloudquotas_v1, compute_v1, container_v1, lustre_v1
from google.cloud.location import locations_pb2

from rlops.cloud import compute
from rlops.cloud.base import CloudError, call, get_or_none
from rlops.permissions import calls
from rlops.provision.doctor.reads import Finding, Reads
from rlops.provision.service import CloudEnvironment
from rlops.spec import catalog


@calls("compute.machineTypes.get")
def machine_types(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """Each GPU pool's machine type is offered in the zone (compute `machineTypes.get`: 404 where it is not), with
    the accelerators the pool asks for."""
    spec, found = env.spec, []
    client = reads.connection.gapic("compute", compute_v1.MachineTypesClient)
    for pool in spec.gpu_pools:
        check = f"machine type {pool.machine_type}"
        offered = get_or_none("compute", f"get machine type {pool.machine_type}", client.get, project=spec.project.id,
                              zone=spec.zone, machine_type=pool.machine_type)
        if offered is None:
            found.append(Finding(check, "fail", f"{pool.machine_type} is not offered in {spec.zone}",
                                 f"gcloud compute machine-types list --filter=name={pool.machine_type} shows the zones "
                                 "that offer it; move the environment's zone"))
            continue
        accelerators = {a.guest_accelerator_type: a.guest_accelerator_count for a in offered.accelerators}
        if accelerators and accelerators.get(pool.accelerator.type) != pool.accelerator.count:
            found.append(Finding(check, "fail", f"{pool.machine_type} in {spec.zone} carries {accelerators}, the pool "
                                 f"asks for {pool.accelerator.count} x {pool.accelerator.type}",
                                 "match gpu_pools[].accelerator to the machine type"))
        else:
            found.append(Finding(check, "ok", f"offered in {spec.zone} with {pool.accelerator.count} x "
                                 f"{pool.accelerator.type}" + (" (as Spot VMs for this pool)" if pool.spot else "")))
    return found


@calls("compute.reservations.get")
def reservations(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    spec, found = env.spec, []
    for pool in spec.gpu_pools:
        if not pool.reservation:
            continue
        check = f"reservation {pool.reservation}"
        reservation = compute.reservation(reads.connection, spec.project.id, spec.zone, pool.reservation)
        if reservation is None:
            found.append(Finding(check, "fail", f"no reservation {pool.reservation} in {spec.zone}",
                                 f"name a reservation of {spec.zone} in gpu_pools[{pool.name}].reservation, or move "
                                 "the environment's zone to the reservation's"))
            continue
        reserved = reservation.specific_reservation
        machine = reserved.instance_properties.machine_type
        accelerators = {a.accelerator_type: a.accelerator_count
                        for a in reserved.instance_properties.guest_accelerators}
        unused = reserved.count - reserved.in_use_count
        wanted = pool.autoscaling.max_nodes
        if machine and machine != pool.machine_type:
            found.append(Finding(check, "fail", f"reserves {machine}, the pool asks for {pool.machine_type}",
                                 "set the pool's machine_type to the reservation's, or name another reservation"))
        elif accelerators and accelerators.get(pool.accelerator.type) != pool.accelerator.count:
            found.append(Finding(check, "fail", f"reserves accelerators {accelerators}, the pool asks for "
                                 f"{pool.accelerator.count} x {pool.accelerator.type}", "match the reservation"))
        elif unused < wanted:
            found.append(Finding(check, "fail", f"{unused} of {reserved.count} VMs unused; the pool may grow to "
                                 f"{wanted}", f"lower gpu_pools[{pool.name}].autoscaling.max_nodes to {unused}, or "
                                 "free VMs of the reservation"))
        else:
            found.append(Finding(check, "ok", f"{pool.machine_type} in {spec.zone}, {unused} of {reserved.count} VMs "
                                 f"unused, for up to {wanted}" + ("" if reservation.specific_reservation_required
                                                                  else "; also consumable by any matching VM")))
    return found


@calls("compute.projects.get", "compute.regions.get", "compute.machineTypes.get", "compute.networks.list",
       "compute.subnetworks.list", "compute.firewalls.list", "compute.globalAddresses.list")
def quotas(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """Compute's project and regional quotas (limit less usage: what already runs is counted) against what apply
    would add: the networks, subnetworks, firewalls and PSA range the project does not hold yet, and the system
    pool's vCPUs at its maximum in each of its zones (its family's metric, where Compute lists one). The GPU
    pools: a reservation's VMs hold their quota already; Compute's quota list has no H200 or B200 metric (the
    Cloud Quotas API counts those: `gpu_quota`)."""
    spec = env.spec
    project, region = spec.project.id, spec.region
    machine = spec.cluster.system_pool.machine_type
    lists = {kind: reads.listed(spec, kind) for kind in ("network", "subnetwork", "firewall", "address")}
    got = reads.all({
        "project": reads.compute(compute_v1.ProjectsClient, "get", project=project),
        f"region {region}": reads.compute(compute_v1.RegionsClient, "get", project=project, region=region),
        f"machine type {machine}": reads.compute(compute_v1.MachineTypesClient, "get", project=project,
                                                 zone=spec.zone, machine_type=machine),
        **dict(lists.values())})
    held = {kind: {item.name for item in got[key]} for kind, (key, _) in lists.items()}
    new = {kind: sum(1 for r in env.desired if r.kind == kind and r.name not in names) for kind, names in held.items()}
    quotas = {("the project", q.metric): q for q in got["project"].quotas}
    quotas.update({(region, q.metric): q for q in got[f"region {region}"].quotas})
    system = spec.cluster.system_pool
    family = f"{system.machine_type.split('-')[0].upper()}_CPUS"
    # A node pool's counts are per zone: max_nodes in each of its zones.
    zones = len(next(r.desired["node_locations"] for r in env.desired if r.key == f"node_pool/{system.name}"))
    nodes = (system.autoscaling.max_nodes if system.autoscaling else system.initial_nodes) * zones
    needs = {("the project", "NETWORKS"): new["network"], ("the project", "SUBNETWORKS"): new["subnetwork"],
             ("the project", "FIREWALLS"): new["firewall"],
             ("the project", "GLOBAL_INTERNAL_ADDRESSES"): new["address"],
             (region, family if (region, family) in quotas else "CPUS"):
                 got[f"machine type {machine}"].guest_cpus * nodes}
    found, covered = [], []
    for (scope, metric), need in needs.items():
        quota = quotas.get((scope, metric))
        if quota is None:
            continue
        free = int(quota.limit - quota.usage)
        if need > free:
            found.append(Finding(f"quota {metric}", "fail", f"apply needs {need}, {free} free of {int(quota.limit)} "
                                 f"in {scope}", f"request more {metric} in {scope} (Console: IAM & Admin > Quotas), or "
                                 "lower the spec's counts"))
        else:
            covered.append(f"{metric} {need} of {free} free")
    reserved = [f"{pool.name}: its reservation holds the GPU quota" for pool in spec.gpu_pools if pool.reservation]
    if not found:
        found.append(Finding("quotas", "ok", "; ".join(covered + reserved)))
    return found


GPU_FAMILY_QUOTA = "GPUS-PER-GPU-FAMILY-per-project-region"


GONE = ("TERMINATED", "STOPPED", "SUSPENDED")  # VMs that hold no GPU quota


@calls("cloudquotas.projects.locations.services.quotaInfos.get", "compute.instances.aggregatedList",
       "compute.reservations.aggregatedList")
def gpu_quota(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The GPUs of the pools no reservation backs, at `max_nodes`, within the region's GPU family quota (Cloud
    Quotas' GPUS-PER-GPU-FAMILY-per-project-region) less what is used: the GPUs of the family's VMs in the region
    that are not this pool's nodes, and the unused VMs of its reservations (reserved capacity holds quota).
    Not checked: the Spot-specific preemptible quota, and the project's all-regions GPU cap."""
    spec = env.spec
    pools = [pool for pool in spec.gpu_pools if not pool.reservation]
    if not pools:
        return []
    project, region = spec.project.id, spec.region
    quota_name = f"projects/{project}/locations/global/services/compute.googleapis.com/quotaInfos/{GPU_FAMILY_QUOTA}"
    quota = reads.start(GPU_FAMILY_QUOTA, "cloudquotas", lambda: reads.connection.gapic(
        "cloudquotas", cloudquotas_v1.CloudQuotasClient).get_quota_info(name=quota_name))
    got = reads.all({"instances": reads.compute(compute_v1.InstancesClient, "aggregated_list", project=project),
                     "reservations": reads.compute(compute_v1.ReservationsClient, "aggregated_list", project=project)})
    try:
        got["quota"] = quota.result()
    except CloudError as error:  # apply needs not the Cloud Quotas API: unread, the quota is not checked
        if not isinstance(error.__cause__, gexc.Forbidden):
            raise
        return [Finding("gpu-quota", "warn", f"not checked: {str(error)[:200]}",
                        f"gcloud services enable cloudquotas.googleapis.com --project={project}, and "
                        "roles/cloudquotas.viewer")]
    in_region = lambda zone: zone.rsplit("/", 1)[-1].startswith(f"{region}-")  # noqa: E731
    found, mine = [], {pool.name for pool in pools}
    for accelerator in sorted({pool.accelerator.type for pool in pools}):
        machine_type = next(p.machine_type for p in pools if p.accelerator.type == accelerator)
        family = catalog.GPU_MACHINES[machine_type].gpu_family
        limit = _quota_limit(got["quota"], region, family)
        used = sum(gpu.accelerator_count for scope, listed in got["instances"] if in_region(scope)
                   for vm in listed.instances if vm.status not in GONE and not (
                       vm.labels.get("goog-k8s-cluster-name") == spec.cluster.name
                       and vm.labels.get("goog-k8s-node-pool-name") in mine)
                   for gpu in vm.guest_accelerators if gpu.accelerator_type.endswith(f"/{accelerator}"))
        used += sum((r.specific_reservation.count - r.specific_reservation.in_use_count) * gpu.accelerator_count
                    for scope, listed in got["reservations"] if in_region(scope) for r in listed.reservations
                    for gpu in r.specific_reservation.instance_properties.guest_accelerators
                    if gpu.accelerator_type == accelerator)
        need = sum(p.accelerator.count * p.autoscaling.max_nodes for p in pools if p.accelerator.type == accelerator)
        check, where = f"gpu-quota {family}", f"{GPU_FAMILY_QUOTA} ({region}, {family})"
        if need > limit - used:
            found.append(Finding(check, "fail", f"the pools may grow to {need} GPUs; {where} is {limit}, {used} in use "
                                 f"by other VMs and reservations: {max(limit - used, 0)} free",
                                 f"gcloud beta quotas preferences create --quota-id={GPU_FAMILY_QUOTA} "
                                 f"--service=compute.googleapis.com --project={project} --dimensions=region={region},"
                                 f"gpu_family={family} --preferred-value={need + used}, or lower max_nodes"))
        else:
            found.append(Finding(check, "ok", f"{need} GPUs at max_nodes within {where} {limit}, {used} in use "
                                 "elsewhere (Spot pools: the preemptible quota is not checked)"))
    return found


def _quota_limit(info: cloudquotas_v1.QuotaInfo, region: str, family: str) -> int:
    """The limit of the most specific of a QuotaInfo's dimension entries that covers (region, family)."""
    matching = [entry for entry in info.dimensions_infos
                if all(entry.dimensions.get(key) == value for key, value in
                       (("region", region), ("gpu_family", family)) if key in entry.dimensions)]
    return int(max(matching, key=lambda entry: len(entry.dimensions)).details.value) if matching else 0


# The GKE version the Ray operator add-on needs (seed-inventory G5, from Cluster Toolkit's docs); each GPU machine's
# network stack's is in the GPU catalog (`min_gke`). Unsure sources: a warning.
RAY_OPERATOR_MINIMUM_GKE = "1.29.8-gke.1054000"


@calls("container.projects.locations.getServerConfig")
def gke_version(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The spec's GKE version (or its release channel's default) is offered in the region (GKE getServerConfig),
    and it is at least the version each feature the spec uses needs."""
    spec = env.spec
    client = reads.connection.gapic("container", container_v1.ClusterManagerClient)
    config = call("container", "read GKE's server config", client.get_server_config,
                  name=f"projects/{spec.project.id}/locations/{spec.region}")
    channel = spec.cluster.release_channel
    offered = next((list(c.valid_versions) for c in config.channels if c.channel.name == channel), [])
    default = next((c.default_version for c in config.channels if c.channel.name == channel), "")
    wanted = spec.cluster.version
    version = default if not wanted else next(
        (v for v in offered if v == wanted or v.startswith((wanted + ".", wanted + "-"))), None)
    if version is None:
        return [Finding("gke-version", "fail", f"{wanted} is not offered in the {channel} channel in {spec.region} "
                        f"(offered: {', '.join(offered)})", "set cluster.version to an offered one, or unset it for "
                        "the channel's default")]
    machines = [catalog.GPU_MACHINES[pool.machine_type] for pool in spec.gpu_pools]
    minimum = dict([("the Ray operator add-on", RAY_OPERATOR_MINIMUM_GKE)] * spec.cluster.addons.ray_operator + [
        (f"{machine.transport.title} on {machine.name}", machine.min_gke) for machine in machines if machine.min_gke])
    older = [f"{use} needs {needed}" for use, needed in minimum.items()
             if _version_key(version) < _version_key(needed)]
    if older:
        return [Finding("gke-version", "warn", f"{version} ({channel}) is older than {'; '.join(older)}",
                        "set cluster.version, or a faster release channel")]
    return [Finding("gke-version", "ok",
                    f"{version} ({'cluster.version ' + wanted if wanted else channel + ' default'})"
                    f", offered in {spec.region}")]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


@calls("lustre.projects.locations.list")
def lustre_location(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """Managed Lustre is offered in the environment's zone (the Lustre API's locations). The tier needs no read:
    each of the four throughput tiers is offered wherever Lustre is, and the spec admits only those."""
    spec = env.spec
    client = reads.connection.gapic("lustre", lustre_v1.LustreClient)
    listed = call("lustre", "list Managed Lustre locations", client.list_locations,
                  locations_pb2.ListLocationsRequest(name=f"projects/{spec.project.id}"))
    zones = sorted(location.location_id for location in listed.locations)
    if spec.zone not in zones:
        nearby = [zone for zone in zones if zone.startswith(spec.region)]
        return [Finding("lustre-location", "fail", f"Managed Lustre is not offered in {spec.zone}" + (
            f" (in {spec.region}: {', '.join(nearby)})" if nearby else f" nor anywhere in {spec.region}"),
            "move the environment's zone to one that offers both Lustre and the GPUs")]
    return [Finding("lustre-location", "ok", f"offered in {spec.zone}, {spec.lustre.throughput_mb_per_tib} MB/s "
                    "per TiB")]


@calls("compute.globalAddresses.list", "compute.subnetworks.list")
def psa_range(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The PSA range the spec places (`private_service_access.address`) overlaps nothing already on the cluster's
    network: another peering range, or a subnetwork (Compute refuses the address otherwise, after the networks
    are made)."""
    spec = env.spec
    psa = spec.networks.private_service_access
    wanted, network = ipaddress.IPv4Network(psa.address_cidr), spec.networks.cluster.name
    lists = {kind: reads.listed(spec, kind) for kind in ("address", "subnetwork")}
    got = reads.all(dict(lists.values()))
    taken = [(kind, item.name, (f"{item.address}/{item.prefix_length}" if item.address else None)
              if kind == "address" else item.ip_cidr_range)
             for kind, (key, _) in lists.items() for item in got[key]
             if item.network.rsplit("/", 1)[-1] == network and item.name != psa.range_name]
    clashes = [f"{kind} {name} ({cidr})" for kind, name, cidr in taken
               if cidr and wanted.overlaps(ipaddress.IPv4Network(cidr, strict=False))]
    if clashes:
        return [Finding("psa-range", "fail", f"{wanted} overlaps {', '.join(clashes)} on network {network}",
                        "move networks.private_service_access.address to a free range")]
    return [Finding("psa-range", "ok", f"{wanted} is free on network {network}")]


@calls("compute.networkProfiles.get")
def network_profile(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    spec = env.spec
    if spec.networks.rdma is None:  # only GPUDirect-RDMA's network is made in the zone's RoCE profile
        return []
    profile = spec.rdma_profile
    client = reads.connection.gapic("compute", compute_v1.NetworkProfilesClient)
    if get_or_none("compute", f"get network profile {profile}", client.get, project=spec.project.id,
                   network_profile=profile) is None:
        return [Finding("network-profile", "fail", f"no network profile {profile} in the project",
                        f"RDMA (RoCE) needs a zone whose profile is {spec.zone}-vpc-roce; choose a zone with A3 Ultra "
                        "or A4 RDMA, or set networks.rdma.profile")]
    return [Finding("network-profile", "ok", f"{profile} exists")]
