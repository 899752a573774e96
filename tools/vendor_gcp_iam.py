"""Vendor the slice of Google's IAM data rlops needs, from iann0036/iam-dataset (MIT), as data.

    python tools/vendor_gcp_iam.py /work/.mirror/iann0036+iam-dataset/repo

writes functions/rlops/spec/gcp_iam/{methods.json,roles.json,SOURCE.json}:
- methods.json: REST method id (as the discovery documents name it) -> the permissions Google checks for it,
  for the APIs rlops calls (gcp/map.json). Managed Lustre and Cloud Quotas are not in map.json: their
  methods are added from Google's access-control pages (cloud.google.com/managed-lustre/docs/access-control,
  cloud.google.com/docs/quotas/permissions), whose permission names the roles below confirm.
- roles.json: each predefined role of those services (gcp/roles/*.json; service agents, legacy and basic
  roles left out, as no one grants them to a workload's account): title, stage, how many permissions it
  grants in all, and which of them rlops could need (those of methods.json and EXTRA_PERMISSIONS).
"""

import json
import subprocess
import sys
from pathlib import Path

SERVICES = ("compute", "container", "lustre", "secretmanager", "storage", "pubsub", "logging", "iam",
            "cloudfunctions", "cloudscheduler", "run", "serviceusage", "cloudquotas", "servicenetworking",
            "cloudbuild", "resourcemanager", "artifactregistry")
APIS = ("container", "servicenetworking", "secretmanager", "serviceusage", "cloudresourcemanager",
        "cloudfunctions", "cloudscheduler", "storage", "pubsub", "iam", "run", "artifactregistry")
COMPUTE_COLLECTIONS = ("networks", "subnetworks", "firewalls", "addresses", "globalAddresses", "globalOperations",
                       "regionOperations", "zoneOperations", "projects", "regions", "zones", "reservations",
                       "networkProfiles", "machineTypes", "instances", "resourcePolicies")
LUSTRE = {  # google.cloud.lustre.v1.Lustre's REST methods -> cloud.google.com/managed-lustre/docs/access-control
    "lustre.projects.locations.list": ["lustre.locations.list"],
    "lustre.projects.locations.get": ["lustre.locations.get"],
    "lustre.projects.locations.instances.list": ["lustre.instances.list"],
    "lustre.projects.locations.instances.get": ["lustre.instances.get"],
    "lustre.projects.locations.instances.create": ["lustre.instances.create"],
    "lustre.projects.locations.instances.patch": ["lustre.instances.update"],
    "lustre.projects.locations.instances.delete": ["lustre.instances.delete"],
    "lustre.projects.locations.instances.exportData": ["lustre.instances.exportData"],
    "lustre.projects.locations.instances.importData": ["lustre.instances.importData"],
    "lustre.projects.locations.operations.get": ["lustre.operations.get"],
    "lustre.projects.locations.operations.list": ["lustre.operations.list"],
}
CLOUDQUOTAS = {  # cloud.google.com/docs/quotas/permissions
    "cloudquotas.projects.locations.services.quotaInfos.get": ["cloudquotas.quotas.get"],
    "cloudquotas.projects.locations.services.quotaInfos.list": ["cloudquotas.quotas.get"],
}
# Methods map.json lists with no permission that Google's pages name one for: creating or updating a
# private-services-access connection needs servicenetworking.services.addPeering
# (cloud.google.com/vpc/docs/configure-private-services-access, "Permissions").
OVERRIDES = {"servicenetworking.services.connections.create": ["servicenetworking.services.addPeering"],
             "servicenetworking.services.connections.patch": ["servicenetworking.services.addPeering"],
             # "There are no permissions required to make this API call" (the method's reference page), as for
             # every testIamPermissions; map.json leaves this one out.
             "iam.projects.serviceAccounts.testIamPermissions": [],
             # "pubsub.subscriptions.create on the containing Cloud project, and pubsub.topics.attachSubscription
             # on the requested topic" (cloud.google.com/pubsub/docs/access-control, "Required permissions");
             # map.json has the first alone.
             "pubsub.projects.subscriptions.create": ["pubsub.subscriptions.create",
                                                      "pubsub.topics.attachSubscription"]}
# Checked by Google beside a method's own permission, so not in map.json: acting as the node service account
# when a cluster or node pool names one (cloud.google.com/kubernetes-engine/docs/how-to/service-accounts),
# writing the pipelines' logs, and the Kubernetes API through GKE IAM (the Ray dashboard's service proxy, the
# objects apply writes: cloud.google.com/kubernetes-engine/docs/reference/api-permissions).
EXTRA_PERMISSIONS = ("iam.serviceAccounts.actAs", "logging.logEntries.create", "container.services.proxy",
                     "container.services.get", "container.pods.list", "container.pods.get", "container.events.list",
                     "container.nodes.list", "container.secrets.get", "container.secrets.update",
                     "container.secrets.create", "container.customResourceDefinitions.create",
                     "container.thirdPartyObjects.create", "container.thirdPartyObjects.update",
                     "container.thirdPartyObjects.get", "container.thirdPartyObjects.list",
                     "container.thirdPartyObjects.delete", "cloudfunctions.functions.list",
                     "cloudscheduler.jobs.get", "pubsub.topics.publish", "run.routes.invoke",
                     "cloudbuild.builds.create", "cloudfunctions.functions.create", "cloudfunctions.functions.update",
                     "cloudfunctions.functions.get", "cloudfunctions.operations.get",
                     "run.services.setIamPolicy", "run.services.getIamPolicy",
                     "pubsub.topics.create", "pubsub.topics.get", "pubsub.subscriptions.create",
                     "pubsub.subscriptions.get", "pubsub.subscriptions.update", "pubsub.topics.setIamPolicy",
                     "pubsub.subscriptions.setIamPolicy", "cloudscheduler.jobs.create", "cloudscheduler.jobs.update",
                     "iam.serviceAccounts.getAccessToken", "storage.buckets.get",
                     "servicenetworking.services.addPeering")


