"""`rlops doctor`: what would make `apply` fail part way, found before it starts. Read-only, every check at once.

Each check reads the project as the API that `apply` will meet reads it, and says ok, warn or fail,
what it found, and the fix. `apply` runs the checks first and stops before any change when one fails
(`--skip-doctor` overrides it).

Checked: the APIs `apply` calls are enabled (Service Usage); the caller holds the permissions `apply` needs on the
project (Resource Manager `testIamPermissions`) and may read each token secret (`testIamPermissions` on the
secret); each pool's machine type is offered in the zone with its accelerators; a pool's specific reservation
exists in the zone, for the machine type and accelerators, with enough unused VMs for `max_nodes`; the zone's
RDMA network profile exists (Compute); Compute's project and regional quotas cover what apply adds (networks,
subnetworks, firewalls, the PSA range, the system pool's vCPUs); the spec's GKE version (or its channel's
default) is offered and new enough for what the spec uses (GKE getServerConfig); Managed Lustre is offered in
the zone (the Lustre API's locations); a PSA range the spec places overlaps nothing on the network; the state
bucket exists (versioning: warn); each Secret Manager version
the spec names exists and is enabled (its metadata, never its value); once applied, rlops's functions are
deployed and the tick schedule is enabled (warnings).
the GPUs of the pools no reservation backs fit the region's GPU family quota (Cloud Quotas) less what other
VMs and unused reservations hold (Compute).
Not checked: the Spot-specific preemptible GPU quota and the all-regions GPU cap; Spot capacity (no API says it
before a VM is asked for); the permissions of a service account other than the caller.
"""

import ipaddress
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from rlops.cloud import compute
from rlops.cloud.base import CloudError, Connection, call, get_or_none
from rlops.permissions import Need, Scope, calls, roles_granting, said_with_roles
from rlops.provision.service import CloudEnvironment

# The APIs `apply` calls, by the service names Service Usage knows them by.
SERVICES = ("compute.googleapis.com", "container.googleapis.com", "lustre.googleapis.com",
            "servicenetworking.googleapis.com", "secretmanager.googleapis.com", "storage.googleapis.com")
# With `ray.image_cache`: the remote repository's API, and the Container File System API that GKE's image streaming
# reads images through (cloud.google.com/kubernetes-engine/docs/how-to/image-streaming, "Requirements").
IMAGE_CACHE_SERVICES = ("artifactregistry.googleapis.com", "containerfilesystem.googleapis.com")


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str   # ok, warn or fail
    found: str
    fix: str = ""


def examine(env: CloudEnvironment, connection: Connection, bucket, needs: tuple[Need, ...] = ()) -> list[Finding]:
    """Every check, in parallel; a check that cannot read what it needs fails saying why. `needs`: the permissions
    to test the caller for (`accounts.account("rlops-apply").needs()` before an apply); none, none tested."""
    with ThreadPoolExecutor(max_workers=len(CHECKS)) as pool, ThreadPoolExecutor(max_workers=16) as reading:
        reads = _Reads(connection, bucket, reading, needs)
        futures = [pool.submit(_guarded, check, env, reads) for check in CHECKS]
        return [finding for future in futures for finding in future.result()]


