"""Each rlops service account, with exactly the roles `rlops iam` derives (the README's table), against fakes
that enforce Google's IAM (tests/fakes/iam.py, tests/fakes/gcs_iam.py): what it does works, and without any
one of its roles the first call that needs it fails naming the permission and the role, with nothing changed.
"""

import json
import re
import textwrap
from pathlib import Path

import pytest

from fakes.iam import Iam, service_account
from rlops import cli
from rlops.cloud import base
from rlops.permissions import Scope, roles
from rlops.provision import accounts

REPO = Path(__file__).resolve().parent.parent
PROJECT = "rlops-h200-example"


class Enforced:
    """The fake GCP and the state bucket enforcing IAM, and a way to call as one account with chosen roles."""

    def __init__(self, gcp, iam: Iam, folder: Path, monkeypatch):
        self.gcp, self.iam, self.folder, self.monkeypatch = gcp, iam, folder, monkeypatch

    def resources(self, scope: Scope) -> list[str]:
        """Where the README grants a role of this scope, for the h200 seed."""
        number = self.gcp._project_number(PROJECT)
        return {Scope.PROJECT: [f"projects/{PROJECT}"],
                Scope.SECRET: [f"projects/{PROJECT}/secrets/{name}" for name in ("hf-token", "wandb-api-key",
                                                                                 "rlops-github-token")],
                Scope.BUCKET: ["projects/_/buckets/rlops-h200-example-state"],
                Scope.NODE_SERVICE_ACCOUNT: [f"projects/{PROJECT}/serviceAccounts/"
                                             f"{self.gcp.default_node_account(number)}"],
                Scope.EVENTS_TOPIC: [], Scope.FUNCTION_ACCOUNTS: []}[scope]

    def act_as(self, key: str, without: str | None = None) -> str:
        """Calls from now on are made as account `key`, holding its roles (but `without`)."""
        account = accounts.account(key)
        member = service_account(account.name.split()[0], PROJECT)
        for grant in account.grants():
            if grant.role != without:
                for resource in self.resources(grant.scope):
                    self.iam.grant(member, grant.role, on=resource)
        key_file = self.iam.credentials_file(member, f"{self.gcp._server.url}/token", self.folder)
        self.monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
        return member


@pytest.fixture
def enforced(cloud_fakes, gcs, specs, tmp_path, monkeypatch):
    gcp, _ = cloud_fakes
    gate = gcs.gate
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.05))
    gcp.iam = gate.iam = Iam(PROJECT)
    try:
        yield Enforced(gcp, gcp.iam, tmp_path, monkeypatch)
    finally:
        gate.iam = None


def test_the_readmes_table_is_what_rlops_iam_derives():
    readme = (REPO / "README.md").read_text()
    assert textwrap.indent(accounts.render("markdown"), "   ") in readme


def test_apply_works_as_rlops_apply_with_its_roles_and_calls_only_what_it_declares(enforced, capsys):
    member = enforced.act_as("apply")
    assert cli.main(["apply", "h200"]) == 0, capsys.readouterr().err
    declared = {n.permission for n in accounts.account("apply").needs()}
    used = {permission for caller, permission, _ in enforced.iam.checked if caller == member}
    assert used and used - LIBRARIES_TRY <= declared, used - declared


# Asked by the client libraries on their own and let go when refused: google-cloud-storage reads a bucket's
# metadata in the background for its cache (google/cloud/storage/_bucket_metadata_cache.py).
LIBRARIES_TRY = {"storage.buckets.get"}


@pytest.mark.parametrize("role", [g.role for g in accounts.account("apply").grants()])
def test_without_any_one_of_its_roles_apply_stops_before_its_first_change_naming_what_is_missing(
        enforced, capsys, role):
    enforced.act_as("apply", without=role)
    assert cli.main(["apply", "h200"]) == 1
    said = capsys.readouterr().err
    lacking = set(re.findall(r"([a-z]+(?:\.[A-Za-z]+)+) \(in (roles/[\w.]+)", said))
    assert lacking, said
    assert all(permission in roles()[granted].permissions for permission, granted in lacking)
    assert any(granted == role for _, granted in lacking) or all(
        permission in roles()[role].permissions for permission, _ in lacking), said
    assert enforced.gcp.mutations() == [], "apply changed something"
