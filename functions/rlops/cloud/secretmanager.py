"""Secret Manager (google-cloud-secret-manager, REST): the token values, read at apply time only."""

from google.cloud import secretmanager_v1

from rlops.cloud.base import Connection, call
from rlops.permissions import calls

API = "secretmanager"


@calls("secretmanager.projects.secrets.versions.access")
def access(connection: Connection, versions: dict[str, str]) -> dict[str, str]:
    """{NAME: value} for {NAME: projects/P/secrets/S/versions/V}. The values go to a Kubernetes Secret, nowhere else."""
    secrets = connection.gapic(API, secretmanager_v1.SecretManagerServiceClient)
    return {name: call(API, f"access {version}", secrets.access_secret_version, name=version).payload.data.decode()
            for name, version in versions.items()}
