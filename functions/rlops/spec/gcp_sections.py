"""The sections of a GCP environment spec: the project, the VPCs, the GKE cluster, the GPU node pools, the Managed
Lustre instance and the RayCluster."""

from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt

from rlops.spec import catalog
from rlops.spec.field_types import (
    ABSOLUTE_PATH,
    CIDR,
    DNS_LABEL,
    GCP_NAME,
    GKE_NAME,
    IMAGE,
    LUSTRE_FILESYSTEM,
    PROJECT_ID,
    RAY_VERSION,
    AbsolutePath,
    AcceleratorType,
    Cidr,
    DnsLabel,
    GcpName,
    GcpPrefix,
    GkeName,
    GkeVersion,
    GsaEmail,
    Image,
    Ipv4Address,
    LustreFilesystem,
    MachineType,
    PlacementName,
    ProjectId,
    Quantity,
    RayVersion,
    Spec,
    described,
)


class Project(Spec):
    """The Google Cloud project everything is made in."""

    id: ProjectId = Field(description=described("The project's ID (not its number)", PROJECT_ID))
    number: StrictInt = Field(ge=1, description="The project number; service networking addresses networks by it.")


class ClusterNetwork(Spec):
    """The VPC the cluster's nodes and Managed Lustre share."""

    name: GcpName = Field(description=described("The VPC network rlops creates for the cluster and Lustre", GCP_NAME))
    auto_subnets: StrictBool = Field(
        default=True, description="Auto-mode VPC, as in the first seed (--subnet-mode=auto).")
    mtu: StrictInt = Field(
        default=8896, ge=1300, le=8896, description="8896 gives Managed Lustre about 10% more throughput.")


class GvnicNetwork(Spec):
    prefix: GcpPrefix = Field(description="Names are PREFIX-net, PREFIX-sub and PREFIX-internal.")
    subnet_cidr: Cidr = Field(
        default="192.168.0.0/24",
        description=described("The range of the gVNIC subnet (PREFIX-sub), where the GPU nodes' second NIC is", CIDR))
    firewall_source_ranges: list[Cidr] = Field(default_factory=lambda: ["192.168.0.0/16"], min_length=1,
                                               description="Where the gVNIC network admits traffic from.")
    mtu: StrictInt = Field(default=8896, ge=1300, le=8896, description="The gVNIC network's MTU.")


class RdmaNetwork(Spec):
    prefix: GcpPrefix = Field(description="Names are PREFIX-net and PREFIX-sub-N.")
    profile: GcpName | None = Field(default=None, description="Network profile; defaults to ZONE-vpc-roce.")
    subnet_cidrs: list[Cidr] = Field(min_length=1, description="One subnet per GPU on a node, in NIC order.")
    mtu: StrictInt = Field(default=8896, ge=1300, le=8896, description="The RDMA network's MTU.")


class GpuNicNetworks(Spec):
    """GPUDirect-TCPX (A3 High) and -TCPXO (A3 Mega): a VPC of its own for each GPU NIC, as GKE's "Maximize GPU
    network bandwidth" page creates them (cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx)."""  # noqa: E501

    prefix: GcpPrefix = Field(description="Names are PREFIX-net-N, PREFIX-sub-N and PREFIX-internal-N, N from 1.")
    subnet_cidrs: list[Cidr] = Field(min_length=1, description="One subnet per GPU NIC, in NIC order (4 on A3 High, "
                                     "8 on A3 Mega).")
    firewall_source_ranges: list[Cidr] = Field(default_factory=lambda: ["192.168.0.0/16"], min_length=1,
                                               description="Where the GPU NICs' networks admit traffic from.")
    mtu: StrictInt = Field(default=8244, ge=1300, le=8896, description="8244, as GKE's TCPX(O) page sets it.")


class PrivateServiceAccess(Spec):
    """The private services access range Managed Lustre is peered into."""

    range_name: GcpName = Field(description=described("The name of the global address rlops reserves for the range",
                                                  GCP_NAME))
    prefix_length: StrictInt = Field(
        default=20, ge=16, le=24, description="Size of the range Managed Lustre is peered into.")
    address: Ipv4Address | None = Field(
        default=None, description="First address of the range. Required: the Lustre firewall admits this range, so "
        "rlops places it rather than Google.")

    @property
    def address_cidr(self) -> str | None:
        return f"{self.address}/{self.prefix_length}" if self.address else None


class Networks(Spec):
    """The VPCs: the cluster's, the GPU NICs' (by family), and the private services access range."""

    cluster: ClusterNetwork = Field(description="The cluster's VPC network, which the nodes' primary NICs and "
                                    "Managed Lustre share.")
    gvnic: GvnicNetwork | None = Field(default=None, description="GPUDirect-RDMA machines (A3 Ultra, A4, A4X) only.")
    rdma: RdmaNetwork | None = Field(default=None, description="GPUDirect-RDMA machines (A3 Ultra, A4, A4X) only.")
    gpu_nics: GpuNicNetworks | None = Field(
        default=None, description="GPUDirect-TCPX(O) machines (A3 High, A3 Mega) only.")
    private_service_access: PrivateServiceAccess = Field(
        description="The private services access range of the cluster's VPC, into which Managed Lustre is peered.")


