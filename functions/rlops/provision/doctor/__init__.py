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

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from google.cloud import storage

from rlops.cloud.base import Connection
from rlops.permissions import Need
from rlops.provision.doctor.capacity import (
    gke_version,
    gpu_quota,
    lustre_location,
    machine_types,
    network_profile,
    psa_range,
    quotas,
    reservations,
)
from rlops.provision.doctor.project import apis, deployment, node_account, permissions, secrets, state_bucket
from rlops.provision.doctor.reads import Finding, Reads, guarded
from rlops.provision.service import CloudEnvironment


def examine(env: CloudEnvironment, connection: Connection, bucket: storage.Bucket,
            needs: tuple[Need, ...] = ()) -> list[Finding]:
    """Every check, in parallel; a check that cannot read what it needs fails saying why. `needs`: the permissions
    to test the caller for (`accounts.account("rlops-apply").needs()` before an apply); none, none tested."""
    with ThreadPoolExecutor(max_workers=len(CHECKS)) as pool, ThreadPoolExecutor(max_workers=16) as reading:
        reads = Reads(connection, bucket, reading, needs)
        futures = [pool.submit(guarded, check, env, reads) for check in CHECKS]
        return [finding for future in futures for finding in future.result()]


CHECKS = (apis, permissions, node_account, machine_types, reservations, network_profile, secrets, quotas,
          gke_version, lustre_location, psa_range, gpu_quota, state_bucket, deployment)


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
