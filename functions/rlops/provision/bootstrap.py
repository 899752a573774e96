"""`rlops bootstrap PROJECT`: the gcloud commands that take an empty project to "push to provision": the APIs,
the state bucket, the secrets, the service accounts with the roles `rlops iam` derives (`accounts.ACCOUNTS`, so
the two never disagree), the grants rlops's code does not run as (the function build account, Pub/Sub's and
Managed Lustre's service agents), the deploy, and the triggers once a repository is connected.

Each step is (why, argv); a value only the project knows when it runs (its number) is read by the step that
needs it, with `gcloud projects describe`. Nothing here runs a command.
"""

from dataclasses import dataclass

from rlops.permissions import Scope
from rlops.provision.accounts import ACCOUNTS, Account

SERVICES = ("compute.googleapis.com", "container.googleapis.com", "lustre.googleapis.com",
            "servicenetworking.googleapis.com", "secretmanager.googleapis.com", "storage.googleapis.com",
            "pubsub.googleapis.com", "cloudfunctions.googleapis.com", "run.googleapis.com",
            "cloudbuild.googleapis.com", "cloudscheduler.googleapis.com", "artifactregistry.googleapis.com",
            "containerfilesystem.googleapis.com",
            "cloudquotas.googleapis.com", "serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com")
SECRETS = ("hf-token", "wandb-api-key", "rlops-github-token")
FUNCTION_ACCOUNTS = ("rlops-train", "rlops-watch", "rlops-snapshot", "rlops-reap", "rlops-push",
                     "rlops-function-build")
NUMBER = "$(gcloud projects describe {project} --format='value(projectNumber)')"


@dataclass(frozen=True)
class Step:
    why: str
    argv: tuple[str, ...]
    shell: bool = False  # a pipe or a $(...) in it: run by sh -c, as printed

    def said(self) -> str:
        return " ".join(self.argv) if self.shell else " ".join(_quoted(word) for word in self.argv)


