"""The environment spec: typed models of `environments/NAME.yaml`.

Every model is strict (no coercion: `"18000"` is not a number) and closed (an unknown key is an
error). Rules that span several fields live in `rules.py`, where each can name the exact field
it is about; this module holds shapes, single-field constraints and defaults.
"""

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from rlops.spec import catalog, images

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


def _text(pattern: str, max_length: int | None = None, description: str | None = None):
    return Annotated[
        str,
        Field(pattern=pattern, max_length=max_length, description=description or PATTERN_HINTS.get(pattern)),
    ]


def _what(it: str, pattern: str) -> str:
    """A patterned field's description: what it is, then the form of its value (which the type alone says)."""
    return f"{it}; {PATTERN_HINTS[pattern]}."


GcpName = _text(GCP_NAME, 63)
GcpPrefix = _text(GCP_PREFIX, 54)
GkeName = _text(GKE_NAME, 40)
DnsLabel = _text(DNS_LABEL, 63)
Cidr = _text(CIDR)
Quantity = StrictInt | StrictFloat | _text(QUANTITY)
Duration = _text(DURATION)
AbsolutePath = _text(ABSOLUTE_PATH, 4096)
OverrideKey = _text(OVERRIDE_KEY, 200)
Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None


def seconds(duration: str) -> int:
    """A Duration (90s, 30m, 2h) in seconds."""
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


MachineType = Literal[tuple(catalog.GPU_MACHINES)]  # type: ignore[valid-type]
AcceleratorType = Literal[tuple(m.accelerator for m in catalog.GPU_MACHINES.values())]  # type: ignore[valid-type]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Project(Spec):
    """The Google Cloud project everything is made in."""

    id: _text(PROJECT_ID, 30) = Field(description=_what("The project's ID (not its number)", PROJECT_ID))
    number: StrictInt = Field(ge=1, description="The project number; service networking addresses networks by it.")


class State(Spec):
    """Where rlops keeps its state: the lock, the resource record, run records and manifests."""

    bucket: _text(BUCKET, 63) = Field(description="Cloud Storage bucket for state, locks, run records and manifests.")
    prefix: DnsLabel = Field("rlops", description=_what("The folder of the bucket rlops writes under (PREFIX/locks/, "
                             "PREFIX/environments/ENV/)", DNS_LABEL))


class ClusterNetwork(Spec):
    """The VPC the cluster's nodes and Managed Lustre share."""

    name: GcpName = Field(description=_what("The VPC network rlops creates for the cluster and Lustre", GCP_NAME))
    auto_subnets: StrictBool = Field(True, description="Auto-mode VPC, as in the first seed (--subnet-mode=auto).")
    mtu: StrictInt = Field(8896, ge=1300, le=8896, description="8896 gives Managed Lustre about 10% more throughput.")


class GvnicNetwork(Spec):
    prefix: GcpPrefix = Field(description="Names are PREFIX-net, PREFIX-sub and PREFIX-internal.")
    subnet_cidr: Cidr = Field("192.168.0.0/24", description=_what("The range of the gVNIC subnet (PREFIX-sub), "
                              "where the GPU nodes' second NIC is", CIDR))
    firewall_source_ranges: list[Cidr] = Field(default_factory=lambda: ["192.168.0.0/16"], min_length=1,
                                               description="Where the gVNIC network admits traffic from.")
    mtu: StrictInt = Field(8896, ge=1300, le=8896, description="The gVNIC network's MTU.")


class RdmaNetwork(Spec):
    prefix: GcpPrefix = Field(description="Names are PREFIX-net and PREFIX-sub-N.")
    profile: GcpName | None = Field(None, description="Network profile; defaults to ZONE-vpc-roce.")
    subnet_cidrs: list[Cidr] = Field(min_length=1, description="One subnet per GPU on a node, in NIC order.")
    mtu: StrictInt = Field(8896, ge=1300, le=8896, description="The RDMA network's MTU.")


