"""The doctor's checks of the project itself: its APIs, the caller's permissions, the node service account, the
token secrets, the state bucket and, once applied, rlops's deployment."""


from google.api_core import exceptions as gexc
from google.cloud import compute_v1, secretmanager_v1

from rlops.cloud.base import call, get_or_none
from rlops.permissions import Scope, calls, roles_granting, said_with_roles
from rlops.provision.doctor.reads import Finding, Reads
from rlops.provision.service import CloudEnvironment, secret_versions
from rlops.state.resources import ResourceRecord

# The APIs `apply` calls, by the service names Service Usage knows them by.
SERVICES = ("compute.googleapis.com", "container.googleapis.com", "lustre.googleapis.com",
            "servicenetworking.googleapis.com", "secretmanager.googleapis.com", "storage.googleapis.com")


# With `ray.image_cache`: the remote repository's API, and the Container File System API that GKE's image streaming
# reads images through (cloud.google.com/kubernetes-engine/docs/how-to/image-streaming, "Requirements").
IMAGE_CACHE_SERVICES = ("artifactregistry.googleapis.com", "containerfilesystem.googleapis.com")


@calls("serviceusage.services.batchGet")
def apis(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    client = reads.connection.discovery("serviceusage", "v1")
    parent = f"projects/{env.spec.project.id}"
    services = SERVICES + (IMAGE_CACHE_SERVICES if env.spec.ray.image_cache else ())
    request = client.services().batchGet(parent=parent, names=[f"{parent}/services/{s}" for s in services])
    answer = call("serviceusage", "read the project's services", request.execute)
    disabled = sorted(service["name"].rsplit("/", 1)[-1] for service in answer.get("services", [])
                      if service.get("state") != "ENABLED")
    if disabled:
        return [Finding("apis", "fail", f"not enabled: {', '.join(disabled)}",
                        f"gcloud services enable {' '.join(disabled)} --project={env.spec.project.id}")]
    return [Finding("apis", "ok", f"enabled: {', '.join(services)}")]


@calls("cloudresourcemanager.projects.testIamPermissions")
def permissions(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The caller's permissions on the project (Resource Manager `projects.testIamPermissions`, at most 100 a
    request): those of `reads.needs` granted on the project. The secrets' and the state bucket's are tested on
    them (`secrets`, `state_bucket`)."""
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.PROJECT})
    if not wanted:
        return []
    client = reads.connection.discovery("cloudresourcemanager", "v1")
    held: set[str] = set()
    for first in range(0, len(wanted), 100):
        request = client.projects().testIamPermissions(resource=env.spec.project.id,
                                                        body={"permissions": wanted[first:first + 100]})
        held |= set(call("cloudresourcemanager", "test the caller's permissions", request.execute)
                    .get("permissions", []))
    missing = [p for p in wanted if p not in held]
    if missing:
        return [Finding("permissions", "fail", "the caller lacks " + _with_roles(missing),
                        "grant those roles on the project to the account apply runs as (`rlops iam` lists them)")]
    return [Finding("permissions", "ok", f"the caller holds the {len(wanted)} permissions apply needs on the project")]


def _with_roles(permissions: list[str]) -> str:
    return ", ".join(said_with_roles(p) for p in permissions)


@calls("secretmanager.projects.secrets.versions.get", "secretmanager.projects.secrets.testIamPermissions")
def secrets(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """Each secret version the spec names exists and is enabled (its metadata, never its value), and the caller
    holds what it needs on the secret (`testIamPermissions` there: granted on the secret or the project)."""
    client = reads.connection.gapic("secretmanager", secretmanager_v1.SecretManagerServiceClient)

    paths = sorted(secret_versions(env.spec).items())  # (NAME, projects/P/secrets/S/versions/V)
    versions = [reads.start(path, "secretmanager", lambda path=path: client.get_secret_version(name=path),
                            missing_ok=True) for _, path in paths]
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.SECRET})
    permissions = [reads.start(f"the caller's permissions on {_secret_of(path)}", "secretmanager",
                               lambda path=path: client.test_iam_permissions(
                                   request={"resource": _secret_of(path), "permissions": wanted})) if wanted else None
                   for _, path in paths]
    answers = [(name, path, version.result(), [p for p in wanted if p not in held.result().permissions] if held else [])
               for (name, path), version, held in zip(paths, versions, permissions, strict=True)]
    found = []
    for name, path, version, lacking in answers:
        secret = _secret_of(path)
        if version is None:
            found.append(Finding(f"secret {name}", "fail", f"{path} does not exist",
                                 f"gcloud secrets versions add {secret.split('/')[3]} --data-file=- "
                                 f"--project={env.spec.project.id}"))
        elif version.state != version.State.ENABLED:
            found.append(Finding(f"secret {name}", "fail", f"{path} is {version.state.name}",
                                 "enable the version, or add a new one"))
        elif lacking:
            found.append(Finding(f"secret {name}", "fail", f"the caller lacks {_with_roles(lacking)} on {secret}: "
                                 "apply reads its value into the cluster's Secret",
                                 f"gcloud secrets add-iam-policy-binding "
                                 f"{secret.split('/')[3]} --project={env.spec.project.id} --member=... "
                                 f"--role={roles_granting(lacking[0])[0]}"))
        else:
            found.append(Finding(f"secret {name}", "ok", f"{path} is enabled, and the caller may read it"))
    return found


def _secret_of(version: str) -> str:
    """projects/P/secrets/S of projects/P/secrets/S/versions/V."""
    return version.split("/versions/")[0]


@calls("storage.buckets.testIamPermissions")
def state_bucket(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The bucket exists and the caller holds what it needs there (`testIamPermissions`, which any caller may
    ask); its versioning is read only where the caller may read the bucket's metadata (storage.buckets.get: not
    in the object roles apply needs)."""
    bucket = reads.bucket
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.BUCKET})
    held = get_or_none("storage", f"test the caller's permissions on gs://{bucket.name}", bucket.test_iam_permissions,
                       [*wanted, VERSIONING_READ])
    if held is None:
        return [Finding("state-bucket", "fail", f"no bucket {bucket.name}",
                        f"gcloud storage buckets create gs://{bucket.name} --uniform-bucket-level-access")]
    lacking = [p for p in wanted if p not in held]
    if lacking:
        return [Finding("state-bucket", "fail", f"the caller lacks {_with_roles(lacking)} on gs://{bucket.name}",
                        f"gcloud storage buckets add-iam-policy-binding gs://{bucket.name} --member=... "
                        f"--role={roles_granting(lacking[0])[0]}")]
    found = [Finding("state-bucket", "ok", f"{bucket.name} exists" + ", and the caller holds what apply needs there"
                     * bool(wanted))]
    held = set(held)
    if VERSIONING_READ in held:
        bucket.reload()
        if not bucket.versioning_enabled:
            found.append(Finding("state-bucket", "warn", "object versioning is off: an overwritten record cannot be "
                                 "recovered", f"gcloud storage buckets update gs://{bucket.name} --versioning"))
    return found


