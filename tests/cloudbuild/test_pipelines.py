"""The Cloud Build pipelines: their files check out, and their scripts, as written, run against the local fakes.

A step's script is the `args` after `-ec`; Cloud Build's substitutions are filled in and `$$`
becomes `$`, as Cloud Build does, and bash runs it in a git workspace (in the step's `dir`), with
GITHUB_TOKEN only where the step lists it in `secretEnv`. The `install` steps (pip) and the gcloud
steps are not run here: the apply pipeline's `.venv`, and the plan pipeline's `.rlops-base/venv`,
point at this interpreter's environment.
"""

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from fakes.github import FakeGitHub
from pipelines_support import (
    PIPELINES,
    REFERENCE,
    TOKEN,
    edit,
    fill,
    gcloud_calls,
    git,
    load,
    run_plan,
    run_step,
    scripts,
)
from rlops.cli import build_parser

pytestmark = pytest.mark.servers

BUILT_IN = {"PROJECT_ID", "BUILD_ID", "PROJECT_NUMBER", "LOCATION", "TRIGGER_NAME", "COMMIT_SHA", "REVISION_ID",
            "SHORT_SHA", "REPO_NAME", "REPO_FULL_NAME", "BRANCH_NAME", "TAG_NAME", "REF_NAME",
            "TRIGGER_BUILD_CONFIG_PATH", "SERVICE_ACCOUNT_EMAIL", "SERVICE_ACCOUNT",
            "_HEAD_BRANCH", "_BASE_BRANCH", "_HEAD_REPO_URL", "_PR_NUMBER"}


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
        for found in re.finditer(r"(?:\.rlops-base/venv|\.venv)/bin/rlops ([^|;&>)\\]*)", line):
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


def open_pull_request(work: Path, message: str) -> None:
    git("checkout", "--quiet", "-b", "change", cwd=work)
    git("commit", "--quiet", "-am", message, cwd=work)


def test_a_pull_requests_plan_is_one_comment_showing_both_changes_and_a_rerun_edits_it(workspace, github):
    edit(workspace, "h200.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}",
         "autoscaling: {min_nodes: 0, max_nodes: 3}")
    edit(workspace, "b200-spot.yaml", "capacity_gib: 36000", "capacity_gib: 72000")
    open_pull_request(workspace, "grow")
    values = {"_BASE_BRANCH": "main", "_PR_NUMBER": "7"}
    first = run_plan(workspace, github, values)
    assert first.returncode == 0, first.stderr
    assert "environments/h200.yaml: ok" in first.stdout  # validated
    [comment] = github.comments_on(7)
    assert "h200" in comment and "b200-spot" in comment
    assert "max_nodes" in comment and "2 → 3" in comment.replace("->", "→")
    assert "capacity_gib" in comment and "36000" in comment and "72000" in comment
    edit(workspace, "h200.yaml", "max_nodes: 3}", "max_nodes: 4}")
    git("commit", "--quiet", "-am", "grow more", cwd=workspace)
    second = run_plan(workspace, github, values)
    assert second.returncode == 0 and len(github.comments_on(7)) == 1
    assert "2 → 4" in github.comments_on(7)[0].replace("->", "→")
    assert [r.method for r in github.requests if r.method in ("POST", "PATCH") and "/repos/" in r.path] == \
        ["POST", "PATCH"]
    for done in (first, second):
        assert TOKEN not in done.stdout + done.stderr


def test_a_shm_size_change_shows_in_the_comment_as_the_ray_pods_restarting_and_a_pool_change_as_its_cost(
        workspace, github):
    """Nothing in the cloud changes with ray.shm_size, yet every Ray pod restarts: the comment says so, from the
    objects rendered from the base and head specs; a grown reserved pool shows what it adds an hour."""
    edit(workspace, "h200.yaml", "shm_size: 240Gi", "shm_size: 200Gi")
    edit(workspace, "h100.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}",
         "autoscaling: {min_nodes: 0, max_nodes: 3}")
    open_pull_request(workspace, "smaller shm, a bigger h100 reservation")
    done = run_plan(workspace, github, {"_BASE_BRANCH": "main", "_PR_NUMBER": "12"})
    assert done.returncode == 0, done.stderr
    [comment] = github.comments_on(12)
    h200 = comment[comment.index("### Environment `h200`"):]
    assert "**Plan: 0 to create, 0 to update, 0 to replace, 0 to delete.**" in h200
    assert "**In the cluster:** update `RayCluster/default/ray-cluster`" in h200 and "(**pods restarted**)" in h200
    assert "~ RayCluster/default/ray-cluster" in h200 and "every pod restarts" in h200
    h100 = comment[comment.index("### Environment `h100`"):comment.index("### Environment `h200`")]
    assert ("| ~ | `node_pool/a3-pool` | 2 x a3-highgpu-8g, reservation a3-high-reservation -> 3 x a3-highgpu-8g, "
            "reservation a3-high-reservation | always | +$88.49/h |") in h100
    assert "**Total: +$88.49/h" in h100