class GpuNicNetworks(Spec):
    """GPUDirect-TCPX (A3 High) and -TCPXO (A3 Mega): a VPC of its own for each GPU NIC, as GKE's "Maximize GPU
    network bandwidth" page creates them (cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx)."""  # noqa: E501

    prefix: GcpPrefix = Field(description="Names are PREFIX-net-N, PREFIX-sub-N and PREFIX-internal-N, N from 1.")
    subnet_cidrs: list[Cidr] = Field(min_length=1, description="One subnet per GPU NIC, in NIC order (4 on A3 High, "
                                     "8 on A3 Mega).")
    firewall_source_ranges: list[Cidr] = Field(default_factory=lambda: ["192.168.0.0/16"], min_length=1,
                                               description="Where the GPU NICs' networks admit traffic from.")
    mtu: StrictInt = Field(8244, ge=1300, le=8896, description="8244, as GKE's TCPX(O) page sets it.")


class PrivateServiceAccess(Spec):
    """The private services access range Managed Lustre is peered into."""

    range_name: GcpName = Field(description=_what("The name of the global address rlops reserves for the range",
                                                  GCP_NAME))
    prefix_length: StrictInt = Field(20, ge=16, le=24, description="Size of the range Managed Lustre is peered into.")
    address: _text(IPV4) | None = Field(
        None, description="First address of the range. Required: the Lustre firewall admits this range, so rlops "
        "places it rather than Google.")

    @property
    def address_cidr(self) -> str | None:
        return f"{self.address}/{self.prefix_length}" if self.address else None


class Networks(Spec):
    """The VPCs: the cluster's, the GPU NICs' (by family), and the private services access range."""

    cluster: ClusterNetwork = Field(description="The cluster's VPC network, which the nodes' primary NICs and "
                                    "Managed Lustre share.")
    gvnic: GvnicNetwork | None = Field(None, description="GPUDirect-RDMA machines (A3 Ultra, A4, A4X) only.")
    rdma: RdmaNetwork | None = Field(None, description="GPUDirect-RDMA machines (A3 Ultra, A4, A4X) only.")
    gpu_nics: GpuNicNetworks | None = Field(None, description="GPUDirect-TCPX(O) machines (A3 High, A3 Mega) only.")
    private_service_access: PrivateServiceAccess = Field(
        description="The private services access range of the cluster's VPC, into which Managed Lustre is peered.")


class Autoscaling(Spec):
    """Node counts the cluster autoscaler keeps a pool between, per zone."""

    min_nodes: StrictInt = Field(ge=0, le=1000, description="Nodes per zone at least.")
    max_nodes: StrictInt = Field(ge=1, le=1000, description="Nodes per zone at most (GKE's autoscaler's limit).")


class SystemPool(Spec):
    """The cluster's CPU node pool, which holds the Ray head."""

    name: GkeName = Field("default-pool", description=_what("The node pool's name; the Ray head is scheduled on it",
                          GKE_NAME))
    machine_type: GcpName = Field(description="A Compute Engine CPU machine type (e.g. n2-highmem-32); ray.head's cpu "
                                  "and memory must fit on it (checked for the types rlops knows).")
    disk_size_gb: StrictInt = Field(200, ge=10, le=65536, description="Boot disk per node, in GB.")
    initial_nodes: StrictInt = Field(1, ge=1, le=1000, description="Nodes per zone when the cluster is created.")
    autoscaling: Autoscaling | None = Field(None, description="The system pool's autoscaling; unset, a fixed size.")


class ClusterAddons(Spec):
    ray_operator: StrictBool = Field(True, description="GKE's Ray operator add-on (KubeRay).")
    lustre_csi_driver: StrictBool = Field(True,
                                          description="GKE's Managed Lustre CSI driver, which mounts the instance.")
    lustre_legacy_port: StrictBool = Field(
        False, description="Deprecated by GKE (enableLegacyLustrePort): LNet on port 6988, needed on every node "
        "version to reach an existing Lustre instance made with gke_support; goes with lustre.gke_support.")
    lustre_multi_nic: StrictBool = Field(
        False, description="Off, and sent as such: GKE 1.35.2-gke.1842000+ turns the Lustre CSI driver's multi-NIC "
        "on by default, which needs every standard NIC of a node in one VPC, and the GPU nodes' second gVNIC NIC is "
        "in networks.gvnic, another VPC; Lustre traffic then stays on the primary NIC.")