# The Kubernetes objects apply writes and prunes, by their GKE IAM names (CustomResources are thirdPartyObjects).
EXTRA_PERMISSIONS += tuple(f"container.{kind}.{verb}" for kind in (
    "namespaces", "serviceAccounts", "secrets", "persistentVolumes", "persistentVolumeClaims", "daemonSets",
    "thirdPartyObjects", "customResourceDefinitions", "pods", "events", "services")
    for verb in ("create", "update", "get", "list", "delete", "proxy"))


# A permission whose verb starts so only reads (its last segment: get, list, getIamPolicy, ...).
READ_VERBS = ("get", "list", "aggregatedList", "search", "read", "view", "watch", "access")


def show(repo: Path, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo / '.git'}" if (repo / ".git").exists() else f"--git-dir={repo}",
                           "show", f"HEAD:{path}"], check=True, capture_output=True, text=True).stdout


def main(repo: Path, out: Path) -> None:
    git = ["git", f"--git-dir={repo / '.git'}" if (repo / ".git").exists() else f"--git-dir={repo}"]
    commit, date = subprocess.run(git + ["log", "-1", "--format=%H %cI"], check=True, capture_output=True,
                                  text=True).stdout.split()
    api = json.loads(show(repo, "gcp/map.json"))["api"]
    methods: dict[str, list[str]] = {}
    for name in APIS:
        for method, entry in api[name]["methods"].items():
            methods[method] = sorted({p["name"] for p in entry.get("permissions", [])})
    for method, entry in api["compute"]["methods"].items():
        if method.split(".")[1] in COMPUTE_COLLECTIONS:
            methods[method] = sorted({p["name"] for p in entry.get("permissions", [])})
    methods.update(LUSTRE)
    methods.update(CLOUDQUOTAS)
    methods.update(OVERRIDES)
    relevant = {p for permissions in methods.values() for p in permissions} | set(EXTRA_PERMISSIONS)
    listing = subprocess.run(git + ["ls-tree", "--name-only", "HEAD", "gcp/roles/"], check=True,
                             capture_output=True, text=True).stdout.split()
    roles = {}
    for path in listing:
        name = path.rsplit("/", 1)[1].removesuffix(".json")
        if name.split(".")[0] not in SERVICES or ".legacy" in name or name.endswith(("Agent", "Service")):
            continue  # service agents' and Google services' own roles, and legacy roles: no one grants them
        role = json.loads(show(repo, path))
        granted = role.get("includedPermissions", [])
        roles[f"roles/{name}"] = {"title": role.get("title", ""), "stage": role.get("stage", ""),
                                  "permission_count": len(granted),
                                  "write_count": sum(not p.rsplit(".", 1)[-1].startswith(READ_VERBS) for p in granted),
                                  "permissions": sorted(relevant.intersection(granted))}
    # A permission no predefined role grants is one map.json lists as an alternative (generateUploadUrl beside
    # sourceCodeSet): Google cannot require what no one could be granted.
    granted_somewhere = {p for role in roles.values() for p in role["permissions"]}
    methods = {method: [p for p in permissions if p in granted_somewhere] for method, permissions in methods.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "methods.json").write_text(json.dumps(dict(sorted(methods.items())), indent=0) + "\n")
    (out / "roles.json").write_text(json.dumps(dict(sorted(roles.items())), indent=0) + "\n")
    (out / "SOURCE.json").write_text(json.dumps({
        "repository": "https://github.com/iann0036/iam-dataset", "license": "MIT", "commit": commit,
        "commit_date": date, "files": ["gcp/map.json", "gcp/roles/*.json"],
        "added_by_hand": {"lustre": "cloud.google.com/managed-lustre/docs/access-control",
                          "cloudquotas": "cloud.google.com/docs/quotas/permissions",
                          "servicenetworking connections create/patch":
                              "cloud.google.com/vpc/docs/configure-private-services-access",
                          "pubsub subscriptions create": "cloud.google.com/pubsub/docs/access-control"},
        "left_out": "from methods.json, the permissions no predefined role grants (alternatives map.json lists)",
        "made_by": "tools/vendor_gcp_iam.py"}, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parents[1] / "functions/rlops/spec/gcp_iam")
