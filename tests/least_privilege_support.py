"""Calling as one rlops service account with exactly the roles `rlops iam` derives, or all but one, against the
fakes that enforce Google's IAM: shared by the least-privilege tests and the deploy pipeline's."""

from pathlib import Path

from fakes.iam import Iam, service_account
from rlops.permissions import Scope
from rlops.provision import accounts, bootstrap

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
                Scope.GITHUB_TOKEN: [f"projects/{PROJECT}/secrets/rlops-github-token"],
                Scope.BUCKET: ["projects/_/buckets/rlops-h200-example-state"],
                Scope.NODE_SERVICE_ACCOUNT: [f"projects/{PROJECT}/serviceAccounts/"
                                             f"{self.gcp.default_node_account(number)}"],
                Scope.EVENTS_TOPIC: [],
                Scope.FUNCTION_ACCOUNTS: [f"projects/{PROJECT}/serviceAccounts/{name}@{PROJECT}.iam.gserviceaccount.com"
                                          for name in bootstrap.FUNCTION_ACCOUNTS]}[scope]

    def act_as(self, key: str, without: str | None = None) -> str:
        """Calls from now on are made as account `key`, holding its roles (but `without`)."""
        account = accounts.account(key)
        member = service_account(account.name.split()[0], PROJECT)
        self.iam.forget(member)
        for grant in account.grants():
            if grant.role != without:
                for resource in self.resources(grant.scope):
                    self.iam.grant(member, grant.role, on=resource)
        key_file = self.iam.credentials_file(member, f"{self.gcp._server.url}/token", self.folder)
        self.monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
        return member


def checked_roles(key: str, but: tuple[str, ...] = ()) -> list[str]:
    """An account's roles but those on the events topic (Google's Pub/Sub emulator, which publishes here, has no
    IAM: cloud.google.com/pubsub/docs/emulator, "does not support ... IAM") and the build logs' (Cloud Build
    writes them; no pipeline runs on Cloud Build here), and `but`."""
    return [g.role for g in accounts.account(key).grants() if g.scope != Scope.EVENTS_TOPIC
            and g.role != "roles/logging.logWriter" and g.role not in but]