class KubernetesServiceAccount(Spec):
    name: DnsLabel = Field("rlops-ray", description=_what("The Kubernetes service account rlops creates for "
                           "the Ray pods", DNS_LABEL))
    namespace: DnsLabel = Field("default", description="The same as ray.namespace: a pod can use only a service "
                                "account of its own namespace.")
    google_service_account: _text(GSA_EMAIL, 100) | None = Field(
        None, description="Annotated on the Kubernetes service account (workload identity); unset: grant IAM to the "
                          "Kubernetes principal directly.")


class Cluster(Spec):
    """The GKE cluster: its features, add-ons, system pool and the Ray pods' service account."""

    name: GkeName = Field(description=_what("The regional GKE cluster's name (in region)", GKE_NAME))
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = Field(
        "REGULAR", description="The GKE release channel the cluster follows.")
    version: _text(GKE_VERSION) | None = Field(None, description="Minimum version; unset takes the channel default.")
    workload_identity: StrictBool = Field(True, description="Workload Identity: pods act as Google service accounts.")
    dataplane_v2: StrictBool = Field(True,
                                     description="GKE Dataplane V2 (ADVANCED_DATAPATH), which multi-networking needs.")
    multi_networking: StrictBool = Field(True, description="GKE multi-networking, for the GPU NICs' extra networks.")
    ip_alias: StrictBool = Field(True, description="VPC-native (alias IP) pod addressing.")
    dns_endpoint: StrictBool = Field(True, description="Reach the control plane through its DNS endpoint with IAM.")
    addons: ClusterAddons = Field(ClusterAddons(),
                                  description="GKE add-ons: the Ray operator and the Managed Lustre CSI driver.")
    system_pool: SystemPool = Field(description="The CPU node pool the cluster is created with; it runs the Ray head "
                                    "and is never scaled down by the reaper.")
    service_account: KubernetesServiceAccount = Field(
        KubernetesServiceAccount(), description="The Kubernetes service account the Ray pods run as.")


class Accelerator(Spec):
    """The GPUs each node of a pool carries."""

    type: AcceleratorType = Field(description="The accelerator, as GKE names it (e.g. nvidia-h200-141gb).")
    count: StrictInt = Field(8, ge=1, le=16, description="GPUs per node (the machine type's own count).")
    driver_version: Literal["default", "latest", "disabled"] = Field(
        "default", description="GKE's GPU driver installation: default, latest, or disabled (install it yourself).")


class PoolCost(Spec):
    usd_per_node_hour: StrictFloat | StrictInt = Field(
        gt=0, le=100_000, description="A negotiated price per node-hour, in place of the list price rlops knows.")


