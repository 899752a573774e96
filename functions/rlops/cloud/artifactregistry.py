"""Artifact Registry: the image cache, a Docker remote repository of the Ray image's registry (artifactregistry v1
through google-api-python-client, as servicenetworking), and who may read it (its IAM policy)."""

from rlops.cloud.base import Connection, Http, Pending, Read, Target, call, get_or_none, longrunning, read_each
from rlops.permissions import calls
from rlops.resource_shapes import Live, Resource
from rlops.spec.images import DOCKER_HUB

API = "artifactregistry"
READER = "roles/artifactregistry.reader"


class RemoteRepositories:
    kinds = ("remote_repository",)

    def __init__(self, target: Target, connection: Connection, http: Http | None = None):
        self.target = target
        self.client = connection.discovery(API, "v1", http)

    def _repositories(self):
        return self.client.projects().locations().repositories()

    def _parent(self, location: str) -> str:
        return f"projects/{self.target.project}/locations/{location}"

    def _name(self, name: str, fields: dict) -> str:
        return f"{self._parent(fields.get('location') or self.target.region)}/repositories/{name}"

    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        return read_each(self, API, wanted)  # a get and its policy: an environment has one repository

    @calls("artifactregistry.projects.locations.repositories.get",
           "artifactregistry.projects.locations.repositories.getIamPolicy")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        path = self._name(name, fields)
        found = get_or_none(API, f"get repository {name}", self._repositories().get(name=path).execute)
        if found is None:
            return None
        docker = found.get("remoteRepositoryConfig", {}).get("dockerRepository", {})
        upstream = docker.get("publicRepository") or docker.get("customRepository", {}).get("uri")
        policy = call(API, f"get the IAM policy of {name}", self._repositories().getIamPolicy(resource=path).execute)
        readers = sorted(m for b in policy.get("bindings", []) if b.get("role") == READER for m in b.get("members", []))
        wanted = fields.get("readers") or []
        # Other readers (granted by hand, or another environment's) may be there: ours being there is enough.
        if set(wanted) <= set(readers):
            readers = wanted
        location = path.split("/")[3]
        return Live({"location": location, "upstream": upstream if found.get("mode") == "REMOTE_REPOSITORY" else None,
                     "readers": readers}, self.target.owns_labels(found.get("labels")))

    @calls("artifactregistry.projects.locations.repositories.create",
           "artifactregistry.projects.locations.operations.get",
           "artifactregistry.projects.locations.repositories.getIamPolicy",
           "artifactregistry.projects.locations.repositories.setIamPolicy")
    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        docker = ({"publicRepository": DOCKER_HUB} if d["upstream"] == DOCKER_HUB
                  else {"customRepository": {"uri": d["upstream"]}})
        body = {"format": "DOCKER", "mode": "REMOTE_REPOSITORY", "labels": dict(resource.labels),
                "description": f"rlops's cache of {d['upstream']}",
                "remoteRepositoryConfig": {"description": d["upstream"], "dockerRepository": docker}}
        request = self._repositories().create(parent=self._parent(d["location"]), repositoryId=resource.name,
                                              body=body)
        created = self._wait(call(API, f"create repository {resource.name}", request.execute))
        granted: list[Pending] = []

        def poll() -> tuple[bool, str | None]:
            if granted:
                return granted[0].poll()
            done, error = created.poll()
            if done and not error:
                granted.append(self.update(resource, ["readers"]))
                return False, None
            return done, error

        return Pending(f"repository {resource.name}", poll)

    @calls("artifactregistry.projects.locations.repositories.getIamPolicy",
           "artifactregistry.projects.locations.repositories.setIamPolicy")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        """The readers added to the repository's policy (read, then written with its etag); the rest of it kept."""
        path = self._name(resource.name, resource.desired)
        policy = call(API, f"get the IAM policy of {resource.name}",
                      self._repositories().getIamPolicy(resource=path).execute)
        bindings = policy.get("bindings", [])
        binding = next((b for b in bindings if b.get("role") == READER and "condition" not in b), None)
        if binding is None:
            binding = {"role": READER, "members": []}
            bindings.append(binding)
        binding["members"] = sorted(set(binding["members"]) | set(resource.desired["readers"]))
        # The etag makes a policy changed since it was read refused, not overwritten (Policy.etag).
        written = {"bindings": bindings, **{k: policy[k] for k in ("etag", "version") if k in policy}}
        request = self._repositories().setIamPolicy(resource=path, body={"policy": written})
        call(API, f"let {', '.join(resource.desired['readers'])} read {resource.name}", request.execute)
        return Pending(f"IAM policy of {resource.name}", lambda: (True, None))

    @calls("artifactregistry.projects.locations.repositories.delete",
           "artifactregistry.projects.locations.operations.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        request = self._repositories().delete(name=self._name(name, fields))
        return self._wait(call(API, f"delete repository {name}", request.execute))

    def _wait(self, operation: dict) -> Pending:
        return longrunning(API, "artifact registry", operation,
                           lambda name: self.client.projects().locations().operations().get(name=name).execute())
