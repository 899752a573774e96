"""`rlops plan --offline [--base REV]`: the plan a pull request shows, from git alone, without credentials."""

import json
import shutil
import subprocess

import pytest

from conftest import REPO
from rlops import cli

pytestmark = pytest.mark.servers


@pytest.fixture
def repo(tmp_path, monkeypatch):
    shutil.copytree(REPO / "environments", tmp_path / "environments")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-C", str(tmp_path)]
    subprocess.run(git[:5] + ["init", "-q", str(tmp_path)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(tmp_path / "environments"))
    monkeypatch.delenv("RLOPS_API_ENDPOINTS", raising=False)
    # No credentials and no way to reach Google: an offline plan must not need either.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    return tmp_path


def test_against_the_base_revision_only_the_edit_shows(repo, capsys):
    spec = repo / "environments" / "h200.yaml"
    spec.write_text(spec.read_text().replace("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 0, max_nodes: 4}"))
    assert cli.main(["plan", "h200", "--offline", "--base", "HEAD", "--format", "json", "--detailed-exitcode"]) == 2
    (plan,) = json.loads(capsys.readouterr().out)
    changed = [c for c in plan["changes"] if c["action"] != "no-op"]
    assert [(c["address"], c["action"]) for c in changed] == [("node_pool/gpu-pool", "update")]
    assert changed[0]["fields"] == [{"field": "max_nodes", "before": 2, "after": 4, "mutability": "mutable"}]


def test_an_unchanged_spec_has_no_changes_and_a_new_one_is_all_creates(repo, capsys):
    assert cli.main(["plan", "h200", "--offline", "--base", "HEAD", "--detailed-exitcode"]) == 0
    assert "No changes" in capsys.readouterr().out
    shutil.copy(repo / "environments" / "h200.yaml", repo / "environments" / "h200-two.yaml")
    assert cli.main(["plan", "h200-two", "--offline", "--base", "HEAD", "--format", "markdown"]) == 0
    # The cluster's 19 resources and the image cache (h200-two would share h200's: a fresh plan creates it).
    assert "**Plan: 20 to create, 0 to update, 0 to replace, 0 to delete.**" in capsys.readouterr().out


def test_the_cluster_objects_are_rendered_from_both_revisions_and_a_template_change_restarts_the_pods(repo, capsys):
    spec = repo / "environments" / "h200.yaml"
    spec.write_text(spec.read_text().replace("shm_size: 240Gi", "shm_size: 200Gi"))
    assert cli.main(["plan", "h200", "--offline", "--base", "HEAD", "--format", "json", "--detailed-exitcode"]) == 2
    (plan,) = json.loads(capsys.readouterr().out)
    assert [c for c in plan["changes"] if c["action"] != "no-op"] == []  # nothing in the cloud changes
    (raycluster,) = plan["cluster_objects"]
    assert (raycluster["kind"], raycluster["name"], raycluster["action"], raycluster["restarts_pods"]) == (
        "RayCluster", "ray-cluster", "update", "KubeRay")
    assert any("sizeLimit" in field for field in raycluster["fields"]) and plan["cost"]["changes"] == []
    assert cli.main(["plan", "h200", "--offline", "--base", "HEAD"]) == 0
    assert "~ RayCluster/default/ray-cluster" in capsys.readouterr().out
    assert cli.main(["plan", "h200", "--offline", "--base", "HEAD", "--format", "markdown"]) == 0
    comment = capsys.readouterr().out
    assert "**In the cluster:** update `RayCluster/default/ray-cluster`" in comment
    assert "(**pods restarted**)" in comment and "> **Pods restarted:**" in comment


def test_a_bad_revision_or_a_base_without_offline_is_a_clean_error(repo, capsys):
    assert cli.main(["plan", "h200", "--offline", "--base", "no-such-rev"]) == 1
    assert "no such git revision: no-such-rev" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["plan", "h200", "--base", "HEAD"])
    assert exit_info.value.code == 1


@pytest.mark.parametrize("command", [["plan", "h200"], ["render", "h200"], ["status", "h200"],
                                     ["apply", "h200", "--yes"],
                                     ["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "r1"]])
def test_without_credentials_a_gcp_command_says_what_is_missing_in_one_line(command, monkeypatch, tmp_path, capsys):
    for name in ("RLOPS_API_ENDPOINTS", "RLOPS_KUBE_API", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # never ask the metadata server: tests stay on loopback
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"rlops {command[0]}: no usable Google credentials" in err
    assert "gcloud auth application-default login" in err and "GOOGLE_APPLICATION_CREDENTIALS" in err