class GpuPool(Spec):
    name: GkeName = Field(description=_what("The node pool's name, also the RayCluster's worker group and what a "
                                        "recipe's gpu_pool names", GKE_NAME))
    machine_type: MachineType = Field(description="A GPU machine type of the catalog (rlops validate lists them).")
    accelerator: Accelerator = Field(description="The GPUs each node of the pool carries; they must be the machine "
                                     "type's own.")
    reservation: GcpName | None = Field(None, description="A specific reservation to consume (seed 1).")
    spot: StrictBool = Field(False, description="Spot VMs (seed 2); exclusive with reservation.")
    autoscaling: Autoscaling = Field(description="The pool's node counts in zone; min_nodes must be 0 while "
                                     "idle.scale_down includes node-pools.")
    disk_size_gb: StrictInt = Field(100, ge=10, le=65536, description="Boot disk per node, in GB.")
    ray_workers: StrictInt | None = Field(
        None, ge=0, description="Ray worker replicas on this pool; defaults to autoscaling.max_nodes.")
    cost: PoolCost | None = Field(None, description="Overrides the list price of the machine type (rlops cost).")
    placement: Literal[("none", *catalog.PLACEMENTS)] | None = Field(  # type: ignore[valid-type]
        None, description="Where in the zone GKE places the pool's nodes: compact (close together, for lower NCCL "
        "latency; A3, A4 and A2 offer it), workload-1x72 (A4X: a Compute workload policy that keeps the pool in one "
        "NVL72 NVLink domain, at most 18 nodes), or none. Unset: what the machine requires (workload-1x72 on A4X), "
        "else none. Changing it replaces the pool.")

    @property
    def ray_worker_replicas(self) -> int:
        return self.autoscaling.max_nodes if self.ray_workers is None else self.ray_workers

    @property
    def placement_used(self) -> catalog.Placement | None:
        """The placement the pool's nodes get: the spec's, else the one its machine requires; None for none."""
        if self.placement is None:
            return catalog.GPU_MACHINES[self.machine_type].required_placement
        return catalog.PLACEMENTS.get(self.placement)

    @property
    def awake_nodes(self) -> int:
        """The nodes the pool has while it is up: what a wake restores (reap.GkeCluster.scale)."""
        return self.autoscaling.min_nodes or self.ray_worker_replicas


class Lustre(Spec):
    """The Managed Lustre instance mounted at ray.lustre_mount."""

    name: GcpName = Field(description=_what("The Managed Lustre instance's name (in zone); its volume is NAME-pv and "
                                            "claim NAME-pvc", GCP_NAME))
    capacity_gib: StrictInt = Field(ge=9000,
                                    description="Capacity in GiB; it can only grow (a multiple of the tier's step).")
    throughput_mb_per_tib: Literal[125, 250, 500, 1000] = Field(
        description="Throughput tier, MB/s per TiB; changing it replaces the instance.")
    filesystem: _text(LUSTRE_FILESYSTEM, 8) = Field(description=_what("The instance's Lustre filesystem name, which "
                                                    "the CSI driver mounts", LUSTRE_FILESYSTEM))
    gke_support: StrictBool = Field(
        False, description="The instance exists and was made with gke-support-enabled (deprecated in the Lustre API, "
        "as the codelab's scripts still make it): it serves LNet on port 6988. rlops never creates such an instance; "
        "goes with cluster.addons.lustre_legacy_port.")
    deletion_policy: Literal["retain", "delete"] = Field(
        "retain", description="retain: destroy never deletes the instance and its checkpoints.")


class RayNode(Spec):
    """What one Ray node's pod asks for."""

    cpu: Quantity = Field(description="CPU request and limit of the node's pod (a Kubernetes quantity).")
    memory: Quantity = Field(description="Memory request and limit of the node's pod (a Kubernetes quantity).")


