"""`rlops doctor`: what would make `apply` fail part way, found before it starts. Read-only, every check at once.

Each check reads the project as the API that `apply` will meet reads it, and says ok, warn or fail,
what it found, and the fix. `apply` runs the checks first and stops before any change when one fails
(`--skip-doctor` overrides it).

Checked: the APIs `apply` calls are enabled (Service Usage); the caller holds the permissions `apply` needs on the
project (Resource Manager `testIamPermissions`); each pool's machine type is offered in the zone with its
accelerators; a pool's specific reservation exists in
the zone, for the machine type and accelerators, with enough unused VMs for `max_nodes`; the zone's
RDMA network profile exists (Compute); the state bucket exists (versioning and uniform access: warn);
each Secret Manager version the spec names exists and is enabled (its metadata, never its value).
Not checked yet, and said so: GPU quotas (A3 Ultra and A4 GPUs are counted by the Cloud Quotas API,
whose definition does not ship with the client libraries rlops uses, and Compute's regional quota
list has no H200 or B200 metric), the bucket's and the secrets' own IAM, GKE versions, Managed Lustre locations.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from google.cloud import compute_v1

from rlops.cloud.base import CloudError, Connection, call, get_or_none
from rlops.provision.service import CloudEnvironment

# The APIs `apply` calls, by the service names Service Usage knows them by.
SERVICES = ("compute.googleapis.com", "container.googleapis.com", "lustre.googleapis.com",
            "servicenetworking.googleapis.com", "secretmanager.googleapis.com", "storage.googleapis.com")


# What `apply` asks of the caller on the project, by the requests that need each (IAM's permissions reference).
PERMISSIONS = {
    "compute.networks.create": "networks.insert", "compute.subnetworks.create": "subnetworks.insert",
    "compute.firewalls.create": "firewalls.insert", "compute.globalAddresses.createInternal": "the PSA range",
    "servicenetworking.services.addPeering": "the private services access peering",
    "container.clusters.create": "clusters.create", "container.clusters.update": "node pools and cluster updates",
    "lustre.instances.create": "instances.create", "secretmanager.versions.access": "the token Secret's values",
    "storage.objects.create": "the state records (granted on the project or, else, on the bucket)",
}


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str   # ok, warn or fail
    found: str
    fix: str = ""


def examine(env: CloudEnvironment, connection: Connection, bucket) -> list[Finding]:
    """Every check, in parallel; a check that cannot read what it needs fails saying why."""
    checks = [_apis, _permissions, _machine_types, _reservations, _network_profile, _secrets,
              lambda env, connection: _state_bucket(bucket)]
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        futures = [pool.submit(_guarded, check, env, connection) for check in checks]
        found = [finding for future in futures for finding in future.result()]
    return found + [Finding("gpu-quota", "warn", "not checked: A3 Ultra and A4 GPU quotas are in the Cloud Quotas "
                            "API, which rlops does not read yet", f"gcloud beta quotas info list --project="
                            f"{env.spec.project.id} --service=compute.googleapis.com | grep -i -e h200 -e b200")]


def _guarded(check, env, connection) -> list[Finding]:
    try:
        return check(env, connection)
    except CloudError as error:
        name = getattr(check, "__name__", "check").strip("_").replace("_", "-")
        return [Finding(name, "fail", f"could not check: {error}", "see the error; `rlops doctor` again")]


def _apis(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    client = connection.discovery("serviceusage", "v1")
    parent = f"projects/{env.spec.project.id}"
    request = client.services().batchGet(parent=parent, names=[f"{parent}/services/{s}" for s in SERVICES])
    answer = call("serviceusage", "read the project's services", request.execute)
    disabled = sorted(service["name"].rsplit("/", 1)[-1] for service in answer.get("services", [])
                      if service.get("state") != "ENABLED")
    if disabled:
        return [Finding("apis", "fail", f"not enabled: {', '.join(disabled)}",
                        f"gcloud services enable {' '.join(disabled)} --project={env.spec.project.id}")]
    return [Finding("apis", "ok", f"enabled: {', '.join(SERVICES)}")]


def _permissions(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    """The caller's permissions on the project (Resource Manager `projects.testIamPermissions`): the subset held."""
    client = connection.discovery("cloudresourcemanager", "v1")
    request = client.projects().testIamPermissions(resource=env.spec.project.id,
                                                    body={"permissions": sorted(PERMISSIONS)})
    held = set(call("cloudresourcemanager", "test the caller's permissions", request.execute).get("permissions", []))
    missing = sorted(set(PERMISSIONS) - held)
    if missing:
        return [Finding("permissions", "fail", "the caller lacks " + ", ".join(
            f"{permission} ({PERMISSIONS[permission]})" for permission in missing),
            "grant a role that holds them (e.g. roles/compute.networkAdmin, roles/container.admin, roles/lustre.admin, "
            "roles/servicenetworking.networksAdmin, roles/secretmanager.secretAccessor) to the account apply runs as")]
    return [Finding("permissions", "ok", f"the caller holds the {len(PERMISSIONS)} permissions apply needs")]


