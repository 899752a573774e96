"""The plan pipeline runs on pull requests: what the pull request holds is data, never code, and the GitHub token
stays out of its reach (issue 31, 8); the documented trigger (docs/gcp-setup.md) and the pipeline agree on which pull
requests it plans (issue 31, 7). The harness is tests/pipelines_support.py's: each step as Cloud Build runs it, the
token only where `secretEnv` lists it."""

import re
import subprocess

import pytest

from conftest import REPO

# `github` and `workspace`, the fixtures the tests take, are pipelines_support's (a plugin: tests/conftest.py).
from pipelines_support import TOKEN, edit, gcloud_calls, git, load, run_plan

pytestmark = pytest.mark.servers

# What a step may run besides the base branch's rlops: bash's own words and the image's git and coreutils.
SHELL = {"if", "then", "else", "fi", "for", "do", "done", "{", "}", "[", "!", "exit", "export", "set", "true", "echo",
         "cat", "rm", "mkdir", "printf", "sed", "tee", "git", "tar", "base64"}
BASE_RLOPS = ".rlops-base/venv/bin/rlops"


def commands(script: str) -> set[str]:
    """The programs a bash script runs: the first word of each command, after assignments and `if`/`!`."""
    text = "\n".join(line for line in script.replace("\\\n", " ").splitlines() if not line.strip().startswith("#"))
    found = set()
    for segment in re.split(r"\$\(|;|&&|\|\||\||\n|\{|\bthen\b|\bdo\b|\belse\b", text):
        while re.match(r"\s*(if\s|!\s|\w+=(\"[^\"]*\"|'[^']*'|\S*))", segment):
            segment = re.sub(r"^\s*(if\s|!\s|\w+=(\"[^\"]*\"|'[^']*'|\S*))", "", segment)
        words = [w.strip("\"')") for w in segment.split()]
        if words:
            found.add(words[0])
    return found


def test_no_step_runs_what_the_pull_request_wrote_and_only_two_git_steps_hold_the_token():
    steps = {step["id"]: step for step in load("plan.yaml")["steps"]}
    holding = {name for name, step in steps.items() if "GITHUB_TOKEN" in step.get("secretEnv", [])}
    assert holding == {"base", "comment"}
    first = load("plan.yaml")["steps"][0]["args"][1]
    assert first.index("rm -rf .rlops-base\n") < first.index("mkdir -p .rlops-base"), \
        "the base's directory is made fresh, whatever the pull request put there"
    for name, step in steps.items():
        ran = commands(step["args"][1])
        if name == "install":  # the base's requirements and package, from the base's directory, isolated
            assert step["dir"] == ".rlops-base" and ran <= SHELL | {"python", "venv/bin/pip"}, ran
            assert "python -I -m venv" in step["args"][1] and "-r src/requirements.txt" in step["args"][1]
        else:
            assert ran <= SHELL | {BASE_RLOPS}, (name, ran - SHELL - {BASE_RLOPS})
    assert {"git"} <= commands(steps["base"]["args"][1]) and BASE_RLOPS not in commands(steps["base"]["args"][1])


def test_a_pull_requests_own_tooling_never_runs_and_never_sees_the_token(workspace, github, tmp_path):
    """The pull request plants an `rlops` where the base's tooling goes: it is removed before anything runs."""
    leak = tmp_path / "leak"
    trap = workspace / ".rlops-base" / "venv" / "bin" / "rlops"
    trap.parent.mkdir(parents=True)
    trap.write_text(f'#!/bin/sh\necho "ran with GITHUB_TOKEN=$GITHUB_TOKEN" >> {leak}\n')
    trap.chmod(0o755)
    edit(workspace, "h200.yaml", "max_nodes: 2}", "max_nodes: 3}")
    git("checkout", "--quiet", "-b", "change", cwd=workspace)
    git("add", ".rlops-base", "environments", cwd=workspace)
    git("commit", "--quiet", "-m", "grow, and a trap", cwd=workspace)
    done = run_plan(workspace, github, {"_BASE_BRANCH": "main", "_PR_NUMBER": "11"})
    assert done.returncode == 0, done.stderr
    assert not leak.exists(), leak.read_text()
    assert "max_nodes" in github.comments_on(11)[0] and TOKEN not in done.stdout + done.stderr


def test_the_documented_plan_trigger_fires_on_every_pull_request_and_one_with_no_spec_passes_at_once(
        workspace, github):
    """A required check must report on every pull request: a trigger filtered to environments/** never runs on the
    others, which then can never merge. The trigger's build config is the base's (inline), not the PR's file."""
    setup = (REPO / "docs" / "gcp-setup.md").read_text()  # the triggers moved from the README (issue 39, 6)
    block = setup[setup.index("Repositories → 2nd gen"):]
    block = block[block.index("```sh") + 5:block.index("```", block.index("```sh") + 5)]
    (plan,) = [w for w in gcloud_calls(block) if w[:4] == ["builds", "triggers", "create", "github"]
               and "--pull-request-pattern" in w]
    assert "--included-files" not in plan and "--ignored-files" not in plan
    assert plan[plan.index("--inline-config") + 1] == "cloudbuild/plan.yaml" and "--build-config" not in plan
    assert all("Make `rlops-plan` a required check" in text for text in (setup, (REPO / "README.md").read_text()))
    (workspace / "NOTES.md").write_text("not an environment\n")
    git("checkout", "--quiet", "-b", "notes", cwd=workspace)
    git("add", "NOTES.md", cwd=workspace)
    git("commit", "--quiet", "-m", "notes", cwd=workspace)
    done = run_plan(workspace, github, {"_BASE_BRANCH": "main", "_PR_NUMBER": "12"})
    assert done.returncode == 0, done.stderr
    assert "No file under environments/ changed against main." in done.stdout
    assert not github.comments_on(12) and not [r for r in github.requests if "/issues/" in r.path]


def test_the_token_goes_to_origins_host_alone(monkeypatch):
    """`http.https://github.com/.extraHeader`, not `http.extraHeader`: git sends no token to a submodule's or a
    redirect's host, from the plan's fetch (bash) or `rlops github fetch` (the apply's)."""
    from rlops.cloud.github import git_credentials

    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    scoped = git_credentials("https://github.com/acme/envs.git")
    assert scoped["GIT_CONFIG_KEY_0"] == "http.https://github.com/.extraHeader"
    script = load("plan.yaml")["steps"][0]["args"][1]
    (expression,) = re.findall(r"sed -E '([^']+)'", script)
    host = subprocess.run(["sed", "-E", expression], input="https://github.com/acme/envs.git", capture_output=True,
                          text=True, check=True).stdout
    assert host == "https://github.com/" and 'GIT_CONFIG_KEY_0="http.$$host.extraHeader"' in script
