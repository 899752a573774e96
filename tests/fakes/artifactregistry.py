"""Artifact Registry v1's repositories, as rlops's image cache uses them, served by the fake GCP (FakeGcp mounts
`ArtifactRegistry` under /ar): create and delete as long-running operations, get, and each repository's IAM policy
(DeployApis' read-modify-write with etags, which Artifact Registry's policies follow as every IAM policy does).

Requests are checked against artifactregistry.v1's discovery document (google_apis) and IAM (FakeGcp._authorize)
before they get here. The rules below are the fields' documentation in that document unless a comment names
another source.
"""

import re
import uuid

from fakes.gcp import ApiError, OperationFailed, _timestamp, conflict, invalid

# repositoryId (cloud.google.com/artifact-registry/docs/repositories/create-repos, "Repository names"): lowercase
# letters, digits and hyphens, starting with a letter and ending with a letter or digit, at most 63 characters.
_REPOSITORY_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_LOCATION = r"/ar/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"


class ArtifactRegistry:
    def __init__(self, gcp):
        self.gcp = gcp
        # projects/P/locations/L/repositories/R -> artifactregistry v1 Repository
        self.repositories: dict[str, dict] = {}

    def routes(self) -> list:
        repository = _LOCATION + r"/repositories/(?P<short>[^/:]+)"
        policies = self.gcp.deploy_apis
        return [
            ("POST", _LOCATION + r"/repositories", self._create),
            ("GET", repository, self._get),
            ("DELETE", repository, self._delete),
            ("GET", repository + r":getIamPolicy", lambda request, project, location, short: policies._get_policy(
                request, _name(project, location, short), project)),
            ("POST", repository + r":setIamPolicy", lambda request, project, location, short: policies._set_policy(
                request, _name(project, location, short), project)),
            ("GET", _LOCATION + r"/operations/(?P<op>[^/]+)", self._operation),
        ]

    def _create(self, request, project, location):
        short = request.query.get("repositoryId", "")
        if not _REPOSITORY_ID.fullmatch(short):
            raise invalid(f"Invalid repository ID \"{short}\": repository names may only contain lowercase letters, "
                          "numbers, and hyphens, and must begin with a letter and end with a letter or number.")
        name = _name(project, location, short)
        if name in self.repositories:
            raise conflict(name)
        body = dict(request.body or {})
        remote = body.get("remoteRepositoryConfig")
        mode = body.get("mode", "STANDARD_REPOSITORY")  # Repository.mode: unspecified is standard
        if mode == "REMOTE_REPOSITORY" and remote is None:
            raise invalid("a REMOTE_REPOSITORY needs a remoteRepositoryConfig: the upstream it caches")
        if remote is not None and mode != "REMOTE_REPOSITORY":
            raise invalid(f"remoteRepositoryConfig is only for a REMOTE_REPOSITORY, not a {mode}")
        if remote is not None:
            _check_remote(body.get("format"), remote)
        stored = dict(body, name=name, createTime=_timestamp(), updateTime=_timestamp(),
                      registryUri=f"{location}-docker.pkg.dev/{project}/{short}")
        # Input only (RemoteRepositoryConfig.disableUpstreamValidation): never stored.
        stored.get("remoteRepositoryConfig", {}).pop("disableUpstreamValidation", None)

        def finish():
            if name in self.repositories:
                raise OperationFailed(6, f"the repository {name} already exists")
            self.repositories[name] = stored
            return dict(stored, **{"@type": "type.googleapis.com/google.devtools.artifactregistry.v1.Repository"})
        return self._start(project, location, "create", name, finish)

    def _get(self, request, project, location, short):
        return self._repository(_name(project, location, short))

    def _delete(self, request, project, location, short):
        name = _name(project, location, short)
        self._repository(name)

        def finish():
            self.repositories.pop(name, None)
            self.gcp.deploy_apis.policies.pop(name, None)
        return self._start(project, location, "delete", name, finish)

    def _operation(self, request, project, location, op):
        return self.gcp._lro_json(self.gcp._operation("artifactregistry", f"projects/{project}/locations/{location}/"
                                                                          f"operations/{op}"))

    def _start(self, project: str, location: str, verb: str, target: str, on_done) -> dict:
        name = f"projects/{project}/locations/{location}/operations/{uuid.UUID(int=self.gcp._random.getrandbits(128))}"
        return self.gcp._lro_json(self.gcp._start("artifactregistry", verb, target, on_done, name=name))

    def _repository(self, name: str) -> dict:
        if name not in self.repositories:
            raise missing(name)
        return self.repositories[name]


def missing(name: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"Requested entity was not found. ({name})", "notFound")


def _check_remote(format_: str | None, remote: dict) -> None:
    """A Docker remote repository names its upstream: a public one (DockerRepository.publicRepository) or an https
    URI (customRepository.uri, "An https uri reference to the custom remote repository")."""
    docker = remote.get("dockerRepository")
    if format_ != "DOCKER" or docker is None:
        raise invalid("a remote repository of format DOCKER needs remoteRepositoryConfig.dockerRepository"
                      if format_ == "DOCKER" else f"the fake models Docker remote repositories only, not {format_}")
    public, uri = docker.get("publicRepository"), (docker.get("customRepository") or {}).get("uri")
    if bool(public) == bool(uri):
        raise invalid("remoteRepositoryConfig.dockerRepository names one upstream: publicRepository or "
                      "customRepository.uri")
    if uri is not None and not re.fullmatch(r"https://[a-z0-9.-]+(:[0-9]+)?(/[^\s]*)?", uri):
        raise invalid(f"remoteRepositoryConfig.dockerRepository.customRepository.uri {uri!r} is not an https URI")


def _name(project: str, location: str, short: str) -> str:
    return f"projects/{project}/locations/{location}/repositories/{short}"

