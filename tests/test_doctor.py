"""`rlops doctor` against the fake GCP (every request checked against Google's discovery documents): each check
passes on the seeds' project and fails on a planted problem, and `apply` stops before its first mutating request
when one fails."""

import json

import pytest

from rlops import cli


def _findings(capsys, env: str = "h200") -> tuple[int, dict[str, dict]]:
    code = cli.main(["doctor", env, "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    return code, {(f["check"], f["verdict"]): f for f in found}


def test_the_seeds_project_passes_every_check_and_says_what_it_did_not_check(cloud_fakes, capsys):
    code, found = _findings(capsys)
    assert code == 0, found
    verdicts = {check: verdict for check, verdict in found}
    assert verdicts["apis"] == "ok" and verdicts["reservation h200-reservation"] == "ok"
    assert verdicts["permissions"] == "ok" and verdicts["machine type a3-ultragpu-8g"] == "ok"
    assert verdicts["network-profile"] == "ok" and verdicts["secret HF_TOKEN"] == "ok"
    assert verdicts["state-bucket"] in ("ok", "warn") and verdicts["gpu-quota"] == "warn"
    assert "4 of 4 VMs unused, for up to 2" in found[("reservation h200-reservation", "ok")]["found"]
    gcp, _ = cloud_fakes
    assert not gcp.mutations(), "the doctor only reads"
    assert not [r for r in gcp.requests if r.path.endswith(":access")], "a secret's value is never read"


@pytest.mark.parametrize("plant, check, said", [
    (lambda gcp: gcp.disabled_services.add(("rlops-h200-example", "lustre.googleapis.com")), "apis",
     "not enabled: lustre.googleapis.com"),
    (lambda gcp: gcp.denied_permissions.add(("rlops-h200-example", "lustre.instances.create")), "permissions",
     "the caller lacks lustre.instances.create (instances.create)"),
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
    (lambda gcp: gcp._store["secret_version"].pop("projects/rlops-h200-example/secrets/hf-token/versions/latest"),
     "secret HF_TOKEN", "does not exist"),
])
def test_each_planted_problem_fails_its_check_and_apply_stops_before_any_change(cloud_fakes, capsys, plant, check,
                                                                                said):
    gcp, _ = cloud_fakes
    plant(gcp)
    code, found = _findings(capsys)
    assert code == 1 and said in found[(check, "fail")]["found"] and found[(check, "fail")]["fix"]
    assert cli.main(["apply", "h200"]) == 1
    err = capsys.readouterr().err
    assert "doctor: " in err and "check(s) failed; nothing was changed" in err and said in err
    assert not gcp.mutations(), "apply sent a change after the doctor failed"


def test_skip_doctor_is_said_and_applies(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    gcp.missing_network_profiles.add("us-central1-b-vpc-roce")
    assert cli.main(["apply", "h200", "--skip-doctor"]) in (0, 1)  # the fake itself may refuse the profile later
    assert "doctor: skipped (--skip-doctor)" in capsys.readouterr().out
    assert gcp.mutations()


def test_the_text_table_puts_failures_first_with_their_fix(cloud_fakes, capsys):
    gcp, _ = cloud_fakes
    gcp.disabled_services.add(("rlops-h200-example", "container.googleapis.com"))
    assert cli.main(["doctor", "h200"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["CHECK", "VERDICT"] and lines[1].split()[:2] == ["apis", "FAIL"]
    assert "fix: gcloud services enable container.googleapis.com --project=rlops-h200-example" in lines[2]