class Ray(Spec):
    """The RayCluster: its image, Ray version, head and worker pods, and where Lustre is mounted."""

    cluster_name: DnsLabel = Field("ray-cluster", description=_what("The RayCluster's name; its Secret is "
                                   "NAME-tokens", DNS_LABEL))
    namespace: DnsLabel = Field("default", description="Where the RayCluster, its Secret, claim and service account "
                                "live; rlops creates the namespace unless it exists (as default does).")
    image: _text(IMAGE, 512) = Field(description=_what("The image of the head and worker pods, which the recipes run "
                                     "in", IMAGE))
    image_cache: StrictBool = Field(True, description="Pull the image through an Artifact Registry remote "
                                    "repository of its registry in the region (rlops-REGISTRY, shared by the "
                                    "project's environments there; the node service account may read it), and "
                                    "stream it on the pools (GKE image streaming): a wake pulls inside Google's "
                                    "network and starts before the whole image is down. Off: every node pulls the "
                                    "image from its registry.")
    ray_version: _text(RAY_VERSION) = Field(description=_what("The Ray version in the image (the RayCluster's "
                                            "rayVersion); for a NeMo RL image rlops knows, it must be the one it ships",
                                            RAY_VERSION))
    head: RayNode = Field(description="The head pod's CPU and memory; it must fit on a system pool node.")
    worker: RayNode = Field(description="Each GPU worker pod's CPU and memory (it gets all its node's GPUs); it must "
                          "fit on a GPU pool node.")
    lustre_mount: AbsolutePath = Field("/lustre", description=_what("Where Lustre is mounted in every Ray pod; "
                                       "checkpoint roots and data step paths must be under it", ABSOLUTE_PATH))
    shm_size: Quantity = Field("240Gi", description="/dev/shm of each Ray node (NCCL and vLLM need a large one).")
    multi_nic: StrictBool = Field(True, description="Put the GPU NICs' interfaces (gVNIC and RDMA, or TCPX(O)) on "
                                  "worker pods.")
    nccl_installer_image: _text(IMAGE, 512) | None = Field(
        None, description="The NCCL plugin installer's image; unset: the image of the GPU catalog's pinned upstream "
        "installer manifest for the machine.")
    nccl_tuner_config: dict[AcceleratorType, AbsolutePath] = Field(
        description="Per accelerator, the NCCL tuner file the GPU workers use.",
        default_factory=lambda: {m.accelerator: m.nccl_tuner_config for m in catalog.GPU_MACHINES.values()
                                 if m.nccl_tuner_config})


class SecretRef(Spec):
    """Where a secret's value lives. The value itself never appears in a spec."""

    secret_manager: _text(SECRET_VERSION) | None = Field(
        None, description="gcp: projects/P/secrets/NAME/versions/V, read at apply into the cluster's Secret.")
    env: _text(ENV_VAR) | None = Field(None, description="local only: an environment variable of the local processes")
    file: StrictStr | None = Field(None, min_length=1, description="local only: a file holding the value")


class AllowedOverride(Spec):
    type: Literal["int", "float", "bool", "str"] = Field(description="The JSON type a train message's value must have.")
    min: StrictInt | StrictFloat | None = Field(
        None, description="int and float only: the smallest value a message may set.")
    max: StrictInt | StrictFloat | None = Field(
        None, description="int and float only: the largest value a message may set.")
    pattern: StrictStr | None = Field(None, description="str only: a regular expression the whole value must match")
    max_length: StrictInt = Field(256, ge=1, le=4096, description="str only: the longest value a message may set, in "
                                  "characters.")
    default: Scalar = Field(None, description="The value used when a train message does not set it.")

    def problem_with(self, value: object) -> str | None:
        """Why `value` may not be sent for this override, or None when it may."""
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[self.type]
        if isinstance(value, bool) != (self.type == "bool") or not isinstance(value, expected):
            return f"expected {self.type}, got {type(value).__name__}"
        if self.type in ("int", "float"):
            if not math.isfinite(value):
                return f"{value} is not a finite number"
            if self.min is not None and value < self.min:
                return f"{value} is below the minimum {self.min}"
            if self.max is not None and value > self.max:
                return f"{value} is above the maximum {self.max}"
        if self.type == "str":
            if len(value) > self.max_length:
                return f"longer than {self.max_length} characters"
            if self.pattern is not None and not re.fullmatch(self.pattern, value):
                return f"does not match {self.pattern}"
        return None


class ExportPolicy(Spec):
    """Which complete, manifested checkpoints the snapshot tick copies to Cloud Storage and verifies there."""

    when: Literal["none", "final", "every"] = Field(
        "none", description="final: the last checkpoint of a run that succeeded; every: every `every`-th checkpoint.")
    every: StrictInt | None = Field(None, ge=1, le=10_000, description="with when: every, the N of every N-th.")
    to: _text(GCS_PREFIX, 1024) | None = Field(
        None, description="gs://BUCKET/PREFIX; RUN/step-N/ goes under it. Default: the state bucket, under "
        "state.prefix/environments/ENV/runs/RUN/exports.")