class Autoscaling(Spec):
    """Node counts the cluster autoscaler keeps a pool between, per zone."""

    min_nodes: StrictInt = Field(ge=0, le=1000, description="Nodes per zone at least.")
    max_nodes: StrictInt = Field(ge=1, le=1000, description="Nodes per zone at most (GKE's autoscaler's limit).")


class SystemPool(Spec):
    """The cluster's CPU node pool, which holds the Ray head."""

    name: GkeName = Field(
        default="default-pool", description=described("The node pool's name; the Ray head is scheduled on it",
                                                      GKE_NAME))
    machine_type: GcpName = Field(description="A Compute Engine CPU machine type (e.g. n2-highmem-32); ray.head's cpu "
                                  "and memory must fit on it (checked for the types rlops knows).")
    disk_size_gb: StrictInt = Field(default=200, ge=10, le=65536, description="Boot disk per node, in GB.")
    initial_nodes: StrictInt = Field(
        default=1, ge=1, le=1000, description="Nodes per zone when the cluster is created.")
    autoscaling: Autoscaling | None = Field(
        default=None, description="The system pool's autoscaling; unset, a fixed size.")


class ClusterAddons(Spec):
    ray_operator: StrictBool = Field(default=True, description="GKE's Ray operator add-on (KubeRay).")
    lustre_csi_driver: StrictBool = Field(default=True,
                                          description="GKE's Managed Lustre CSI driver, which mounts the instance.")
    lustre_legacy_port: StrictBool = Field(
        default=False, description="Deprecated by GKE (enableLegacyLustrePort): LNet on port 6988, needed on every "
        "node version to reach an existing Lustre instance made with gke_support; goes with lustre.gke_support.")
    lustre_multi_nic: StrictBool = Field(
        default=False, description="Off, and sent as such: GKE 1.35.2-gke.1842000+ turns the Lustre CSI driver's "
        "multi-NIC on by default, which needs every standard NIC of a node in one VPC, and the GPU nodes' second gVNIC "
        "NIC is in networks.gvnic, another VPC; Lustre traffic then stays on the primary NIC.")


class KubernetesServiceAccount(Spec):
    name: DnsLabel = Field(
        default="rlops-ray",
        description=described("The Kubernetes service account rlops creates for the Ray pods", DNS_LABEL))
    namespace: DnsLabel = Field(
        default="default", description="The same as ray.namespace: a pod can use only a service account of its own "
        "namespace.")
    google_service_account: GsaEmail | None = Field(
        default=None, description="Annotated on the Kubernetes service account (workload identity); unset: grant IAM "
        "to the Kubernetes principal directly.")


class Cluster(Spec):
    """The GKE cluster: its features, add-ons, system pool and the Ray pods' service account."""

    name: GkeName = Field(description=described("The regional GKE cluster's name (in region)", GKE_NAME))
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = Field(
        default="REGULAR", description="The GKE release channel the cluster follows.")
    version: GkeVersion | None = Field(default=None, description="Minimum version; unset takes the channel default.")
    workload_identity: StrictBool = Field(
        default=True, description="Workload Identity: pods act as Google service accounts.")
    dataplane_v2: StrictBool = Field(default=True,
                                     description="GKE Dataplane V2 (ADVANCED_DATAPATH), which multi-networking needs.")
    multi_networking: StrictBool = Field(
        default=True, description="GKE multi-networking, for the GPU NICs' extra networks.")
    ip_alias: StrictBool = Field(default=True, description="VPC-native (alias IP) pod addressing.")
    dns_endpoint: StrictBool = Field(
        default=True, description="Reach the control plane through its DNS endpoint with IAM.")
    addons: ClusterAddons = Field(default=ClusterAddons(),
                                  description="GKE add-ons: the Ray operator and the Managed Lustre CSI driver.")
    system_pool: SystemPool = Field(description="The CPU node pool the cluster is created with; it runs the Ray head "
                                    "and is never scaled down by the reaper.")
    service_account: KubernetesServiceAccount = Field(
        default=KubernetesServiceAccount(), description="The Kubernetes service account the Ray pods run as.")


class Accelerator(Spec):
    """The GPUs each node of a pool carries."""

    type: AcceleratorType = Field(description="The accelerator, as GKE names it (e.g. nvidia-h200-141gb).")
    count: StrictInt = Field(default=8, ge=1, le=16, description="GPUs per node (the machine type's own count).")
    driver_version: Literal["default", "latest", "disabled"] = Field(
        default="default", description="GKE's GPU driver installation: default, latest, or disabled (install it "
        "yourself).")


class PoolCost(Spec):
    usd_per_node_hour: StrictFloat | StrictInt = Field(
        gt=0, le=100_000, description="A negotiated price per node-hour, in place of the list price rlops knows.")