class _Reads:
    """What the checks read: the connection and the state bucket, and the API reads they share, each made once
    however many checks ask for it, and all of one check's at once (`all`)."""

    def __init__(self, connection: Connection, bucket, pool: ThreadPoolExecutor, needs: tuple[Need, ...]):
        self.connection, self.bucket, self._pool = connection, bucket, pool
        self.needs = needs
        self._started: dict[str, Future] = {}
        self._lock = threading.Lock()

    def start(self, key: str, api: str, read: Callable, missing_ok: bool = False) -> Future:
        """The read of `key`, started now or by an earlier ask; with `missing_ok`, None where it does not exist."""
        with self._lock:
            if key not in self._started:
                self._started[key] = self._pool.submit(get_or_none if missing_ok else call, api, f"read {key}", read)
            return self._started[key]

    def all(self, wanted: dict[str, tuple[str, Callable]]) -> dict:
        """{key: (api, read)} -> {key: its answer}, read in parallel; the first failure raises."""
        futures = {key: self.start(key, api, read) for key, (api, read) in wanted.items()}
        return {key: future.result() for key, future in futures.items()}

    def compute(self, client: type, method: str, **where) -> tuple[str, Callable]:
        return "compute", lambda: getattr(self.connection.gapic("compute", client), method)(**where)

    def listed(self, spec, kind: str) -> tuple[str, tuple[str, Callable]]:
        """The project's networks, firewalls or global addresses, or the region's subnetworks: (key, read), one
        list shared by the checks that ask (quotas, the PSA range)."""
        if kind == "subnetwork":
            return f"subnetworks of {spec.region}", self.compute(compute_v1.SubnetworksClient, "list",
                                                                 project=spec.project.id, region=spec.region)
        client = {"network": compute_v1.NetworksClient, "firewall": compute_v1.FirewallsClient,
                  "address": compute_v1.GlobalAddressesClient}[kind]
        return f"{kind}s of {spec.project.id}", self.compute(client, "list", project=spec.project.id)


