"""Facts about Google Cloud and NeMo RL that a spec is checked against.

Each table names where its numbers come from, so a reader can re-check them when
Google or NVIDIA change them.
"""

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

# Package data, so that an installed rlops reads it too.
GPUS = resources.files("rlops.spec") / "gpus"


@dataclass(frozen=True)
class Transport:
    """How a family's GPUs talk across nodes (`gpus/catalog.yaml`, transports)."""

    name: str                  # none, tcpx, tcpxo, rdma
    title: str
    extra_networks: str        # none, per-nic (a VPC per GPU NIC), gvnic-and-rdma
    nic_mtu: int | None = None
    installer: str | None = None         # upstream/ paths
    device_injector: str | None = None
    pod: str | None = None               # the upstream pod the sidecar and workload container come from
    sidecar: str | None = None
    workload: str | None = None
    nccl_env_from: str | None = None
    nccl_env: tuple[tuple[str, str], ...] = ()
    nccl_env_script: str | None = None


@dataclass(frozen=True)
class Placement:
    """How a GPU pool's nodes are placed (`gpus/catalog.yaml`, placements): the node pool's placementPolicy type, and
    for a workload policy the Compute resource policy the pool names."""

    name: str                  # compact, workload-1x72
    title: str
    type: str                  # container v1 NodePool.PlacementPolicy.type
    workload_type: str | None = None           # Compute ResourcePolicyWorkloadPolicy.type
    accelerator_topology: str | None = None    # its acceleratorTopology, e.g. 1x72

    @property
    def topology_gpus(self) -> int | None:
        """The GPUs of one accelerator topology (1x72: 72, one NVL72 NVLink domain)."""
        if self.accelerator_topology is None:
            return None
        gpus = 1
        for side in self.accelerator_topology.split("x"):
            gpus *= int(side)
        return gpus


@dataclass(frozen=True)
class Price:
    on_demand: float | None
    spot: float | None
    source: str


@dataclass(frozen=True)
class GpuMachine:
    name: str
    title: str
    accelerator: str
    accelerators_per_node: int
    vcpus: int
    memory_gib: float
    transport: Transport
    gpu_nics: int              # NICs for GPU traffic besides the primary one (RDMA: the RDMA NICs)
    installer: str | None  # the NCCL plugin installer manifest (upstream/), the transport's unless the machine's own
    pod: str | None            # the upstream NCCL test pod (upstream/), the transport's unless the machine's own
    # The file the NCCL plugin reads for tuning on this machine, where rlops sets one.
    nccl_tuner_config: str | None
    # The `gpu_family` dimension of Cloud Quotas' GPUS-PER-GPU-FAMILY-per-project-region quota for its GPUs.
    gpu_family: str
    min_gke: str | None
    spot: bool                 # offered as Spot VMs
    capacity: str              # how a project gets the machine (the README's table)
    prices: dict[str, Price]   # by region
    arch: str                  # amd64, or arm64 (A4X's Grace CPUs)
    placements: tuple[Placement, ...]    # what a pool of it may ask for
    required_placement: Placement | None  # what every pool of it gets


@cache
def _catalog() -> dict:
    return yaml.safe_load((GPUS / "catalog.yaml").read_text())


def upstream_text(path: str) -> str:
    """An upstream manifest copied into gpus/upstream/ (its first line names the commit)."""
    return (GPUS / _catalog()["upstream"]["directory"] / path).read_text()


def upstream(path: str) -> list[dict]:
    """The objects of an upstream manifest, as upstream wrote them."""
    return [doc for doc in yaml.safe_load_all(upstream_text(path)) if doc]


UPSTREAM_COMMIT: str = _catalog()["upstream"]["commit"]
PLACEMENTS: dict[str, Placement] = {
    name: Placement(name, fields["title"], fields["type"], *(
        (fields["workload_policy"]["type"], fields["workload_policy"]["accelerator_topology"])
        if "workload_policy" in fields else ()))
    for name, fields in _catalog()["placements"].items()}
TRANSPORTS: dict[str, Transport] = {
    name: Transport(name=name, **{**fields, "nccl_env": tuple(fields.get("nccl_env", {}).items())})
    for name, fields in _catalog()["transports"].items()}


