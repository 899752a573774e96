"""What a spec field may hold: the strict, closed base model, the patterns of names and values with the sentence
each is explained by, and the constrained types built from them, shared by every section of the spec."""

from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic.fields import FieldInfo

from rlops.spec import catalog

# Patterns that users will see in errors are paired with a sentence (PATTERN_HINTS), so an error
# says "a GCP name: lowercase letters, ..." rather than echoing a regular expression.
GCP_NAME = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
GCP_PREFIX = r"^[a-z]([-a-z0-9]{0,52}[a-z0-9])?$"
GKE_NAME = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
PROJECT_ID = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
REGION = r"^[a-z]+-[a-z]+[0-9]+$"
ZONE = r"^[a-z]+-[a-z]+[0-9]+-[a-z]$"
BUCKET = r"^[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9]$"
CIDR = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"
IPV4 = r"^([0-9]{1,3}\.){3}[0-9]{1,3}$"
LUSTRE_FILESYSTEM = r"^[A-Za-z][A-Za-z0-9]{0,7}$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"
DURATION = r"^[1-9][0-9]*(s|m|h)$"
RAY_VERSION = r"^[0-9]+\.[0-9]+\.[0-9]+$"
GKE_VERSION = r"^[0-9]+\.[0-9]+(\.[0-9]+(-gke\.[0-9]+)?)?$"
IMAGE = r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]{1,128}|@sha256:[a-f0-9]{64})$"
ENV_VAR = r"^[A-Z_][A-Z0-9_]*$"
SECRET_VERSION = r"^projects/[^/\s]+/secrets/[A-Za-z0-9_-]{1,255}/versions/([1-9][0-9]*|latest)$"
OVERRIDE_KEY = r"^\+?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ABSOLUTE_PATH = r"^/[^\x00]*$"
GCS_PREFIX = r"^gs://[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9](/[^\x00\n]*)?$"
GSA_EMAIL = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com$"
JSONL_SOURCE = r"^(https://[^\s/]+/[^\s]*|/[^\x00\n]*)\.jsonl$"
JSONL_PATH = r"^/[^\x00\n]*\.jsonl$"

PATTERN_HINTS = {
    GCP_NAME: "a GCP name: 1-63 lowercase letters, digits or hyphens, starting with a letter and not ending with a "
              "hyphen",
    GCP_PREFIX: "a name prefix: 1-54 lowercase letters, digits or hyphens, starting with a letter (rlops appends -net, "
                "-sub-N, -internal)",
    GKE_NAME: "a GKE name: 1-40 lowercase letters, digits or hyphens, starting with a letter and not ending with a "
              "hyphen",
    DNS_LABEL: "a DNS label: 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen",
    PROJECT_ID: "a project ID: 6-30 lowercase letters, digits or hyphens, starting with a letter",
    REGION: "a region such as us-central1",
    ZONE: "a zone such as us-central1-b",
    BUCKET: "a bucket name: 3-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or "
            "digit",
    CIDR: "an IPv4 CIDR such as 192.168.0.0/24",
    IPV4: "an IPv4 address such as 10.112.0.0",
    LUSTRE_FILESYSTEM: "a Lustre filesystem name: 1-8 letters or digits, starting with a letter (e.g. lustrefs)",
    QUANTITY: "a Kubernetes quantity such as 64, 500G or 2400Gi",
    DURATION: "a duration such as 90s, 30m or 2h",
    RAY_VERSION: "a Ray version such as 2.49.2",
    GKE_VERSION: "a GKE version such as 1.33 or 1.33.2-gke.1475000",
    IMAGE: "a pinned image: registry/path:tag (not latest) or registry/path@sha256:digest",
    ENV_VAR: "an environment variable name such as HF_TOKEN",
    SECRET_VERSION: "a Secret Manager version: projects/PROJECT/secrets/NAME/versions/latest (or a number)",
    OVERRIDE_KEY: "a dotted config key such as grpo.max_num_steps (a leading + adds a new key)",
    ABSOLUTE_PATH: "an absolute path such as /lustre",
    GCS_PREFIX: "a Cloud Storage location such as gs://my-bucket/exports",
    GSA_EMAIL: "a Google service account such as rlops-ray@PROJECT.iam.gserviceaccount.com",
    JSONL_SOURCE: "a JSON Lines file: an https:// URL or an absolute path ending in .jsonl",
    JSONL_PATH: "an absolute path ending in .jsonl, such as /lustre/data/train.jsonl",
}




def _text(pattern: str, max_length: int | None = None) -> FieldInfo:
    """A string field's constraint: its pattern and length, described by the pattern's sentence."""
    return Field(pattern=pattern, max_length=max_length, description=PATTERN_HINTS.get(pattern))


def described(it: str, pattern: str) -> str:
    """A patterned field's description: what it is, then the form of its value (which the type alone says)."""
    return f"{it}; {PATTERN_HINTS[pattern]}."


GcpName = Annotated[str, _text(GCP_NAME, 63)]
GcpPrefix = Annotated[str, _text(GCP_PREFIX, 54)]
GkeName = Annotated[str, _text(GKE_NAME, 40)]
GkeVersion = Annotated[str, _text(GKE_VERSION)]
DnsLabel = Annotated[str, _text(DNS_LABEL, 63)]
ProjectId = Annotated[str, _text(PROJECT_ID, 30)]
Region = Annotated[str, _text(REGION, 63)]
Zone = Annotated[str, _text(ZONE, 63)]
BucketName = Annotated[str, _text(BUCKET, 63)]
GcsPrefix = Annotated[str, _text(GCS_PREFIX, 1024)]
Cidr = Annotated[str, _text(CIDR)]
Ipv4Address = Annotated[str, _text(IPV4)]
LustreFilesystem = Annotated[str, _text(LUSTRE_FILESYSTEM, 8)]
Image = Annotated[str, _text(IMAGE, 512)]
RayVersion = Annotated[str, _text(RAY_VERSION)]
RayResource = Annotated[str, _text(r"^[A-Za-z_][A-Za-z0-9_]*$", 64)]
GsaEmail = Annotated[str, _text(GSA_EMAIL, 100)]
EnvVar = Annotated[str, _text(ENV_VAR)]
SecretName = Annotated[str, _text(ENV_VAR, 128)]
SecretVersion = Annotated[str, _text(SECRET_VERSION)]
JsonlSource = Annotated[str, _text(JSONL_SOURCE, 2048)]
JsonlPath = Annotated[str, _text(JSONL_PATH, 1024)]
Quantity: TypeAlias = StrictInt | StrictFloat | Annotated[str, _text(QUANTITY)]
Duration = Annotated[str, _text(DURATION)]
AbsolutePath = Annotated[str, _text(ABSOLUTE_PATH, 4096)]
OverrideKey = Annotated[str, _text(OVERRIDE_KEY, 200)]
Scalar: TypeAlias = StrictBool | StrictInt | StrictFloat | StrictStr | None

# The catalog's names are data, known only once it is loaded: validation takes them as literals (so the schema lists
# them), the checker as the strings they are.
if TYPE_CHECKING:
    MachineType = str
    AcceleratorType = str
    PlacementName = str
else:
    MachineType = Literal[tuple(catalog.GPU_MACHINES)]
    AcceleratorType = Literal[tuple(m.accelerator for m in catalog.GPU_MACHINES.values())]
    PlacementName = Literal[("none", *catalog.PLACEMENTS)]


def seconds(duration: str) -> int:
    """A Duration (90s, 30m, 2h) in seconds."""
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