def _machine_types(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    """Each GPU pool's machine type is offered in the zone (compute `machineTypes.get`: 404 where it is not), with
    the accelerators the pool asks for."""
    spec, found = env.spec, []
    client = connection.gapic("compute", compute_v1.MachineTypesClient)
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


def _reservations(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    spec, found = env.spec, []
    client = connection.gapic("compute", compute_v1.ReservationsClient)
    for pool in spec.gpu_pools:
        if not pool.reservation:
            continue
        check = f"reservation {pool.reservation}"
        reservation = get_or_none("compute", f"get reservation {pool.reservation}", client.get,
                                  project=spec.project.id, zone=spec.zone, reservation=pool.reservation)
        if reservation is None:
            found.append(Finding(check, "fail", f"no reservation {pool.reservation} in {spec.zone}",
                                 f"name a reservation of {spec.zone} in gpu_pools[{pool.name}].reservation, or move "
                                 "the environment's zone to the reservation's"))
            continue
        reserved = reservation.specific_reservation
        machine = reserved.instance_properties.machine_type
        accelerators = {a.accelerator_type: a.accelerator_count for a in reserved.instance_properties.guest_accelerators}
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


def _network_profile(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    spec = env.spec
    profile = spec.rdma_profile
    client = connection.gapic("compute", compute_v1.NetworkProfilesClient)
    if get_or_none("compute", f"get network profile {profile}", client.get, project=spec.project.id,
                   network_profile=profile) is None:
        return [Finding("network-profile", "fail", f"no network profile {profile} in the project",
                        f"RDMA (RoCE) needs a zone whose profile is {spec.zone}-vpc-roce; choose a zone with A3 Ultra "
                        "or A4 RDMA, or set networks.rdma.profile")]
    return [Finding("network-profile", "ok", f"{profile} exists")]


def _secrets(env: CloudEnvironment, connection: Connection) -> list[Finding]:
    from google.cloud import secretmanager

    client = connection.gapic("secretmanager", secretmanager.SecretManagerServiceClient)
    found = []
    for name, ref in sorted(env.spec.secrets.items()):
        version = get_or_none("secretmanager", f"get {ref.secret_manager}", client.get_secret_version,
                              name=ref.secret_manager)
        if version is None:
            found.append(Finding(f"secret {name}", "fail", f"{ref.secret_manager} does not exist",
                                 f"gcloud secrets versions add {ref.secret_manager.split('/')[3]} --data-file=- "
                                 f"--project={env.spec.project.id}"))
        elif version.state != version.State.ENABLED:
            found.append(Finding(f"secret {name}", "fail", f"{ref.secret_manager} is {version.state.name}",
                                 "enable the version, or add a new one"))
        else:
            found.append(Finding(f"secret {name}", "ok", f"{ref.secret_manager} is enabled"))
    return found


def _state_bucket(bucket) -> list[Finding]:
    from google.api_core import exceptions

    try:
        bucket.reload()
    except exceptions.NotFound:
        return [Finding("state-bucket", "fail", f"no bucket {bucket.name}",
                        f"gcloud storage buckets create gs://{bucket.name} --uniform-bucket-level-access")]
    found = [Finding("state-bucket", "ok", f"{bucket.name} exists")]
    if not bucket.versioning_enabled:
        found.append(Finding("state-bucket", "warn", "object versioning is off: an overwritten record cannot be "
                             "recovered", f"gcloud storage buckets update gs://{bucket.name} --versioning"))
    return found


def failed(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.verdict == "fail"]


def render(findings: list[Finding], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps([asdict(finding) for finding in findings], indent=1)
    order = {"fail": 0, "warn": 1, "ok": 2}
    rows = [("CHECK", "VERDICT", "FOUND", "FIX")] + [
        (f.check, f.verdict.upper(), f.found, f.fix) for f in sorted(findings, key=lambda f: (order[f.verdict], f.check))]
    if fmt == "markdown":
        return "\n".join(["| check | verdict | found | fix |", "|---|---|---|---|"]
                         + [f"| {c} | {v.lower()} | {f} | {x} |" for c, v, f, x in rows[1:]]) + "\n"
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    indent = " " * (widths[0] + widths[1] + 4)
    return "\n".join(f"{c.ljust(widths[0])}  {v.ljust(widths[1])}  {f}" + (f"\n{indent}fix: {x}" if x and i else "")
                     for i, (c, v, f, x) in enumerate(rows)) + "\n"