def _quoted(word: str) -> str:
    if word and all(c.isalnum() or c in "@%+=:,./_-" for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def steps(project: str, region: str, bucket: str | None = None, repository: str | None = None) -> list[Step]:
    bucket = bucket or f"{project}-rlops-state"
    found = [Step("the APIs rlops and its pipelines call", ("gcloud", "services", "enable", *SERVICES,
                                                           "--project", project)),
             Step("the state bucket", ("gcloud", "storage", "buckets", "create", f"gs://{bucket}", "--project",
                                       project, "--location", region, "--uniform-bucket-level-access")),
             Step("versioned, so an overwritten record can be recovered",
                  ("gcloud", "storage", "buckets", "update", f"gs://{bucket}", "--versioning"))]
    for secret in SECRETS:
        variable = secret.upper().replace("-", "_").replace("RLOPS_", "")
        found.append(Step(f"the secret {secret}, from ${variable}", (
            f'printf %s "${variable}" |', "gcloud", "secrets", "create", secret, "--data-file=-", "--project",
            project), shell=True))
    names = sorted({a.name.split()[0] for a in ACCOUNTS} | set(FUNCTION_ACCOUNTS))
    found += [Step(f"the service account {name}", ("gcloud", "iam", "service-accounts", "create", name,
                                                   "--project", project)) for name in names]
    found.append(Step("the events topic, to grant on (deploy.yaml keeps it)", (
        "gcloud", "pubsub", "topics", "create", "rlops-events", "--project", project)))
    for account in ACCOUNTS:
        found += _grants(account, project, bucket)
    found += _others(project, bucket)
    found.append(Step("the functions, topics, subscriptions and schedule, deployed as rlops-deploy", (
        "gcloud", "builds", "submit", "--config", "cloudbuild/deploy.yaml", "--substitutions", f"_REGION={region}",
        "--region", region, "--project", project, "--service-account",
        f"projects/{project}/serviceAccounts/rlops-deploy@{project}.iam.gserviceaccount.com")))
    if repository:
        found += _triggers(project, region, repository)
    return found


def _member(account: Account, project: str) -> str:
    return f"serviceAccount:{account.name.split()[0]}@{project}.iam.gserviceaccount.com"


def _grants(account: Account, project: str, bucket: str) -> list[Step]:
    member, found = _member(account, project), []
    for grant in account.grants():
        why = (f"{account.name}: {grant.role} "
               f"({', '.join(grant.permissions[:3])}{', ...' * (len(grant.permissions) > 3)})")
        if grant.scope == Scope.PROJECT:
            found.append(Step(why, ("gcloud", "projects", "add-iam-policy-binding", project, "--member", member,
                                    "--role", grant.role, "--condition=None")))
        elif grant.scope in (Scope.SECRET, Scope.GITHUB_TOKEN):
            for secret in SECRETS if grant.scope == Scope.SECRET else ("rlops-github-token",):
                found.append(Step(why, ("gcloud", "secrets", "add-iam-policy-binding", secret, "--project", project,
                                        "--member", member, "--role", grant.role)))
        elif grant.scope == Scope.BUCKET:
            found.append(Step(why, ("gcloud", "storage", "buckets", "add-iam-policy-binding", f"gs://{bucket}",
                                    "--member", member, "--role", grant.role)))
        elif grant.scope == Scope.NODE_SERVICE_ACCOUNT:
            found.append(Step(why, ("gcloud", "iam", "service-accounts", "add-iam-policy-binding",
                                    f"{NUMBER.format(project=project)}-compute@developer.gserviceaccount.com",
                                    "--project", project, "--member", member, "--role", grant.role), shell=True))
        elif grant.scope == Scope.EVENTS_TOPIC:
            found.append(Step(why, ("gcloud", "pubsub", "topics", "add-iam-policy-binding", "rlops-events",
                                    "--project", project, "--member", member, "--role", grant.role)))
        else:  # Scope.FUNCTION_ACCOUNTS: deploying a function to run (or build) as one is acting as it
            found += [Step(why, ("gcloud", "iam", "service-accounts", "add-iam-policy-binding",
                                 f"{name}@{project}.iam.gserviceaccount.com", "--project", project, "--member",
                                 member, "--role", grant.role)) for name in FUNCTION_ACCOUNTS]
    return found


def _others(project: str, bucket: str) -> list[Step]:
    """The accounts rlops's own code does not run as (the README's second table)."""
    number = NUMBER.format(project=project)
    return [
        Step("rlops-function-build builds the functions' images (deploy.yaml's --build-service-account)", (
            "gcloud", "projects", "add-iam-policy-binding", project, "--member",
            f"serviceAccount:rlops-function-build@{project}.iam.gserviceaccount.com", "--role",
            "roles/cloudbuild.builds.builder", "--condition=None")),
        Step("Pub/Sub's service agent mints rlops-push's token for the push subscriptions", (
            "gcloud", "iam", "service-accounts", "add-iam-policy-binding",
            f"rlops-push@{project}.iam.gserviceaccount.com", "--project", project, "--member",
            f"serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com", "--role",
            "roles/iam.serviceAccountTokenCreator"), shell=True),
        Step("Managed Lustre's service agent reads and writes exported and imported checkpoints", (
            "gcloud", "storage", "buckets", "add-iam-policy-binding", f"gs://{bucket}", "--member",
            f"serviceAccount:service-{number}@gcp-sa-lustre.iam.gserviceaccount.com", "--role",
            "roles/storage.objectUser"), shell=True),
    ]


def _triggers(project: str, region: str, repository: str) -> list[Step]:
    def trigger(name: str, *how: str) -> Step:
        return Step(f"the {name} trigger", ("gcloud", "builds", "triggers", "create", "github", "--name", name,
                                            "--region", region, "--repository", repository, *how,
                                            "--service-account", f"projects/{project}/serviceAccounts/"
                                            f"{name}@{project}.iam.gserviceaccount.com"))

    # The live plan: rlops-plan holds the plan-live account's roles (ACCOUNTS), so it can read what it compares.
    return [trigger("rlops-plan", "--pull-request-pattern", "^main$", "--comment-control",
                    "COMMENTS_ENABLED_FOR_EXTERNAL_CONTRIBUTORS_ONLY", "--inline-config", "cloudbuild/plan.yaml",
                    "--substitutions", "_LIVE_PLAN=true"),
            trigger("rlops-apply", "--branch-pattern", "^main$", "--included-files", "environments/**",
                    "--build-config", "cloudbuild/apply.yaml"),
            trigger("rlops-deploy", "--branch-pattern", "^main$", "--included-files",
                    "functions/**,requirements.txt,requirements.lock,environments/**", "--build-config",
                    "cloudbuild/deploy.yaml")]


def script(found: list[Step]) -> str:
    return "".join(f"# {step.why}\n{step.said()}\n" for step in found)