def test_the_history_of_a_private_repository_is_fetched_with_the_token_and_never_without(workspace, github):
    """The trigger's checkout is one commit deep and its origin has no credentials: without the token the
    plan fails at the fetch, saying why; with it, git sends it to the fake's git server, never printed."""
    edit(workspace, "h200.yaml", "max_nodes: 2}", "max_nodes: 3}")
    open_pull_request(workspace, "grow")
    values = {"_BASE_BRANCH": "main", "_PR_NUMBER": "5"}
    refused = run_plan(workspace, github, values, {"GITHUB_TOKEN": "ghp_wrong"})
    assert refused.returncode == 128 and "fatal: " in refused.stderr and "ghp_wrong" not in refused.stderr
    assert not github.comments_on(5)
    done = run_plan(workspace, github, values)
    assert done.returncode == 0, done.stderr
    assert "max_nodes" in github.comments_on(5)[0]
    fetches = [r for r in github.requests if ".git/" in r.path]
    assert {r.status for r in fetches} == {200, 401} and TOKEN not in done.stdout + done.stderr


def test_a_pull_request_that_deletes_a_spec_says_so_and_fails_the_check(workspace, github):
    git("checkout", "--quiet", "-b", "change", cwd=workspace)
    git("rm", "--quiet", "environments/b200-spot.yaml", cwd=workspace)
    git("commit", "--quiet", "-m", "retire b200", cwd=workspace)
    done = run_plan(workspace, github, {"_BASE_BRANCH": "main", "_PR_NUMBER": "6"})
    assert done.returncode == 3
    [comment] = github.comments_on(6)
    assert "could not plan" in comment and "rlops destroy b200-spot" in comment


def test_a_replaced_node_pool_fails_the_check_until_the_pull_request_carries_the_label(workspace, github):
    edit(workspace, "b200-spot.yaml", "driver_version: default", "driver_version: latest")
    open_pull_request(workspace, "new driver")
    values = {"_BASE_BRANCH": "main", "_PR_NUMBER": "8"}
    refused = run_plan(workspace, github, values)
    assert refused.returncode == 3, refused.stderr
    assert "add the label rlops-approve-destructive" in refused.stdout
    assert "a4-pool" in github.comments_on(8)[0]
    # Found on the second page of labels (GitHub gives 30 a page unless asked for more).
    github.labels[8] = [f"team-{i}" for i in range(40)] + ["rlops-approve-destructive"]
    allowed = run_plan(workspace, github, values)
    assert allowed.returncode == 0, allowed.stderr
    assert len(github.comments_on(8)) == 1


def test_a_plan_longer_than_one_comment_is_split_and_a_shorter_one_removes_the_rest(workspace, github):
    text = (workspace / "environments" / "h200.yaml").read_text()
    for i in range(40):
        (workspace / "environments" / f"copy-{i:02d}.yaml").write_text(
            text.replace("rlops-h200-example", f"rlops-copy-{i:02d}"))
    names = [f"copy-{i:02d}" for i in range(40)]
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


def test_a_live_plan_comment_carries_each_changed_environments_doctor_table(workspace, github, cloud_fakes):
    gcp, _ = cloud_fakes
    gcp.disabled_services.add(("rlops-h200-example", "lustre.googleapis.com"))
    edit(workspace, "h200.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}",
         "autoscaling: {min_nodes: 0, max_nodes: 3}")
    open_pull_request(workspace, "grow")
    done = run_plan(workspace, github, {"_BASE_BRANCH": "main", "_PR_NUMBER": "9", "_LIVE_PLAN": "true"})
    assert done.returncode == 0, done.stderr[-2000:]
    posted = "\n".join(github.comments_on(9))
    assert "### rlops doctor h200" in posted and "| check | verdict | found | fix |" in posted
    assert "| apis | fail | not enabled: lustre.googleapis.com |" in posted
    assert "| reservation h200-reservation | ok |" in posted
    assert not gcp.mutations()