class SetAsideLimit(Spec):
    """What the checkpoint gate keeps of the checkpoints it set aside (torn, altered, or not manifested yet); the
    oldest beyond either bound are deleted by the gate, which says so in the attempt's record."""

    count: StrictInt = Field(5, ge=1, le=1000, description="Set-aside checkpoints kept, the newest.")
    gib: StrictInt | None = Field(None, ge=1, le=10_000_000, description="Their total size kept, in GiB.")


class DataStep(Spec):
    """A data file each attempt's gate writes before the workload (on GKE on the head pod, into Lustre) from rows as
    their publisher publishes them, for the recipe's data path to name; `rlops train --check-data` reads published rows
    through it."""

    source: _text(JSONL_SOURCE, 2048, "Where the rows are published: an https:// URL or an absolute path of a JSON "
                  "Lines file.")
    path: _text(JSONL_PATH, 1024, "Where the gate writes them: an absolute .jsonl path on Lustre.")
    transform: Literal["gsm8k-final-answer"] = Field(
        description="gsm8k-final-answer: each row's answer, a worked solution ending in '#### N', becomes N (as NeMo "
        "RL's own gsm8k dataset does from v0.6.0), the ground truth its math reward can match.")


class Recipe(Spec):
    runner: Literal["nemo-rl", "trl"] = Field(
        description="nemo-rl (NVIDIA NeMo RL's GRPO) or trl (TRL's GRPOTrainer, the local recipe).")
    entrypoint: StrictStr = Field(
        min_length=1, max_length=512,
        description="The script the job runs (nemo-rl: inside the image, e.g. examples/run_grpo_math.py).")
    config: StrictStr | None = Field(None, max_length=512, description="nemo-rl: config path inside the image.")
    model: StrictStr = Field(min_length=1, max_length=256, description="The model it trains (a Hugging Face id).")
    gpu_pool: GkeName | None = Field(None, description="The pool it runs on; needed when there are several.")
    overrides: dict[OverrideKey, Scalar] = Field(default_factory=dict, description="Config values every run of the "
                                                 "recipe gets, by dotted key; a train message cannot change them.")
    allowed_overrides: dict[OverrideKey, AllowedOverride] = Field(
        default_factory=dict, description="What a train message may set, and within which bounds.")
    checkpoint_root: AbsolutePath = Field(description="Each run checkpoints into CHECKPOINT_ROOT/RUN.")
    resume_budget: StrictInt = Field(3, ge=0, le=100, description="Resubmissions after preemption.")
    resume_from: Literal["verified", "newest"] = Field(
        "verified", description="verified: an attempt resumes only from a checkpoint that matches its manifest "
        "(others are set aside); newest: from the newest complete one, unhashed (for checkpoints too large to "
        "hash at every start).")
    export: ExportPolicy = Field(ExportPolicy(), description="When a run's checkpoints are exported to Cloud Storage.")
    driver: Literal["gpu-pool", "head"] | None = Field(
        None, description="Where the job's driver runs. head: on the CPU-only Ray head, as NeMo RL's does (always, for "
        "nemo-rl): its GPUs are its actors', so the gate waits for them first (gpu_wait). gpu-pool (trl's default): "
        "on a GPU-pool node, which Ray holds the job for. A local trl recipe with head plays NeMo RL's driver: it "
        "copies its environment into a training actor on the pool, after checking for it with NeMo RL's retries.")
    gpu_wait: Duration = Field("30m", description="A driver on the head: how long an attempt's gate waits for its "
                               "GPUs (nemo-rl: cluster.num_nodes x cluster.gpus_per_node; local: a GPU-pool node's "
                               "resource) before the workload starts (NeMo RL gives up after about a minute); an "
                               "attempt that does not get them is resubmitted, within resume_budget.")
    set_aside: SetAsideLimit = Field(SetAsideLimit(), description="A bound on what set-aside/ grows to: a checkpoint "
                                     "can be hundreds of GB, and on GKE manifests lag the scan, so set-asides happen.")
    data_steps: list[DataStep] = Field(default_factory=list, max_length=16, description="Data files the gate writes "
                                       "before the workload, in order.")

    @property
    def driver_on_head(self) -> bool:
        return self.driver == "head" or (self.driver is None and self.runner == "nemo-rl")

    @property
    def gpu_wait_seconds(self) -> int:
        return seconds(self.gpu_wait)

    def default_settings(self) -> dict:
        """What a run is given when its train message sets nothing."""
        return {**self.overrides,
                **{key: rule.default for key, rule in self.allowed_overrides.items() if rule.default is not None}}