def _guarded(check, env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    try:
        return check(env, reads)
    except CloudError as error:
        name = check.__name__.strip("_").replace("_", "-")
        return [Finding(name, "fail", f"could not check: {error}", "see the error; `rlops doctor` again")]


@calls("serviceusage.services.batchGet")
def _apis(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    client = reads.connection.discovery("serviceusage", "v1")
    parent = f"projects/{env.spec.project.id}"
    services = SERVICES + (IMAGE_CACHE_SERVICES if env.spec.ray.image_cache else ())
    request = client.services().batchGet(parent=parent, names=[f"{parent}/services/{s}" for s in services])
    answer = call("serviceusage", "read the project's services", request.execute)
    disabled = sorted(service["name"].rsplit("/", 1)[-1] for service in answer.get("services", [])
                      if service.get("state") != "ENABLED")
    if disabled:
        return [Finding("apis", "fail", f"not enabled: {', '.join(disabled)}",
                        f"gcloud services enable {' '.join(disabled)} --project={env.spec.project.id}")]
    return [Finding("apis", "ok", f"enabled: {', '.join(services)}")]


@calls("cloudresourcemanager.projects.testIamPermissions")
def _permissions(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """The caller's permissions on the project (Resource Manager `projects.testIamPermissions`, at most 100 a
    request): those of `reads.needs` granted on the project. The secrets' and the state bucket's are tested on
    them (`_secrets`, `_state_bucket`)."""
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.PROJECT})
    if not wanted:
        return []
    client = reads.connection.discovery("cloudresourcemanager", "v1")
    held: set[str] = set()
    for first in range(0, len(wanted), 100):
        request = client.projects().testIamPermissions(resource=env.spec.project.id,
                                                        body={"permissions": wanted[first:first + 100]})
        held |= set(call("cloudresourcemanager", "test the caller's permissions", request.execute)
                    .get("permissions", []))
    missing = [p for p in wanted if p not in held]
    if missing:
        return [Finding("permissions", "fail", "the caller lacks " + _with_roles(missing),
                        "grant those roles on the project to the account apply runs as (`rlops iam` lists them)")]
    return [Finding("permissions", "ok", f"the caller holds the {len(wanted)} permissions apply needs on the project")]


def _with_roles(permissions: list[str]) -> str:
    return ", ".join(said_with_roles(p) for p in permissions)


@calls("compute.machineTypes.get")
def _machine_types(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
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
def _reservations(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
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
def _quotas(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """Compute's project and regional quotas (limit less usage: what already runs is counted) against what apply
    would add: the networks, subnetworks, firewalls and PSA range the project does not hold yet, and the system
    pool's vCPUs at its maximum in each of its zones (its family's metric, where Compute lists one). The GPU
    pools: a reservation's VMs hold their quota already; Compute's quota list has no H200 or B200 metric (the
    Cloud Quotas API counts those: `_gpu_quota`)."""
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
def _gpu_quota(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """The GPUs of the pools no reservation backs, at `max_nodes`, within the region's GPU family quota (Cloud
    Quotas' GPUS-PER-GPU-FAMILY-per-project-region) less what is used: the GPUs of the family's VMs in the region
    that are not this pool's nodes, and the unused VMs of its reservations (reserved capacity holds quota).
    Not checked: the Spot-specific preemptible quota, and the project's all-regions GPU cap."""
    from google.cloud import cloudquotas_v1

    from rlops.spec import catalog

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


def _quota_limit(info, region: str, family: str) -> int:
    """The limit of the most specific of a QuotaInfo's dimension entries that covers (region, family)."""
    matching = [entry for entry in info.dimensions_infos
                if all(entry.dimensions.get(key) == value for key, value in
                       (("region", region), ("gpu_family", family)) if key in entry.dimensions)]
    return int(max(matching, key=lambda entry: len(entry.dimensions)).details.value) if matching else 0


# The GKE version the Ray operator add-on needs (seed-inventory G5, from Cluster Toolkit's docs); each GPU machine's
# network stack's is in the GPU catalog (`min_gke`). Unsure sources: a warning.
RAY_OPERATOR_MINIMUM_GKE = "1.29.8-gke.1054000"


@calls("container.projects.locations.getServerConfig")
def _gke_version(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """The spec's GKE version (or its release channel's default) is offered in the region (GKE getServerConfig),
    and it is at least the version each feature the spec uses needs."""
    from google.cloud import container_v1

    from rlops.spec import catalog

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
def _lustre_location(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """Managed Lustre is offered in the environment's zone (the Lustre API's locations). The tier needs no read:
    each of the four throughput tiers is offered wherever Lustre is, and the spec admits only those."""
    from google.cloud import lustre_v1
    from google.cloud.location import locations_pb2

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
def _psa_range(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
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
def _network_profile(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
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


@calls("secretmanager.projects.secrets.versions.get", "secretmanager.projects.secrets.testIamPermissions")
def _secrets(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """Each secret version the spec names exists and is enabled (its metadata, never its value), and the caller
    holds what it needs on the secret (`testIamPermissions` there: granted on the secret or the project)."""
    from google.cloud import secretmanager

    client = reads.connection.gapic("secretmanager", secretmanager.SecretManagerServiceClient)

    refs = sorted(env.spec.secrets.items())
    versions = [reads.start(ref.secret_manager, "secretmanager", lambda ref=ref: client.get_secret_version(
        name=ref.secret_manager), missing_ok=True) for _, ref in refs]
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.SECRET})
    permissions = [reads.start(f"the caller's permissions on {_secret_of(ref)}", "secretmanager",
                               lambda ref=ref: client.test_iam_permissions(
                                   request={"resource": _secret_of(ref), "permissions": wanted})) if wanted else None
                   for _, ref in refs]
    answers = [(name, ref, version.result(), [p for p in wanted if p not in held.result().permissions] if held else [])
               for (name, ref), version, held in zip(refs, versions, permissions, strict=True)]
    found = []
    for name, ref, version, lacking in answers:
        secret = _secret_of(ref)
        if version is None:
            found.append(Finding(f"secret {name}", "fail", f"{ref.secret_manager} does not exist",
                                 f"gcloud secrets versions add {secret.split('/')[3]} --data-file=- "
                                 f"--project={env.spec.project.id}"))
        elif version.state != version.State.ENABLED:
            found.append(Finding(f"secret {name}", "fail", f"{ref.secret_manager} is {version.state.name}",
                                 "enable the version, or add a new one"))
        elif lacking:
            found.append(Finding(f"secret {name}", "fail", f"the caller lacks {_with_roles(lacking)} on {secret}: "
                                 "apply reads its value into the cluster's Secret",
                                 f"gcloud secrets add-iam-policy-binding "
                                 f"{secret.split('/')[3]} --project={env.spec.project.id} --member=... "
                                 f"--role={roles_granting(lacking[0])[0]}"))
        else:
            found.append(Finding(f"secret {name}", "ok",
                                 f"{ref.secret_manager} is enabled, and the caller may read it"))
    return found


def _secret_of(ref) -> str:
    return ref.secret_manager.split("/versions/")[0]


@calls("storage.buckets.testIamPermissions")
def _state_bucket(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """The bucket exists and the caller holds what it needs there (`testIamPermissions`, which any caller may
    ask); its versioning is read only where the caller may read the bucket's metadata (storage.buckets.get: not
    in the object roles apply needs)."""
    bucket = reads.bucket
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.BUCKET})
    held = get_or_none("storage", f"test the caller's permissions on gs://{bucket.name}", bucket.test_iam_permissions,
                       [*wanted, VERSIONING_READ])
    if held is None:
        return [Finding("state-bucket", "fail", f"no bucket {bucket.name}",
                        f"gcloud storage buckets create gs://{bucket.name} --uniform-bucket-level-access")]
    lacking = [p for p in wanted if p not in held]
    if lacking:
        return [Finding("state-bucket", "fail", f"the caller lacks {_with_roles(lacking)} on gs://{bucket.name}",
                        f"gcloud storage buckets add-iam-policy-binding gs://{bucket.name} --member=... "
                        f"--role={roles_granting(lacking[0])[0]}")]
    found = [Finding("state-bucket", "ok", f"{bucket.name} exists" + ", and the caller holds what apply needs there"
                     * bool(wanted))]
    held = set(held)
    if VERSIONING_READ in held:
        bucket.reload()
        if not bucket.versioning_enabled:
            found.append(Finding("state-bucket", "warn", "object versioning is off: an overwritten record cannot be "
                                 "recovered", f"gcloud storage buckets update gs://{bucket.name} --versioning"))
    return found


VERSIONING_READ = "storage.buckets.get"


FUNCTIONS = tuple(f"rlops-{target}" for target in ("train", "watch", "snapshot", "reap"))  # cloudbuild/deploy.yaml
TICK_JOB = "rlops-tick"


@calls("cloudfunctions.projects.locations.functions.list", "cloudscheduler.projects.locations.jobs.get")
def _deployment(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """For an environment apply has made: rlops's functions are deployed and ACTIVE (Cloud Functions, every
    location) and the schedule that ticks them exists and is ENABLED (Cloud Scheduler, the functions'
    location). Without them a train message starts nothing and no one watches runs or reaps idle pools; apply
    itself needs neither, so a gap is a warning. Not checked: which specs the functions carry, and how many
    messages wait on the dead-letter subscription (Pub/Sub counts a backlog only in Cloud Monitoring)."""
    from rlops.state.resources import ResourceRecord

    try:
        applied = bool(ResourceRecord(reads.bucket, env.spec.state.prefix, env.name).load().resources)
    except gexc.NotFound:  # no state bucket: said by its own check
        applied = False
    if not applied:
        return []
    project = env.spec.project.id
    functions = reads.connection.discovery("cloudfunctions", "v2").projects().locations().functions()
    listed, request = [], functions.list(parent=f"projects/{project}/locations/-")
    while request is not None:  # in pages: one alone may miss rlops's functions
        page = call("cloudfunctions", "list the project's functions", request.execute)
        listed += page.get("functions", [])
        request = functions.list_next(request, page)
    ours = {function["name"].rsplit("/", 1)[-1]: function for function in listed
            if function["name"].rsplit("/", 1)[-1] in FUNCTIONS}
    deploy = f"the deploy pipeline (cloudbuild/deploy.yaml) in {project}"
    found = []
    missing = [name for name in FUNCTIONS if name not in ours]
    broken = [f"{name} {function.get('state')}" for name, function in sorted(ours.items())
              if function.get("state") != "ACTIVE"]
    if missing or broken:
        found.append(Finding("functions", "warn", "; ".join(filter(None, [
            missing and f"not deployed: {', '.join(missing)}", broken and f"not active: {', '.join(broken)}"])),
            f"run {deploy}"))
    else:
        found.append(Finding("functions", "ok", f"{', '.join(FUNCTIONS)} active"))
    if not ours:
        return found
    location = next(iter(ours.values()))["name"].split("/")[3]
    jobs = reads.connection.discovery("cloudscheduler", "v1").projects().locations().jobs()
    job = get_or_none("cloudscheduler", f"get the {TICK_JOB} schedule",
                      jobs.get(name=f"projects/{project}/locations/{location}/jobs/{TICK_JOB}").execute)
    if job is None or job.get("state") != "ENABLED":
        found.append(Finding("schedule", "warn", f"{TICK_JOB} in {location} " + (
            "does not exist" if job is None else f"is {job.get('state')}") + ": no tick watches runs or reaps idle "
            "pools", f"run {deploy}" if job is None else
            f"gcloud scheduler jobs resume {TICK_JOB} --project={project} --location={location}"))
    else:
        found.append(Finding("schedule", "ok", f"{TICK_JOB} in {location}, {job.get('schedule')}"))
    return found


@calls("compute.projects.get", "iam.projects.serviceAccounts.testIamPermissions")
def _node_account(env: CloudEnvironment, reads: _Reads) -> list[Finding]:
    """The caller may act as the account the nodes run as (GKE refuses to create a cluster or node pool
    otherwise): the Compute Engine default service account, as the spec names none."""
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.NODE_SERVICE_ACCOUNT})
    if not wanted:
        return []
    project = reads.all({"project": reads.compute(compute_v1.ProjectsClient, "get", project=env.spec.project.id)})
    account = f"{project['project'].id}-compute@developer.gserviceaccount.com"
    request = reads.connection.discovery("iam", "v1").projects().serviceAccounts().testIamPermissions(
        resource=f"projects/-/serviceAccounts/{account}", body={"permissions": wanted})
    held = set(call("iam", f"test the caller's permissions on {account}", request.execute).get("permissions", []))
    lacking = [p for p in wanted if p not in held]
    if lacking:
        return [Finding("node-service-account", "fail", f"the caller lacks {_with_roles(lacking)} on {account}, "
                        "which the cluster's nodes run as", f"gcloud iam service-accounts add-iam-policy-binding "
                        f"{account} --member=... --role={roles_granting(lacking[0])[0]}")]
    return [Finding("node-service-account", "ok", f"the caller may act as {account}")]


CHECKS = (_apis, _permissions, _node_account, _machine_types, _reservations, _network_profile, _secrets, _quotas,
          _gke_version, _lustre_location, _psa_range, _gpu_quota, _state_bucket, _deployment)


def failed(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.verdict == "fail"]


def render(findings: list[Finding], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps([asdict(finding) for finding in findings], indent=1)
    order = {"fail": 0, "warn": 1, "ok": 2}
    rows = [("CHECK", "VERDICT", "FOUND", "FIX")] + [
        (f.check, f.verdict.upper(), f.found, f.fix)
        for f in sorted(findings, key=lambda f: (order[f.verdict], f.check))]
    if fmt == "markdown":
        return "\n".join(["| check | verdict | found | fix |", "|---|---|---|---|"]
                         + [f"| {c} | {v.lower()} | {f} | {x} |" for c, v, f, x in rows[1:]]) + "\n"
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    indent = " " * (widths[0] + widths[1] + 4)
    return "\n".join(f"{c.ljust(widths[0])}  {v.ljust(widths[1])}  {f}" + (f"\n{indent}fix: {x}" if x and i else "")
                     for i, (c, v, f, x) in enumerate(rows)) + "\n"