class GpuPool(Spec):
    name: GkeName = Field(description=described("The node pool's name, also the RayCluster's worker group and what a "
                                        "recipe's gpu_pool names", GKE_NAME))
    machine_type: MachineType = Field(description="A GPU machine type of the catalog (rlops validate lists them).")
    accelerator: Accelerator = Field(description="The GPUs each node of the pool carries; they must be the machine "
                                     "type's own.")
    reservation: GcpName | None = Field(default=None, description="A specific reservation to consume (seed 1).")
    spot: StrictBool = Field(default=False, description="Spot VMs (seed 2); exclusive with reservation.")
    autoscaling: Autoscaling = Field(description="The pool's node counts in zone; min_nodes must be 0 while "
                                     "idle.scale_down includes node-pools.")
    disk_size_gb: StrictInt = Field(default=100, ge=10, le=65536, description="Boot disk per node, in GB.")
    ray_workers: StrictInt | None = Field(
        default=None, ge=0, description="Ray worker replicas on this pool; defaults to autoscaling.max_nodes.")
    cost: PoolCost | None = Field(
        default=None, description="Overrides the list price of the machine type (rlops cost).")
    placement: PlacementName | None = Field(
        default=None, description="Where in the zone GKE places the pool's nodes: compact (close together, for lower "
        "NCCL latency; A3, A4 and A2 offer it), workload-1x72 (A4X: a Compute workload policy that keeps the pool in "
        "one NVL72 NVLink domain, at most 18 nodes), or none. Unset: what the machine requires (workload-1x72 on A4X), "
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

    name: GcpName = Field(
        description=described("The Managed Lustre instance's name (in zone); its volume is NAME-pv and claim "
                              "NAME-pvc", GCP_NAME))
    capacity_gib: StrictInt = Field(ge=9000,
                                    description="Capacity in GiB; it can only grow (a multiple of the tier's step).")
    throughput_mb_per_tib: Literal[125, 250, 500, 1000] = Field(
        description="Throughput tier, MB/s per TiB; changing it replaces the instance.")
    filesystem: LustreFilesystem = Field(description=described("The instance's Lustre filesystem name, which "
                                                    "the CSI driver mounts", LUSTRE_FILESYSTEM))
    gke_support: StrictBool = Field(
        default=False, description="The instance exists and was made with gke-support-enabled (deprecated in the "
        "Lustre API, as the codelab's scripts still make it): it serves LNet on port 6988. rlops never creates such an "
        "instance; goes with cluster.addons.lustre_legacy_port.")
    deletion_policy: Literal["retain", "delete"] = Field(
        default="retain", description="retain: destroy never deletes the instance and its checkpoints.")


class RayNode(Spec):
    """What one Ray node's pod asks for."""

    cpu: Quantity = Field(description="CPU request and limit of the node's pod (a Kubernetes quantity).")
    memory: Quantity = Field(description="Memory request and limit of the node's pod (a Kubernetes quantity).")


class Ray(Spec):
    """The RayCluster: its image, Ray version, head and worker pods, and where Lustre is mounted."""

    cluster_name: DnsLabel = Field(default="ray-cluster", description=described("The RayCluster's name; its Secret is "
                                   "NAME-tokens", DNS_LABEL))
    namespace: DnsLabel = Field(
        default="default", description="Where the RayCluster, its Secret, claim and service account live; rlops "
        "creates the namespace unless it exists (as default does).")
    image: Image = Field(description=described("The image of the head and worker pods, which the recipes run "
                                     "in", IMAGE))
    image_cache: StrictBool = Field(default=True, description="Pull the image through an Artifact Registry remote "
                                    "repository of its registry in the region (rlops-REGISTRY, shared by the "
                                    "project's environments there; the node service account may read it), and "
                                    "stream it on the pools (GKE image streaming): a wake pulls inside Google's "
                                    "network and starts before the whole image is down. Off: every node pulls the "
                                    "image from its registry.")
    ray_version: RayVersion = Field(description=described("The Ray version in the image (the RayCluster's "
                                            "rayVersion); for a NeMo RL image rlops knows, it must be the one it ships",
                                            RAY_VERSION))
    head: RayNode = Field(description="The head pod's CPU and memory; it must fit on a system pool node.")
    worker: RayNode = Field(description="Each GPU worker pod's CPU and memory (it gets all its node's GPUs); it must "
                          "fit on a GPU pool node.")
    lustre_mount: AbsolutePath = Field(
        default="/lustre",
        description=described("Where Lustre is mounted in every Ray pod; checkpoint roots and data step paths must be "
                              "under it", ABSOLUTE_PATH))
    shm_size: Quantity = Field(
        default="240Gi", description="/dev/shm of each Ray node (NCCL and vLLM need a large one).")
    multi_nic: StrictBool = Field(
        default=True, description="Put the GPU NICs' interfaces (gVNIC and RDMA, or TCPX(O)) on worker pods.")
    nccl_installer_image: Image | None = Field(
        default=None, description="The NCCL plugin installer's image; unset: the image of the GPU catalog's pinned "
        "upstream installer manifest for the machine.")
    nccl_tuner_config: dict[AcceleratorType, AbsolutePath] = Field(
        description="Per accelerator, the NCCL tuner file the GPU workers use.",
        default_factory=lambda: {m.accelerator: m.nccl_tuner_config for m in catalog.GPU_MACHINES.values()
                                 if m.nccl_tuner_config})
