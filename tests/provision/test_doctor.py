"""`rlops doctor` against the fake GCP (every request checked against Google's discovery documents): each check
passes on the seeds' project and fails on a planted problem, and `apply` stops before its first mutating request
when one fails."""

import json
import re

import pytest

from rlops import cli


def _findings(capsys, env: str = "h200") -> tuple[int, dict[str, dict]]:
    code = cli.main(["doctor", env, "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    return code, {(f["check"], f["verdict"]): f for f in found}


def test_the_seeds_project_passes_every_check_and_says_what_it_did_not_check(cloud_fakes, capsys):
    code, found = _findings(capsys)
    assert code == 0, [f for f in found.values() if f["verdict"] == "fail"]
    verdicts = {check: verdict for check, verdict in found}
    assert verdicts["apis"] == "ok" and verdicts["reservation h200-reservation"] == "ok"
    assert verdicts["permissions"] == "ok" and verdicts["machine type a3-ultragpu-8g"] == "ok"
    assert verdicts["network-profile"] == "ok" and verdicts["secret HF_TOKEN"] == "ok"
    assert verdicts["state-bucket"] in ("ok", "warn") and verdicts["quotas"] == "ok"
    assert found[("lustre-location", "ok")]["found"] == "offered in us-central1-b, 500 MB/s per TiB"
    assert found[("gke-version", "ok")]["found"] == "1.33.2-gke.1475000 (REGULAR default), offered in us-central1"
    assert "4 of 4 VMs unused, for up to 2" in found[("reservation h200-reservation", "ok")]["found"]
    # Nothing applied yet: every network, subnetwork, firewall and the PSA range are new; the system pool's five
    # n2-highmem-80 nodes count against N2_CPUS; the reservation-backed GPU pool needs no more GPU quota.
    assert found[("quotas", "ok")]["found"] == (
        "NETWORKS 3 of 15 free; SUBNETWORKS 9 of 175 free; FIREWALLS 2 of 200 free; GLOBAL_INTERNAL_ADDRESSES 1 of "
        "5000 free; N2_CPUS 400 of 2400 free; gpu-pool: its reservation holds the GPU quota")
    gcp, _ = cloud_fakes
    assert not gcp.mutations(), "the doctor only reads"
    assert not [r for r in gcp.requests if r.path.endswith(":access")], "a secret's value is never read"


@pytest.mark.parametrize("plant, check, said", [
    (lambda gcp: gcp.disabled_services.add(("rlops-h200-example", "lustre.googleapis.com")), "apis",
     "not enabled: lustre.googleapis.com"),
    # ray.image_cache (on in the seed): the remote repository's API and image streaming's.
    (lambda gcp: gcp.disabled_services.update({("rlops-h200-example", "artifactregistry.googleapis.com"),
                                               ("rlops-h200-example", "containerfilesystem.googleapis.com")}),
     "apis", "not enabled: artifactregistry.googleapis.com, containerfilesystem.googleapis.com"),
    (lambda gcp: gcp.denied_permissions.add(("rlops-h200-example", "artifactregistry.repositories.setIamPolicy")),
     "permissions", "the caller lacks artifactregistry.repositories.setIamPolicy (in "),
    (lambda gcp: gcp.denied_permissions.add(("rlops-h200-example", "lustre.instances.create")), "permissions",
     "the caller lacks lustre.instances.create (in roles/lustre.admin)"),
    (lambda gcp: gcp.machine_types_missing.add(("us-central1-b", "a3-ultragpu-8g")), "machine type a3-ultragpu-8g",
     "a3-ultragpu-8g is not offered in us-central1-b"),
    (lambda gcp: gcp.reservations.clear(), "reservation h200-reservation", "no reservation h200-reservation in "
     "us-central1-b"),
    (lambda gcp: gcp.put_reservation("rlops-h200-example", "us-central1-b", "h200-reservation", "a3-ultragpu-8g",
                                     "nvidia-h200-141gb", 8, count=4, in_use=3), "reservation h200-reservation",
     "1 of 4 VMs unused; the pool may grow to 2"),
    (lambda gcp: gcp.put_reservation("rlops-h200-example", "us-central1-b", "h200-reservation", "a3-highgpu-8g",
                                     "nvidia-h100-80gb", 8, count=2), "reservation h200-reservation",
     "reserves a3-highgpu-8g, the pool asks for a3-ultragpu-8g"),
    (lambda gcp: gcp.missing_network_profiles.add("us-central1-b-vpc-roce"), "network-profile",
     "no network profile us-central1-b-vpc-roce"),
    (lambda gcp: gcp.quota_limits.update({("rlops-h200-example", "global", "NETWORKS"): 2}), "quota NETWORKS",
     "apply needs 3, 2 free of 2 in the project"),
    (lambda gcp: gcp.quota_limits.update({("rlops-h200-example", "us-central1", "N2_CPUS"): 399}), "quota N2_CPUS",
     "apply needs 400, 399 free of 399 in us-central1"),
    (lambda gcp: gcp.denied_permissions.add(("projects/rlops-h200-example/secrets/wandb-api-key",
                                             "secretmanager.versions.access")), "secret WANDB_API_KEY",
     "the caller lacks secretmanager.versions.access (in roles/secretmanager.secretAccessor or "
     "roles/secretmanager.admin) on projects/rlops-h200-example/secrets/wandb-api-key"),
    (lambda gcp: gcp.lustre_zones.discard("us-central1-b"), "lustre-location",
     "Managed Lustre is not offered in us-central1-b (in us-central1: us-central1-a, us-central1-c)"),
    (lambda gcp: gcp._store["secret_version"].pop("projects/rlops-h200-example/secrets/hf-token/versions/latest"),
     "secret HF_TOKEN", "does not exist"),
])
def test_each_planted_problem_fails_its_check_and_apply_stops_before_any_change(cloud_fakes, capsys, plant, check,
                                                                                said):
    gcp, _ = cloud_fakes
    plant(gcp)
    code, found = _findings(capsys)
    assert code == 1 and said in found[(check, "fail")]["found"] and found[(check, "fail")]["fix"]
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert "doctor: " in err and "check(s) failed; nothing was changed" in err and said in err
    assert not gcp.mutations(), "apply sent a change after the doctor failed"


def test_the_system_pools_vcpus_are_counted_in_every_zone_gke_puts_its_nodes(cloud_fakes, capsys):
    """A node pool's counts are per zone: the doctor's need is what GKE makes of apply's request (the fake gives a
    regional cluster's pool three zones where the request names none, as GKE does)."""
    gcp, _ = cloud_fakes
    code, found = _findings(capsys)
    need = int(re.search(r"N2_CPUS (\d+) of", found[("quotas", "ok")]["found"])[1])
    assert cli.main(["apply", "--yes", "h200"]) == 0
    pool = gcp.resources("node_pool")["default-pool"]
    assert need == 80 * pool["autoscaling"]["maxNodeCount"] * len(pool["locations"])


def test_after_apply_the_quotas_count_what_runs_and_only_what_is_new_is_needed(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    capsys.readouterr()
    # The project's own networks are in use now; a limit that just holds them is enough for a re-run.
    gcp.quota_limits[("rlops-h200-example", "global", "NETWORKS")] = 3
    code, found = _findings(capsys)
    assert code == 0 and "NETWORKS 0 of 0 free" in found[("quotas", "ok")]["found"]


def test_a_gke_version_the_channel_does_not_offer_fails_and_one_older_than_a_feature_needs_warns(
        cloud_fakes, specs, capsys):
    spec = specs / "h200.yaml"
    text = spec.read_text()
    spec.write_text(text.replace("release_channel: REGULAR", "release_channel: REGULAR\n  version: \"1.28\""))
    code, found = _findings(capsys)
    assert code == 1 and found[("gke-version", "fail")]["found"] == (
        "1.28 is not offered in the REGULAR channel in us-central1 (offered: 1.33.2-gke.1475000, 1.32.9-gke.1108000, "
        "1.31.13-gke.1023000)")
    assert cli.main(["apply", "--yes", "h200"]) == 1 and not cloud_fakes[0].mutations()
    spec.write_text(text.replace("release_channel: REGULAR", "release_channel: EXTENDED\n  version: \"1.30\""))
    code, found = _findings(capsys)
    assert code == 0 and found[("gke-version", "warn")]["found"] == (
        "1.30.14-gke.1015000 (EXTENDED) is older than GPUDirect-RDMA (gIB) on a3-ultragpu-8g needs 1.31.4-gke.1183000")
    spec.write_text(text.replace("release_channel: REGULAR", "release_channel: REGULAR\n  version: \"1.32\""))
    assert _findings(capsys)[1][("gke-version", "ok")]["found"] == \
        "1.32.9-gke.1108000 (cluster.version 1.32), offered in us-central1"


def test_a_psa_range_placed_on_a_subnetwork_already_there_fails_and_a_free_one_passes(cloud_fakes, specs, capsys):
    gcp, _ = cloud_fakes
    assert _findings(capsys)[1][("psa-range", "ok")]["found"] == "10.112.0.0/20 is free on network rl-net"
    # Someone's subnetwork on the cluster's network, made before rlops applies (the console, another tool).
    assert cli.main(["apply", "--yes", "h200"]) == 0
    capsys.readouterr()
    net = "https://www.googleapis.com/compute/v1/projects/rlops-h200-example/global/networks/rl-net"
    gcp.put("subnetwork", "theirs", {"name": "theirs", "network": net, "ipCidrRange": "10.64.8.0/24",
                                     "region": "https://www.googleapis.com/compute/v1/projects/rlops-h200-example/"
                                               "regions/us-central1"})
    spec = specs / "h200.yaml"
    text = spec.read_text()
    spec.write_text(text.replace("address: 10.112.0.0", "address: 10.64.0.0"))
    code, found = _findings(capsys)
    assert code == 1 and found[("psa-range", "fail")]["found"] == \
        "10.64.0.0/20 overlaps subnetwork theirs (10.64.8.0/24) on network rl-net"
    before = len(gcp.mutations())
    assert cli.main(["apply", "--yes", "h200"]) == 1 and len(gcp.mutations()) == before
    spec.write_text(text.replace("address: 10.112.0.0", "address: 10.80.0.0"))
    assert _findings(capsys)[1][("psa-range", "ok")]["found"] == "10.80.0.0/20 is free on network rl-net"


def test_an_applied_environment_without_its_functions_or_schedule_is_warned_of(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    assert not any(check in ("functions", "schedule") for check, _ in _findings(capsys)[1])  # nothing applied yet
    assert cli.main(["apply", "--yes", "h200"]) == 0
    capsys.readouterr()
    code, found = _findings(capsys)
    assert code == 0 and found[("functions", "warn")]["found"] == \
        "not deployed: rlops-train, rlops-watch, rlops-snapshot, rlops-reap"
    gcp.deploy("rlops-h200-example", "us-east4")
    code, found = _findings(capsys)
    assert found[("functions", "ok")]["found"] == "rlops-train, rlops-watch, rlops-snapshot, rlops-reap active"
    # Cloud Functions lists in pages (the fake's are two long): the four are found only by reading them all.
    listed = [r for r in gcp.requests if r.path.endswith("/locations/-/functions")]
    assert any(r.query.get("pageToken") for r in listed)
    assert found[("schedule", "ok")]["found"] == "rlops-tick in us-east4, * * * * *"
    gcp.functions["projects/rlops-h200-example/locations/us-east4/functions/rlops-watch"]["state"] = "FAILED"
    gcp.scheduler_jobs["projects/rlops-h200-example/locations/us-east4/jobs/rlops-tick"]["state"] = "PAUSED"
    code, found = _findings(capsys)
    assert code == 0 and found[("functions", "warn")]["found"] == "not active: rlops-watch FAILED"
    assert found[("schedule", "warn")]["fix"] == \
        "gcloud scheduler jobs resume rlops-tick --project=rlops-h200-example --location=us-east4"
    gcp.scheduler_jobs.clear()
    assert "does not exist: no tick watches runs" in _findings(capsys)[1][("schedule", "warn")]["found"]


def test_a_spot_pool_fits_the_regions_gpu_family_quota_counting_the_gpus_others_use(cloud_fakes, capsys):
    """b200-spot: up to 8 nodes x 8 B200 = 64 GPUs, against Cloud Quotas' GPUS-PER-GPU-FAMILY-per-project-region
    for (us-east1, NVIDIA_B200), less the B200s of VMs in us-east1 that are not the pool's nodes."""
    gcp, _ = cloud_fakes
    gcp.gpu_family_quota[("rlops-b200-example", "us-east1", "NVIDIA_B200")] = 64
    code, found = _findings(capsys, "b200-spot")
    assert found[("gpu-quota NVIDIA_B200", "ok")]["found"].startswith(
        "64 GPUs at max_nodes within GPUS-PER-GPU-FAMILY-per-project-region (us-east1, NVIDIA_B200) 64, 0 in use")
    gcp.put_gpu_vm("rlops-b200-example", "us-east1-c", "a-notebook", "nvidia-b200", 8)
    gcp.put_gpu_vm("rlops-b200-example", "us-central1-a", "elsewhere", "nvidia-b200", 8)  # another region
    gcp.put_gpu_vm("rlops-b200-example", "us-east1-b", "stopped", "nvidia-b200", 8, status="TERMINATED")
    code, found = _findings(capsys, "b200-spot")
    assert code == 1 and found[("gpu-quota NVIDIA_B200", "fail")]["found"] == (
        "the pools may grow to 64 GPUs; GPUS-PER-GPU-FAMILY-per-project-region (us-east1, NVIDIA_B200) is 64, 8 in "
        "use by other VMs and reservations: 56 free")
    assert "--dimensions=region=us-east1,gpu_family=NVIDIA_B200 --preferred-value=72" in \
        found[("gpu-quota NVIDIA_B200", "fail")]["fix"]
    assert cli.main(["apply", "--yes", "b200-spot"]) == 1 and not gcp.mutations()
    gcp.vms.clear()
    gcp.gpu_family_quota[("rlops-b200-example", "us-east1", "NVIDIA_B200")] = 63  # short by one GPU
    code, found = _findings(capsys, "b200-spot")
    assert code == 1 and "is 63, 0 in use by other VMs and reservations: 63 free" in \
        found[("gpu-quota NVIDIA_B200", "fail")]["found"]
    gcp.gpu_family_quota[("rlops-b200-example", "us-east1", "NVIDIA_B200")] = 64
    # The Cloud Quotas API is the doctor's, not apply's: unread, the quota is said not checked, apply goes on.
    gcp.disabled_services.add(("rlops-b200-example", "cloudquotas.googleapis.com"))
    code, found = _findings(capsys, "b200-spot")
    assert code == 0 and "gcloud services enable cloudquotas.googleapis.com" in found[("gpu-quota", "warn")]["fix"]
    gcp.disabled_services.clear()
    # The pool's own nodes are not counted against it: applied and grown, it still fits.
    assert cli.main(["apply", "--yes", "b200-spot"]) == 0
    capsys.readouterr()
    gcp._store["node_pool"]["a4-pool"]["nodeCount"] = 8  # the autoscaler grew it: eight nodes, 64 B200s in use
    code, found = _findings(capsys, "b200-spot")
    assert ", 0 in use elsewhere" in found[("gpu-quota NVIDIA_B200", "ok")]["found"]
    assert len([vm for vm in gcp._instances("rlops-b200-example") if vm["labels"]]) == 8


def test_a_missing_state_bucket_fails_and_apply_changes_nothing(cloud_fakes, capsys):
    from rlops.endpoints import Endpoints
    from rlops.state.bucket import client

    gcp, _ = cloud_fakes
    client("test", Endpoints.from_environment()).bucket("rlops-h200-example-state").delete()
    code, found = _findings(capsys)
    assert code == 1 and found[("state-bucket", "fail")]["found"] == "no bucket rlops-h200-example-state"
    assert not any(check in ("functions", "schedule") for check, _ in found)  # said once, by its own check
    assert cli.main(["apply", "--yes", "h200"]) == 1
    assert not gcp.mutations()


def test_skip_doctor_is_said_and_applies(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    gcp.missing_network_profiles.add("us-central1-b-vpc-roce")
    # The fake itself may refuse the profile later.
    assert cli.main(["apply", "--yes", "h200", "--skip-doctor"]) in (0, 1)
    assert "doctor: skipped (--skip-doctor)" in capsys.readouterr().out
    assert gcp.mutations()


def test_the_text_table_puts_failures_first_with_their_fix(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    gcp.disabled_services.add(("rlops-h200-example", "container.googleapis.com"))
    assert cli.main(["doctor", "h200"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["CHECK", "VERDICT"] and lines[1].split()[:2] == ["apis", "FAIL"]
    assert "fix: gcloud services enable container.googleapis.com --project=rlops-h200-example" in lines[2]
