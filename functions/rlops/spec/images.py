"""Where the Ray image is pulled from when `ray.image_cache` is on: an Artifact Registry remote repository of its
registry, in the environment's region. No I/O.

An image reference splits as Docker's reference grammar splits it (distribution/reference, normalize.go): the
first component is a registry when it has a `.` or a `:` or is `localhost`; otherwise the image is Docker Hub's
(the spec's image pattern asks for a path of two components at least, so `library/` is never implied). A remote
repository serves the upstream's paths under its own:
`REGION-docker.pkg.dev/PROJECT/REPOSITORY/PATH:TAG` (cloud.google.com/artifact-registry/docs/repositories/
remote-repo, "Pull images"; Docker Hub's official images keep their `library/`).
"""

import re
from dataclasses import dataclass

DOCKER_HUB = "DOCKER_HUB"  # RemoteRepositoryConfig.dockerRepository.publicRepository's value for Docker Hub


@dataclass(frozen=True)
class Upstream:
    registry: str      # nvcr.io, or docker.io for Docker Hub
    path: str          # nvidia/nemo-rl:v0.5.0 (with its tag or digest)

    @property
    def remote(self) -> str:
        """What the remote repository proxies: DOCKER_HUB, or the registry's https URI (dockerRepository's
        publicRepository or customRepository.uri)."""
        return DOCKER_HUB if self.registry == "docker.io" else f"https://{self.registry}"

    @property
    def repository(self) -> str:
        """The remote repository's ID: one per registry, so that every environment of a region shares it."""
        return f"rlops-{re.sub(r'[^a-z0-9]+', '-', self.registry.lower())}"[:63].rstrip("-")


def upstream(image: str) -> Upstream | None:
    """The image's registry and path, None for an image already in Artifact Registry (nothing to cache)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = "docker.io", image
    if registry.endswith(".pkg.dev"):
        return None
    return Upstream(registry, path)


def cached(image: str, project: str, region: str) -> str:
    """The image as the region's remote repository of its registry serves it (the image itself if it has none)."""
    found = upstream(image)
    return image if found is None else f"{region}-docker.pkg.dev/{project}/{found.repository}/{found.path}"