class IdlePolicy(Spec):
    timeout: Duration | Literal["auto"] = Field(
        "30m", description="auto: chosen from this environment's measured wakes and idle gaps (rlops reap "
        "--dry-run says which and why).")
    scale_down: list[Literal["ray-workers", "node-pools"]] = Field(
        description="What scaling down stops: the RayCluster's GPU workers, the GPU node pools, or both.",
        default_factory=lambda: ["ray-workers", "node-pools"], min_length=1)
    scale_reserved: StrictBool = Field(
        False, description="Scale down pools that consume a reservation too: that saves nothing (a reservation "
        "bills whether its VMs run or not) but frees its capacity for other work in the project.")

    @property
    def timeout_seconds(self) -> int | None:
        """The fixed timeout; None for auto."""
        if self.timeout == "auto":
            return None
        return seconds(self.timeout)


class LocalCountsAs(Spec):
    machine_type: MachineType = Field("a3-ultragpu-8g", description="The GPU machine type a local worker is priced as.")
    region: _text(REGION, 63) = Field("us-central1", description=_what("The region whose list price is counted",
                                      REGION))
    spot: StrictBool = Field(False, description="Priced at the Spot rate.")
    usd_per_node_hour: StrictFloat | StrictInt | None = Field(
        None, gt=0, le=100_000, description="A price per node-hour instead of the catalog's.")


class LocalGpuPool(Spec):
    """Ray worker nodes carrying a custom resource that stands in for a GPU node pool."""

    name: DnsLabel = Field("gpu-pool", description=_what("The pool's name, which a recipe's gpu_pool may name",
                           DNS_LABEL))
    workers: StrictInt = Field(1, ge=0, le=8, description="Ray worker nodes in the pool when it is up.")
    resource: _text(r"^[A-Za-z_][A-Za-z0-9_]*$", 64) = Field(
        "gpu_pool", description="The Ray custom resource that stands in for a GPU.")
    per_worker: StrictInt = Field(1, ge=1, le=64, description="Units of the resource each worker carries (its GPUs).")
    cpus_per_worker: StrictInt = Field(1, ge=1, le=64, description="CPUs each worker offers Ray.")
    join_delay: Duration | None = Field(
        None, description="Each worker joins Ray this long after `rlops up` or a wake starts it, as a GKE node that "
        "boots, pulls its image and joins takes minutes; unset: at once.")

    @property
    def join_delay_seconds(self) -> int:
        return seconds(self.join_delay) if self.join_delay else 0
    counts_as: LocalCountsAs = Field(default_factory=lambda: LocalCountsAs(),
                                       description="What rlops cost counts each worker as: a GPU node of this type.")



class LocalSection(Spec):
    lustre_dir: StrictStr = Field(".rlops/local/lustre", min_length=1, description="Stands in for /lustre.")
    gpu_pool: LocalGpuPool = Field(LocalGpuPool(), description="The Ray workers that stand in for a GPU node pool.")