def _machine(name: str, fields: dict) -> GpuMachine:
    transport = TRANSPORTS[fields["transport"]]
    prices = {region: Price(row.get("on_demand"), row.get("spot"), row["source"])
              for region, row in _catalog()["prices"]["machines"].get(name, {}).items()}
    return GpuMachine(name, fields["title"], fields["accelerator"], fields["gpus"], fields["vcpus"],
                      fields["memory_gib"], transport, fields["gpu_nics"], fields.get("installer", transport.installer),
                      fields.get("pod", transport.pod),
                      fields["nccl_tuner_config"], fields["gpu_family"], fields["min_gke"], fields["spot"],
                      fields["capacity"], prices, fields.get("arch", "amd64"),
                      tuple(PLACEMENTS[name] for name in fields["placement"]["offered"]),
                      PLACEMENTS.get(fields["placement"].get("required")))


@dataclass(frozen=True)
class WakeAssumed:
    """What a wake is assumed to take before one is measured (`gpus/catalog.yaml`, wake_assumed)."""

    node_seconds: float
    network_stack_seconds: dict[str, float]     # by transport
    image_pull_seconds: dict[str, float]        # registry, streamed
    start_and_join_seconds: float


WAKE_ASSUMED = WakeAssumed(**_catalog()["wake_assumed"])

GPU_MACHINES: dict[str, GpuMachine] = {name: _machine(name, fields) for name, fields in _catalog()["machines"].items()}
PRICES_AS_OF: str = _catalog()["prices"]["as_of"]
PRICE_SOURCES: list[str] = _catalog()["prices"]["sources"]
# The prices of the rest of an environment: CPU machines, Lustre capacity, GKE's fee, the functions (its comments).
PLATFORM_PRICES: dict = yaml.safe_load((GPUS / "platform_prices.yaml").read_text())


@dataclass(frozen=True)
class CpuMachine:
    vcpus: int
    memory_gib: float


# vCPU and memory of the CPU machine types a system pool is likely to use (GCE machine
# families page). Only used to check that the Ray head fits; an unlisted type is not checked.
CPU_MACHINES: dict[str, CpuMachine] = {
    "e2-standard-4": CpuMachine(4, 16),
    "e2-standard-8": CpuMachine(8, 32),
    "e2-standard-16": CpuMachine(16, 64),
    "e2-standard-32": CpuMachine(32, 128),
    "n2-standard-16": CpuMachine(16, 64),
    "n2-standard-32": CpuMachine(32, 128),
    "n2-standard-64": CpuMachine(64, 256),
    "n2-standard-80": CpuMachine(80, 320),
    "n2-highmem-32": CpuMachine(32, 256),
    "n2-highmem-64": CpuMachine(64, 512),
    "n2-highmem-80": CpuMachine(80, 640),
    "n2-highmem-96": CpuMachine(96, 768),
}

@dataclass(frozen=True)
class LustreTier:
    """A Managed Lustre performance tier's capacities in GiB: from `minimum` in steps of `minimum` up to
    `threshold`, above it in steps of `big_step` up to `maximum`; an instance created at or below the
    threshold grows only up to it (managed-lustre/docs/performance-tiers and increase-capacity, read 2026-12)."""

    minimum: int
    threshold: int
    big_step: int
    maximum: int

    def step_at(self, capacity: int) -> int:
        return self.minimum if capacity <= self.threshold else self.big_step


# Per-unit throughput (MB/s per TiB) -> its tier. The Dynamic tier (25 MB/s/TiB aggregate) is not offered by rlops.
LUSTRE_TIERS: dict[int, LustreTier] = {
    1000: LustreTier(9_000, 1_530_000, 72_000, 10_008_000), 500: LustreTier(18_000, 3_060_000, 144_000, 20_016_000),
    250: LustreTier(36_000, 6_120_000, 288_000, 40_032_000), 125: LustreTier(72_000, 12_240_000, 72_000, 12_240_000)}

# The Ray each pinned NeMo RL image ships (its pyproject's ray[default] pin). The codelab
# declares rayVersion 2.54.0 for v0.4.0, which is wrong: KubeRay would run a mismatched autoscaler.
NEMO_RL_IMAGE_RAY: dict[str, str] = {
    "nvcr.io/nvidia/nemo-rl:v0.4.0": "2.46.0",
    "nvcr.io/nvidia/nemo-rl:v0.5.0": "2.49.2",
    "nvcr.io/nvidia/nemo-rl:v0.6.0": "2.54.0",  # from v0.6.0 the pin is uv.lock's
    "nvcr.io/nvidia/nemo-rl:v0.7.0": "2.55.1",
}

# The RDMA network profile the tutorials use, per zone.
def rdma_network_profile(zone: str) -> str:
    return f"{zone}-vpc-roce"


# The range GCE's auto-mode VPC networks allocate their per-region subnets from.
AUTO_MODE_SUBNET_RANGE = "10.128.0.0/9"