def test_the_live_plan_is_its_own_part_so_the_pair_fits_the_comment_limit(workspace, github):
    """Two files, each under the limit, together over it: each becomes its own part."""
    rlops = str(workspace / ".venv" / "bin" / "rlops")
    env = {**os.environ, "GITHUB_TOKEN": TOKEN, "RLOPS_GITHUB_API": github.url}
    (workspace / "plan.md").write_text("offline plan\n" + "x" * 40_000 + "\n")
    (workspace / "live.md").write_text("live plan\n" + "y" * 40_000 + "\n")
    posted = subprocess.run([rlops, "github", "comment", "--repo", "acme/envs", "--pr", "4", "--file", "plan.md",
                             "--file", "live.md"], cwd=workspace, env=env, capture_output=True, text=True)
    assert posted.returncode == 0, posted.stderr
    first, second = github.comments_on(4)
    assert "offline plan" in first and "live plan" in second


def test_a_push_that_deletes_an_environment_fails_and_destroys_nothing(workspace, github, cloud_fakes):
    gcp, kube = cloud_fakes
    git("rm", "--quiet", "environments/b200-spot.yaml", cwd=workspace)
    git("commit", "--quiet", "-m", "retire b200", cwd=workspace)
    done = run_step(workspace, github, load("apply.yaml"), "apply", {})
    assert done.returncode == 3
    assert "rlops destroy b200-spot" in done.stderr and "never destroys" in done.stderr
    assert not gcp.mutations() and not kube.writes()


def push(work: Path, github: FakeGitHub, message: str,
         edits: list[tuple[str, str, str]]) -> subprocess.CompletedProcess:
    """Commit each edit on main (one commit apiece), then run the apply pipeline as the push's trigger would."""
    for name, old, new in edits:
        edit(work, name, old, new)
        git("commit", "--quiet", "-am", f"{message}: {name}", cwd=work)
    return run_step(work, github, load("apply.yaml"), "apply", {})


def applied(done: subprocess.CompletedProcess) -> set[str]:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return set(re.findall(r"^== apply (\S+)$", done.stdout, re.M))


def test_a_push_applies_every_environment_its_commits_changed_and_only_those(workspace, github, cloud_fakes):
    gcp, _ = cloud_fakes
    first = push(workspace, github, "grow h200", [("h200.yaml", "autoscaling: {min_nodes: 0, max_nodes: 2}",
                                           "autoscaling: {min_nodes: 0, max_nodes: 3}")])
    assert applied(first) == {"h200"}  # local has no cloud to apply
    assert "b200-spot was never applied (or was destroyed) and this push did not touch" in first.stderr
    assert not any("rlops-b200-example" in r.path for r in gcp.mutations())
    before = len(gcp.mutations())
    # Two commits in one push: COMMIT_SHA^ alone would see only the second, which changes local.
    both = push(workspace, github, "two commits", [("h200.yaml", "max_nodes: 3", "max_nodes: 4"),
                                           ("local.yaml", "timeout: 30s", "timeout: 40s")])
    assert applied(both) == {"h200"}
    assert any("rlops-h200-example" in r.path for r in gcp.mutations()[before:])
    before = len(gcp.mutations())
    reworded = push(workspace, github, "comment", [("h200.yaml", "Replace the project", "Replace the GCP project")])
    assert applied(reworded) == set() and "is applied as its spec says" in reworded.stdout
    assert len(gcp.mutations()) == before
    # Destroyed on purpose: a later push that does not touch its file leaves it destroyed.
    subprocess.run([str(workspace / ".venv" / "bin" / "rlops"), "destroy", "h200", "--yes"], cwd=workspace, check=True,
                   capture_output=True)
    after_destroy = push(workspace, github, "local again", [("local.yaml", "timeout: 40s", "timeout: 50s")])
    assert applied(after_destroy) == set()
    assert "h200 was never applied (or was destroyed)" in after_destroy.stderr


def test_a_failed_apply_fails_the_build_and_the_next_push_finishes_it(workspace, github, cloud_fakes):
    gcp, _ = cloud_fakes
    gcp.fail_next(1, status=403, match="POST /compute/v1/projects/rlops-h200-example/global/firewalls")
    failed = push(workspace, github, "grow h200", [("h200.yaml", "max_nodes: 2}", "max_nodes: 3}")])
    assert failed.returncode == 1
    # h200 has two firewall rules, inserted at once: either meets the refusal.
    assert "== apply h200" in failed.stdout
    assert re.search(r"insert firewall rl-(gvnic-internal|lustre-lnet)", failed.stderr)
    # The next push changes only the local environment; h200 is still not applied, so it is applied now.
    finished = push(workspace, github, "local only", [("local.yaml", "timeout: 30s", "timeout: 40s")])
    assert applied(finished) == {"h200"}
    assert "firewall" in " ".join(r.path for r in gcp.mutations() if r.method == "POST")