class _Environment(Spec):
    state: State = Field(description="The Cloud Storage bucket (on local, its emulator's) where rlops keeps locks, "
                         "the resource record, run records and checkpoint manifests.")
    secrets: dict[_text(ENV_VAR, 128), SecretRef] = Field(
        default_factory=dict, description="Secret references by name. Each is a file of the Ray nodes, never an "
        "environment variable; Hugging Face reads HF_TOKEN's (HF_TOKEN_PATH), W&B WANDB_API_KEY's (as a netrc, NETRC).")
    recipes: dict[DnsLabel, Recipe] = Field(min_length=1, description="The training recipes a train message may "
                                            "name, by name.")
    idle: IdlePolicy = Field(IdlePolicy(), description="When the reaper scales the idle GPU pool down, and what it "
                             "scales.")


class GcpEnvironment(_Environment):
    provider: Literal["gcp"] = Field(
        description="gcp: GKE, Managed Lustre and the functions in a Google Cloud project.")
    project: Project = Field(description="The Google Cloud project the environment's resources are made in: its ID "
                             "and number.")
    region: _text(REGION, 63) = Field(description=_what("The region of the cluster, the subnets and the GPU list "
                                      "prices", REGION))
    zone: _text(ZONE, 63) = Field(description=_what("The zone, in region, of the GPU pools and the Lustre instance",
                                  ZONE))
    networks: Networks = Field(description="The VPCs rlops creates: the cluster's, the GPU NICs' (by machine "
                               "family) and the private services access range Lustre is peered into.")
    cluster: Cluster = Field(description="The regional GKE cluster rlops creates: its features, add-ons, system pool "
                             "and the Ray pods' service account.")
    gpu_pools: list[GpuPool] = Field(min_length=1,
                                     description="The GPU node pools; one stack of GPU networking for all.")
    lustre: Lustre = Field(description="The Managed Lustre instance that holds checkpoints, data and the Hugging Face "
                           "cache, mounted at ray.lustre_mount.")
    ray: Ray = Field(description="The RayCluster rlops applies: image, Ray version, head and worker pods, /dev/shm "
                     "and where Lustre is mounted.")

    @property
    def reapable_pools(self) -> list[GpuPool]:
        """The GPU pools the reaper scales: a reservation's only if `idle.scale_reserved` (it saves nothing)."""
        return [pool for pool in self.gpu_pools if not pool.reservation or self.idle.scale_reserved]

    @property
    def woken_workers(self) -> int:
        """The Ray GPU workers a wake brings back: its wake is over when the last of them has joined."""
        return sum(pool.ray_worker_replicas for pool in self.reapable_pools)

    @property
    def pulled_image(self) -> str:
        """The Ray pods' image: through the region's remote repository of its registry with `ray.image_cache`."""
        return images.cached(self.ray.image, self.project.id, self.region) if self.ray.image_cache else self.ray.image

    def workload_policy_name(self, pool: GpuPool) -> str:
        """The Compute resource policy a pool's workload placement names: one per cluster and pool, as policies are
        regional and a region holds one cluster of a name."""
        return f"{self.cluster.name}-{pool.name}"

    @property
    def rdma_profile(self) -> str:
        return (self.networks.rdma and self.networks.rdma.profile) or catalog.rdma_network_profile(self.zone)

    @property
    def machine(self) -> catalog.GpuMachine:
        """The GPU machine whose network stack the environment builds: its first pool's (the rules hold every pool
        to one stack)."""
        return catalog.GPU_MACHINES[self.gpu_pools[0].machine_type]


class LocalEnvironment(_Environment):
    provider: Literal["local"] = Field(description="local: a Ray cluster, emulators and the functions on this machine.")
    local: LocalSection = Field(LocalSection(), description="The local stack: where /lustre is, the GPU-pool workers.")

    @property
    def woken_workers(self) -> int:
        return self.local.gpu_pool.workers


EnvironmentSpec = Annotated[GcpEnvironment | LocalEnvironment, Field(discriminator="provider")]

# The models an unknown key may be compared against, by the discriminator value.
ROOT_MODELS: dict[str, type[Spec]] = {"gcp": GcpEnvironment, "local": LocalEnvironment}
