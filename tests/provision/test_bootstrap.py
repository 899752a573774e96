"""`rlops bootstrap PROJECT`: the commands grant exactly what `rlops iam` derives, each parses as the installed
gcloud parses it (flags are checked before credentials are asked for), and --apply runs them in order."""

import os
import re
import shlex
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlops import cli
from rlops.permissions import Scope
from rlops.provision import accounts, bootstrap

pytestmark = pytest.mark.servers

REPOSITORY = "projects/my-proj/locations/us-central1/connections/c/repositories/envs"


def printed(capsys, *extra: str) -> list[str]:
    assert cli.main(["bootstrap", "my-proj", "--dry-run", *extra]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]


def test_every_role_rlops_iam_derives_is_granted_to_its_account_where_it_says(capsys):
    lines = printed(capsys)
    for account in accounts.ACCOUNTS:
        member = f"serviceAccount:{account.name.split()[0]}@my-proj.iam.gserviceaccount.com"
        for grant in account.grants():
            granting = [line for line in lines if f"--member {member}" in line and f"--role {grant.role}" in line]
            where = {Scope.PROJECT: "projects add-iam-policy-binding my-proj", Scope.BUCKET: "gs://my-proj-rlops-state",
                     Scope.SECRET: "secrets add-iam-policy-binding hf-token",
                     Scope.GITHUB_TOKEN: "secrets add-iam-policy-binding rlops-github-token",
                     Scope.NODE_SERVICE_ACCOUNT: "-compute@developer.gserviceaccount.com",
                     Scope.EVENTS_TOPIC: "topics add-iam-policy-binding rlops-events",
                     Scope.FUNCTION_ACCOUNTS: "rlops-train@my-proj.iam.gserviceaccount.com"}[grant.scope]
            assert any(where in line for line in granting), (account.name, grant)
    assert not any("printf" in line and "hf_" in line for line in lines), "a token is read from the environment"


def test_each_command_parses_as_the_installed_gcloud_parses_it(capsys, tmp_path):
    """gcloud checks a command's arguments before it looks for credentials: with none configured, a command it
    accepts stops at "no active account"; one it does not says why (unrecognized arguments, a missing flag)."""
    lines = printed(capsys, "--repository", REPOSITORY)
    shapes = {}
    for line in lines:
        words = shlex.split(re.sub(r"\$\(gcloud projects describe \S+ --format='value\(projectNumber\)'\)", "123456789",
                                    line.split("| ", 1)[-1]))
        shapes.setdefault(tuple(words[:4]), words)
    assert len(shapes) >= 12
    environ = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda words: subprocess.run(words, capture_output=True, text=True, env=environ,
                                                             timeout=120, stdin=subprocess.DEVNULL),
                                shapes.values()))
    for words, answer in zip(shapes.values(), answers, strict=True):
        assert "unrecognized arguments" not in answer.stderr and "must be specified" not in answer.stderr and \
            "Invalid choice" not in answer.stderr, (words, answer.stderr)
        assert "active account" in answer.stderr or "credential" in answer.stderr.lower(), (words, answer.stderr)


def test_apply_runs_every_step_in_order_and_takes_already_exists_as_done(capsys, tmp_path, monkeypatch):
    log = tmp_path / "gcloud.log"
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.parent.mkdir()
    gcloud.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in "projects describe"*) echo 123456789 ;; esac
case "$*" in "iam service-accounts create rlops-apply"*) echo "ERROR: already exists" >&2; exit 1 ;; esac
""")
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{gcloud.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert cli.main(["bootstrap", "my-proj", "--apply"]) == 0
    ran = [line for line in log.read_text().splitlines() if not line.startswith("projects describe")]
    assert len(ran) == len(bootstrap.steps("my-proj", "us-central1")) and ran[0].startswith("services enable")
    assert "already there" in capsys.readouterr().out
    gcloud.write_text(gcloud.read_text().replace("rlops-apply", "rlops-plan").replace('"ERROR: already exists"',
                                                                                      '"ERROR: permission denied"'))
    assert cli.main(["bootstrap", "my-proj", "--apply"]) == 1
    assert "bootstrap stopped at step" in capsys.readouterr().err
