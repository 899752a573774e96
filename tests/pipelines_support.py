"""The harness of the Cloud Build pipeline tests: the pipelines' files and their step scripts
filled in as Cloud Build fills them, and run as it runs them in a trigger's checkout of a workspace pushed to the fake
GitHub. A pytest plugin (tests/conftest.py loads it), so the tests find its fixtures, `github` and `workspace`."""

import itertools
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

PIPELINES = REPO / "cloudbuild"
REFERENCE = re.compile(r"(?<!\$)\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
TOKEN = "ghp_PLANTEDgithubTOKEN0123456789abcdef"


def load(name: str) -> dict:
    return yaml.safe_load((PIPELINES / name).read_text())


def scripts(build: dict) -> dict[str, str]:
    return {step["id"]: step["args"][1] for step in build["steps"] if step.get("entrypoint") == "bash"}


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


def git(*args, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def github(tmp_path):
    """The fake GitHub: its API, and `acme/envs` as a private repository served only to the token."""
    with FakeGitHub(TOKEN) as server:
        server.git_root = tmp_path / "github"
        yield server


@pytest.fixture
def workspace(tmp_path, monkeypatch, github):
    """The author's clone of `acme/envs`, whose main holds the seed environments; builds check out what it pushes."""
    origin, work = github.git_root / "acme" / "envs.git", tmp_path / "author"
    origin.parent.mkdir(parents=True)
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


_checkouts = itertools.count()


def trigger_checkout(work: Path, github: FakeGitHub, commit: str, venv: bool = True) -> Path:
    """What a Cloud Build trigger gives its steps: the commit alone (depth 1), with `origin` the private
    repository's URL and no credentials for it; with `venv`, the apply pipeline's installed `.venv`."""
    branch = git("rev-parse", "--abbrev-ref", "HEAD", cwd=work)
    git("push", "--quiet", "--force", "origin", branch, cwd=work)
    build = work.parent / f"build-{next(_checkouts)}"
    git("clone", "--quiet", "--depth", "1", "--branch", branch, f"file://{github.git_root}/acme/envs.git", str(build),
        cwd=work.parent)
    if git("rev-parse", "HEAD", cwd=build) != commit:  # an older build of the branch
        git("fetch", "--quiet", "--depth", "1", "origin", commit, cwd=build)
        git("checkout", "--quiet", "--detach", commit, cwd=build)
    git("remote", "set-url", "origin", github.clone_url("acme/envs"), cwd=build)
    if venv:
        (build / ".venv").symlink_to(Path(sys.prefix))
    return build


def run_script(checkout: Path, github: FakeGitHub, build: dict, step: dict, values: dict[str, str], head: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One step as Cloud Build runs it: in its `dir`, with the token (Secret Manager's, or `env`'s) only if the
    step lists it in `secretEnv`."""
    defaults = {k: str(v) for k, v in build.get("substitutions", {}).items()}
    script = fill(step["args"][1], {**defaults, "PROJECT_ID": "rlops-ci", "REPO_FULL_NAME": "acme/envs",
                                    "COMMIT_SHA": head, "SHORT_SHA": head[:7], **values})
    environment = {**os.environ, "RLOPS_GITHUB_API": github.url, **(env or {})}
    token = environment.pop("GITHUB_TOKEN", TOKEN)
    if "GITHUB_TOKEN" in step.get("secretEnv", []):
        environment["GITHUB_TOKEN"] = token
    return subprocess.run(["bash", "-ec", script], cwd=checkout / step.get("dir", ""), env=environment,
                          capture_output=True, text=True, timeout=300)


def run_step(work: Path, github: FakeGitHub, build: dict, step: str, values: dict[str, str],
             env: dict[str, str] | None = None, commit: str | None = None):
    """The step's script in a fresh trigger checkout of `commit` (the author's HEAD)."""
    head = commit or git("rev-parse", "HEAD", cwd=work)
    (found,) = [s for s in build["steps"] if s["id"] == step]
    return run_script(trigger_checkout(work, github, head), github, build, found, values, head, env)


def installed_base_tooling(checkout: Path) -> None:
    """plan.yaml's `install` step, but for pip: the base's tooling is this interpreter's environment. Like the step,
    it installs nothing when no environment changed, and it writes only where the step would."""
    base = checkout / ".rlops-base"
    if not (base / "unchanged").exists() and not (base / "venv").exists():
        (base / "venv").symlink_to(Path(sys.prefix))


def run_plan(work: Path, github: FakeGitHub, values: dict[str, str],
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The whole plan pipeline on the author's HEAD, its steps in order in one trigger checkout (without the
    apply pipeline's `.venv`), ending at the first that fails, as Cloud Build does."""
    build, head = load("plan.yaml"), git("rev-parse", "HEAD", cwd=work)
    checkout = trigger_checkout(work, github, head, venv=False)
    done = []
    for step in build["steps"]:
        if step["id"] == "install":
            installed_base_tooling(checkout)
            continue
        done.append(run_script(checkout, github, build, step, values, head, env))
        if done[-1].returncode:
            break
    return subprocess.CompletedProcess(["cloudbuild/plan.yaml"], done[-1].returncode,
                                       "".join(d.stdout for d in done), "".join(d.stderr for d in done))


def edit(work: Path, name: str, old: str, new: str) -> None:
    path = work / "environments" / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