VERSIONING_READ = "storage.buckets.get"


FUNCTIONS = tuple(f"rlops-{target}" for target in ("train", "watch", "snapshot", "reap"))  # cloudbuild/deploy.yaml


TICK_JOB = "rlops-tick"


@calls("cloudfunctions.projects.locations.functions.list", "cloudscheduler.projects.locations.jobs.get")
def deployment(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """For an environment apply has made: rlops's functions are deployed and ACTIVE (Cloud Functions, every
    location) and the schedule that ticks them exists and is ENABLED (Cloud Scheduler, the functions'
    location). Without them a train message starts nothing and no one watches runs or reaps idle pools; apply
    itself needs neither, so a gap is a warning. Not checked: which specs the functions carry, and how many
    messages wait on the dead-letter subscription (Pub/Sub counts a backlog only in Cloud Monitoring)."""
    try:
        applied = bool(ResourceRecord(reads.bucket, env.spec.state.prefix, env.name).load().resources)
    except gexc.NotFound:  # no state bucket: said by its own check
        applied = False
    if not applied:
        return []
    project = env.spec.project.id
    functions = reads.connection.discovery("cloudfunctions", "v2").projects().locations().functions()
    listed, request = [], functions.list(parent=f"projects/{project}/locations/-")
    while request is not None:  # in pages: one alone may miss rlops's functions
        page = call("cloudfunctions", "list the project's functions", request.execute)
        listed += page.get("functions", [])
        request = functions.list_next(request, page)
    ours = {function["name"].rsplit("/", 1)[-1]: function for function in listed
            if function["name"].rsplit("/", 1)[-1] in FUNCTIONS}
    deploy = f"the deploy pipeline (cloudbuild/deploy.yaml) in {project}"
    found = []
    missing = [name for name in FUNCTIONS if name not in ours]
    broken = [f"{name} {function.get('state')}" for name, function in sorted(ours.items())
              if function.get("state") != "ACTIVE"]
    if missing or broken:
        said = ([f"not deployed: {', '.join(missing)}"] if missing else []) + (
            [f"not active: {', '.join(broken)}"] if broken else [])
        found.append(Finding("functions", "warn", "; ".join(said), f"run {deploy}"))
    else:
        found.append(Finding("functions", "ok", f"{', '.join(FUNCTIONS)} active"))
    if not ours:
        return found
    location = next(iter(ours.values()))["name"].split("/")[3]
    jobs = reads.connection.discovery("cloudscheduler", "v1").projects().locations().jobs()
    job = get_or_none("cloudscheduler", f"get the {TICK_JOB} schedule",
                      jobs.get(name=f"projects/{project}/locations/{location}/jobs/{TICK_JOB}").execute)
    if job is None or job.get("state") != "ENABLED":
        found.append(Finding("schedule", "warn", f"{TICK_JOB} in {location} " + (
            "does not exist" if job is None else f"is {job.get('state')}") + ": no tick watches runs or reaps idle "
            "pools", f"run {deploy}" if job is None else
            f"gcloud scheduler jobs resume {TICK_JOB} --project={project} --location={location}"))
    else:
        found.append(Finding("schedule", "ok", f"{TICK_JOB} in {location}, {job.get('schedule')}"))
    return found


@calls("compute.projects.get", "iam.projects.serviceAccounts.testIamPermissions")
def node_account(env: CloudEnvironment, reads: Reads) -> list[Finding]:
    """The caller may act as the account the nodes run as (GKE refuses to create a cluster or node pool
    otherwise): the Compute Engine default service account, as the spec names none."""
    wanted = sorted({n.permission for n in reads.needs if n.scope == Scope.NODE_SERVICE_ACCOUNT})
    if not wanted:
        return []
    project = reads.all({"project": reads.compute(compute_v1.ProjectsClient, "get", project=env.spec.project.id)})
    account = f"{project['project'].id}-compute@developer.gserviceaccount.com"
    request = reads.connection.discovery("iam", "v1").projects().serviceAccounts().testIamPermissions(
        resource=f"projects/-/serviceAccounts/{account}", body={"permissions": wanted})
    held = set(call("iam", f"test the caller's permissions on {account}", request.execute).get("permissions", []))
    lacking = [p for p in wanted if p not in held]
    if lacking:
        return [Finding("node-service-account", "fail", f"the caller lacks {_with_roles(lacking)} on {account}, "
                        "which the cluster's nodes run as", f"gcloud iam service-accounts add-iam-policy-binding "
                        f"{account} --member=... --role={roles_granting(lacking[0])[0]}")]
    return [Finding("node-service-account", "ok", f"the caller may act as {account}")]
