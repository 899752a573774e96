"""The Cloud Build pipelines: their files check out, and their scripts, as written, run against the local fakes.

A step's script is the `args` after `-ec`; Cloud Build's substitutions are filled in and `$$`
becomes `$`, as Cloud Build does, and bash runs it in a git workspace with `.venv` pointing at
this interpreter's environment. The `install` steps (pip) and the gcloud steps are not run here.
"""

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from fakes.github import FakeGitHub
from rlops.cli import build_parser

PIPELINES = REPO / "cloudbuild"
BUILT_IN = {"PROJECT_ID", "BUILD_ID", "PROJECT_NUMBER", "LOCATION", "TRIGGER_NAME", "COMMIT_SHA", "REVISION_ID",
            "SHORT_SHA", "REPO_NAME", "REPO_FULL_NAME", "BRANCH_NAME", "TAG_NAME", "REF_NAME",
            "TRIGGER_BUILD_CONFIG_PATH", "SERVICE_ACCOUNT_EMAIL", "SERVICE_ACCOUNT",
            "_HEAD_BRANCH", "_BASE_BRANCH", "_HEAD_REPO_URL", "_PR_NUMBER"}
REFERENCE = re.compile(r"(?<!\$)\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
TOKEN = "ghp_PLANTEDgithubTOKEN0123456789abcdef"


def load(name: str) -> dict:
    return yaml.safe_load((PIPELINES / name).read_text())


def scripts(build: dict) -> dict[str, str]:
    return {step["id"]: step["args"][1] for step in build["steps"] if step.get("entrypoint") == "bash"}


@pytest.mark.parametrize("name", ["plan.yaml", "apply.yaml", "deploy.yaml"])
def test_a_pipeline_uses_only_substitutions_cloud_build_defines_or_it_declares(name):
    build = load(name)
    declared = set(build.get("substitutions", {}))
    assert all(key.startswith("_") for key in declared), "user substitutions must start with _"
    used = {a or b for a, b in REFERENCE.findall((PIPELINES / name).read_text())}
    assert used - BUILT_IN - declared == set()
    secrets = {s["env"] for s in build.get("availableSecrets", {}).get("secretManager", [])}
    for step in build["steps"]:
        assert set(step.get("secretEnv", [])) <= secrets
        assert step["args"][0] == "-ec", "every script stops at its first failing command"


def rlops_invocations(text: str) -> list[list[str]]:
    calls = []
    for line in text.splitlines():
        for found in re.finditer(r"\.venv/bin/rlops ([^|;&>)]*)", line):
            calls.append([w for w in found.group(1).split() if not w.startswith(("$", '"$', "2>"))])
    return calls


@pytest.mark.parametrize("name", ["plan.yaml", "apply.yaml", "deploy.yaml"])
def test_every_rlops_command_and_flag_a_pipeline_runs_exists(name):
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for words in rlops_invocations((PIPELINES / name).read_text()):
        parser = commands[words[0]]
        rest = words[1:]
        nested = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if nested:
            parser, rest = nested[0].choices[rest[0]], rest[1:]
        known = {option for action in parser._actions for option in action.option_strings}
        assert {w for w in rest if w.startswith("--")} <= known, (name, words)


def fill(script: str, values: dict[str, str]) -> str:
    script = REFERENCE.sub(lambda m: values[m.group(1) or m.group(2)], script)
    return script.replace("$$", "$")


def gcloud_calls(script: str) -> list[list[str]]:
    """Each gcloud command of a filled-in script as words; a `$name` the script assigns is expanded to each value."""
    joined = script.replace("\\\n", " ")
    assigned: dict[str, list[list[str]]] = {}
    for name, quoted, bare in re.findall(r"^\s*(\w+)=(?:\"([^\"]*)\"|([a-z][\w-]*)\s*$)", joined, re.M):
        assigned.setdefault(name, []).append((quoted or bare).split())
    calls = []
    for line in joined.splitlines():
        for found in re.finditer(r"\bgcloud\s+([^|;&>)]*)", line):
            variants: list[list[str]] = [[]]
            for word in found.group(1).split():
                variable = re.fullmatch(r"\"?\$\{?(\w+)\}?\"?", word)
                values = assigned.get(variable.group(1)) if variable else None
                variants = [v + value for v in variants for value in (values or [[word.strip("\"'")]])]
            calls += variants
    return calls


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="google-cloud-cli is not installed")
@pytest.mark.parametrize("name", ["plan.yaml", "apply.yaml", "deploy.yaml"])
def test_every_gcloud_command_and_flag_a_pipeline_runs_exists(name):
    """Never run here against GCP, the gcloud lines are at least checked against gcloud's own help."""
    build = load(name)
    values = {key: "x" for key in BUILT_IN} | {k: str(v) for k, v in build.get("substitutions", {}).items()}
    helps: dict[tuple[str, ...], set[str]] = {}
    for step_script in scripts(build).values():
        for words in gcloud_calls(fill(step_script, values)):
            path = tuple(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z0-9-]*", w), words))
            if path not in helps:
                shown = subprocess.run(["gcloud", *path, "--help"], capture_output=True, text=True, timeout=120,
                                       env={**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"})
                assert shown.returncode == 0, (path, shown.stderr[-500:])
                helps[path] = set(re.findall(r"--[a-z][a-z0-9-]*", re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout)))
            flags = {word.split("=", 1)[0] for word in words if word.startswith("--")}
            assert flags <= helps[path], (name, " ".join(path), flags - helps[path])


def git(*args, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A clone of a repository whose main holds the seed environments, as Cloud Build checks it out."""
    origin, work = tmp_path / "origin.git", tmp_path / "workspace"
    subprocess.run(["git", "init", "--quiet", "--bare", "-b", "main", str(origin)], check=True)
    work.mkdir()
    shutil.copytree(REPO / "environments", work / "environments")
    git("init", "--quiet", "-b", "main", cwd=work)
    git("config", "user.email", "ci@example.com", cwd=work)
    git("config", "user.name", "ci", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "--quiet", "-m", "environments", cwd=work)
    git("remote", "add", "origin", str(origin), cwd=work)
    git("push", "--quiet", "origin", "main", cwd=work)
    (work / ".venv").symlink_to(Path(sys.prefix))
    monkeypatch.delenv("RLOPS_ENVIRONMENTS", raising=False)
    return work


def run_step(work: Path, build: dict, step: str, values: dict[str, str], env: dict[str, str]):
    defaults = {k: str(v) for k, v in build.get("substitutions", {}).items()}
    script = fill(scripts(build)[step], {**defaults, "PROJECT_ID": "rlops-ci", "REPO_FULL_NAME": "acme/envs",
                                         **values})
    return subprocess.run(["bash", "-ec", script], cwd=work, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


def edit(work: Path, name: str, old: str, new: str) -> None:
    path = work / "environments" / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def open_pull_request(work: Path, message: str) -> None:
    git("checkout", "--quiet", "-b", "change", cwd=work)
    git("commit", "--quiet", "-am", message, cwd=work)


def test_a_pull_requests_plan_is_one_comment_showing_both_changes_and_a_rerun_edits_it(workspace):
    edit(workspace, "h200.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}", "autoscaling: {min_nodes: 0, max_nodes: 3}")
    edit(workspace, "b200-spot.yaml", "capacity_gib: 36000", "capacity_gib: 72000")
    open_pull_request(workspace, "grow")
    build = load("plan.yaml")
    with FakeGitHub(TOKEN) as github:
        env = {"GITHUB_TOKEN": TOKEN, "RLOPS_GITHUB_API": github.url}
        values = {"_BASE_BRANCH": "main", "_PR_NUMBER": "7"}
        assert run_step(workspace, build, "validate", values, env).returncode == 0
        first = run_step(workspace, build, "plan", values, env)
        assert first.returncode == 0, first.stderr
        [comment] = github.comments_on(7)
        assert "h200" in comment and "b200-spot" in comment
        assert "max_nodes" in comment and "2 → 3" in comment.replace("->", "→")
        assert "capacity_gib" in comment and "36000" in comment and "72000" in comment
        edit(workspace, "h200.yaml", "max_nodes: 3}", "max_nodes: 4}")
        git("commit", "--quiet", "-am", "grow more", cwd=workspace)
        second = run_step(workspace, build, "plan", values, env)
        assert second.returncode == 0 and len(github.comments_on(7)) == 1
        assert "2 → 4" in github.comments_on(7)[0].replace("->", "→")
        assert [r.method for r in github.requests if r.method in ("POST", "PATCH")] == ["POST", "PATCH"]
        for done in (first, second):
            assert TOKEN not in done.stdout + done.stderr


def test_a_replaced_node_pool_fails_the_check_until_the_pull_request_carries_the_label(workspace):
    edit(workspace, "b200-spot.yaml", "driver_version: default", "driver_version: latest")
    open_pull_request(workspace, "new driver")
    build = load("plan.yaml")
    with FakeGitHub(TOKEN) as github:
        env = {"GITHUB_TOKEN": TOKEN, "RLOPS_GITHUB_API": github.url}
        values = {"_BASE_BRANCH": "main", "_PR_NUMBER": "8"}
        refused = run_step(workspace, build, "plan", values, env)
        assert refused.returncode == 3, refused.stderr
        assert "add the label rlops-approve-destructive" in refused.stdout
        assert "a4-pool" in github.comments_on(8)[0]
        github.labels[8] = ["rlops-approve-destructive"]
        allowed = run_step(workspace, build, "plan", values, env)
        assert allowed.returncode == 0, allowed.stderr
        assert len(github.comments_on(8)) == 1


def test_a_plan_longer_than_one_comment_is_split_and_a_shorter_one_removes_the_rest(workspace):
    text = (workspace / "environments" / "h200.yaml").read_text()
    for i in range(40):
        (workspace / "environments" / f"copy-{i:02d}.yaml").write_text(text.replace("rlops-h200-example", f"rlops-copy-{i:02d}"))
    names = [f"copy-{i:02d}" for i in range(40)]
    with FakeGitHub(TOKEN) as github:
        env = {**os.environ, "GITHUB_TOKEN": TOKEN, "RLOPS_GITHUB_API": github.url}
        rlops = str(workspace / ".venv" / "bin" / "rlops")
        plan = subprocess.run([rlops, "plan", *names, "--offline", "--format", "markdown"], cwd=workspace, env=env,
                              capture_output=True, text=True, check=True).stdout
        assert len(plan) > 65_536
        (workspace / "plan.md").write_text(plan)
        posted = subprocess.run([rlops, "github", "comment", "--repo", "acme/envs", "--pr", "9", "--file", "plan.md"],
                                cwd=workspace, env=env, capture_output=True, text=True)
        assert posted.returncode == 0, posted.stderr
        bodies = github.comments_on(9)
        assert len(bodies) >= 2 and all(len(b) <= 65_536 for b in bodies)
        assert all(f"copy-{i:02d}" in "".join(bodies) for i in range(40))
        short = subprocess.run([rlops, "plan", "copy-00", "--offline", "--format", "markdown"], cwd=workspace, env=env,
                               capture_output=True, text=True, check=True).stdout
        (workspace / "plan.md").write_text(short)
        subprocess.run([rlops, "github", "comment", "--repo", "acme/envs", "--pr", "9", "--file", "plan.md"],
                       cwd=workspace, env=env, check=True, capture_output=True)
        assert len(github.comments_on(9)) == 1 and "copy-00" in github.comments_on(9)[0]
        assert TOKEN not in posted.stdout + posted.stderr
        assert all(r.authorization == f"Bearer {TOKEN}" for r in github.requests)


def test_a_push_that_deletes_an_environment_fails_and_destroys_nothing(workspace, cloud_fakes):
    gcp, kube = cloud_fakes
    git("rm", "--quiet", "environments/b200-spot.yaml", cwd=workspace)
    git("commit", "--quiet", "-m", "retire b200", cwd=workspace)
    head = git("rev-parse", "HEAD", cwd=workspace)
    done = run_step(workspace, load("apply.yaml"), "apply", {"COMMIT_SHA": head, "SHORT_SHA": head[:7]}, {})
    assert done.returncode == 3
    assert "rlops destroy b200-spot" in done.stderr and "never destroys" in done.stderr
    assert not gcp.mutations() and not kube.writes()


def push(work: Path, message: str, edits: list[tuple[str, str, str]]) -> subprocess.CompletedProcess:
    """Commit each edit on main (one commit apiece), then run the apply pipeline as the push's trigger would."""
    for name, old, new in edits:
        edit(work, name, old, new)
        git("commit", "--quiet", "-am", f"{message}: {name}", cwd=work)
    head = git("rev-parse", "HEAD", cwd=work)
    return run_step(work, load("apply.yaml"), "apply", {"COMMIT_SHA": head, "SHORT_SHA": head[:7]}, {})


def applied(done: subprocess.CompletedProcess) -> set[str]:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return set(re.findall(r"^== apply (\S+)$", done.stdout, re.M))


def test_a_push_applies_every_environment_its_commits_changed_and_only_those(workspace, cloud_fakes):
    gcp, _ = cloud_fakes
    first = push(workspace, "grow h200", [("h200.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}",
                                           "autoscaling: {min_nodes: 0, max_nodes: 3}")])
    assert applied(first) == {"h200"}  # local has no cloud to apply
    assert "b200-spot was never applied (or was destroyed) and this push did not touch" in first.stderr
    assert not any("rlops-b200-example" in r.path for r in gcp.mutations())
    before = len(gcp.mutations())
    # Two commits in one push: COMMIT_SHA^ alone would see only the second, which changes local.
    both = push(workspace, "two commits", [("h200.yaml", "max_nodes: 3", "max_nodes: 4"),
                                           ("local.yaml", "timeout: 2m", "timeout: 3m")])
    assert applied(both) == {"h200"}
    assert any("rlops-h200-example" in r.path for r in gcp.mutations()[before:])
    before = len(gcp.mutations())
    reworded = push(workspace, "comment", [("h200.yaml", "Replace the project", "Replace the GCP project")])
    assert applied(reworded) == set() and "is applied as its spec says" in reworded.stdout
    assert len(gcp.mutations()) == before
    # Destroyed on purpose: a later push that does not touch its file leaves it destroyed.
    subprocess.run([str(workspace / ".venv" / "bin" / "rlops"), "destroy", "h200", "--yes"], cwd=workspace, check=True,
                   capture_output=True)
    after_destroy = push(workspace, "local again", [("local.yaml", "timeout: 3m", "timeout: 4m")])
    assert applied(after_destroy) == set()
    assert "h200 was never applied (or was destroyed)" in after_destroy.stderr


def test_a_failed_apply_fails_the_build_and_the_next_push_finishes_it(workspace, cloud_fakes):
    gcp, _ = cloud_fakes
    gcp.fail_next(1, status=403, match="POST /compute/v1/projects/rlops-h200-example/global/firewalls")
    failed = push(workspace, "grow h200", [("h200.yaml", "max_nodes: 2}", "max_nodes: 3}")])
    assert failed.returncode == 1
    assert "== apply h200" in failed.stdout and "insert firewall rl-gvnic-internal" in failed.stderr
    # The next push changes only the local environment; h200 is still not applied, so it is applied now.
    finished = push(workspace, "local only", [("local.yaml", "timeout: 2m", "timeout: 3m")])
    assert applied(finished) == {"h200"}
    assert "firewall" in " ".join(r.path for r in gcp.mutations() if r.method == "POST")