def test_two_pushes_applied_out_of_order_leave_the_newer_spec_applied(workspace, github, cloud_fakes):
    """Cloud Build does not order builds: the older commit's apply, run second, is skipped."""
    gcp, _ = cloud_fakes
    edit(workspace, "h200.yaml", "max_nodes: 2}", "max_nodes: 3}")
    git("commit", "--quiet", "-am", "older", cwd=workspace)
    older = git("rev-parse", "HEAD", cwd=workspace)
    edit(workspace, "h200.yaml", "max_nodes: 3}", "max_nodes: 4}")
    git("commit", "--quiet", "-am", "newer", cwd=workspace)
    assert applied(run_step(workspace, github, load("apply.yaml"), "apply", {})) == {"h200"}
    late = run_step(workspace, github, load("apply.yaml"), "apply", {}, commit=older)
    assert late.returncode == 0, late.stderr
    assert "skipped: h200: commit" in late.stdout + late.stderr and "is applied (or being applied) already" in \
        late.stdout + late.stderr
    assert gcp.resources("node_pool")["gpu-pool"]["autoscaling"]["maxNodeCount"] == 4


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="google-cloud-cli is not installed")
def test_the_documented_triggers_are_2nd_gen_with_comment_control_and_gclouds_own_flags():
    setup = (REPO / "docs" / "gcp-setup.md").read_text()  # moved from the README (issue 39, 6)
    block = setup[setup.index("Repositories → 2nd gen"):]
    block = block[block.index("```sh") + 5:block.index("```", block.index("```sh") + 5)]
    triggers = [words for words in gcloud_calls(block) if words[:4] == ["builds", "triggers", "create", "github"]]
    assert len(triggers) == 3
    shown = subprocess.run(["gcloud", "builds", "triggers", "create", "github", "--help"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"})
    known = set(re.findall(r"--[a-z][a-z0-9-]*", re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout)))
    for words in triggers:
        flags = {w for w in words if w.startswith("--")}
        assert flags <= known, flags - known
        assert {"--repository", "--region"} <= flags and "--repo-owner" not in flags  # 2nd gen, not 1st
    (plan,) = [w for w in triggers if "--pull-request-pattern" in w]
    assert plan[plan.index("--comment-control") + 1] == "COMMENTS_ENABLED_FOR_EXTERNAL_CONTRIBUTORS_ONLY"


def test_apply_may_run_three_hours_and_deliveries_back_off_in_the_triggers_region():
    """Issue 31: Cloud Build's default 60-minute timeout killed a first apply; without a retry policy Pub/Sub
    redelivers at once, five deliveries in seconds; a fixed us-central1 deployed a second set elsewhere."""
    assert int(load("apply.yaml")["timeout"].removesuffix("s")) >= 3 * 3600
    deploy = load("deploy.yaml")
    assert deploy["substitutions"]["_REGION"] == "$LOCATION"
    settings = next(text for text in scripts(deploy).values() if "--push-endpoint" in text)
    assert "--min-retry-delay=10s" in settings and "--max-retry-delay=600s" in settings


def test_functions_are_built_by_an_account_that_has_the_builder_role():
    deploy = scripts(load("deploy.yaml"))
    [step] = [text for text in deploy.values() if "gcloud functions deploy" in text]
    assert "--build-service-account" in step and "rlops-function-build@" in step
    accounts_table = (REPO / "docs" / "iam.md").read_text()  # moved from the README (issue 39, 6)
    assert re.search(r"\| `rlops-function-build`[^\n]*`roles/cloudbuild\.builds\.builder`", accounts_table)


def test_the_functions_ship_their_whole_dependency_closure_pinned_as_the_tests_ran_it():
    """Issue 31, 9: requirements.txt pins rlops's direct dependencies only; a deploy resolving the rest anew could
    get versions no test ran. deploy.yaml ships requirements.lock, which pins every direct pin as requirements.txt
    says and every distribution the resolver adds, each at the version installed here."""
    from importlib.metadata import version

    def pins(path: Path) -> dict[str, str]:
        found = {}
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                name, _, pinned = line.partition("==")
                found[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = pinned
        return found

    direct, locked = pins(REPO / "requirements.txt"), pins(REPO / "requirements.lock")
    assert all(locked.get(name) == pinned for name, pinned in direct.items()), set(direct.items()) - set(locked.items())
    assert {name: version(name) for name in locked} == locked
    assert "cp requirements.lock functions/requirements.txt" in (REPO / "cloudbuild" / "deploy.yaml").read_text()
