"""Facts about Google Cloud and NeMo RL that a spec is checked against.

Each table names where its numbers come from, so a reader can re-check them when
Google or NVIDIA change them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuMachine:
    accelerator: str
    accelerators_per_node: int
    vcpus: int
    memory_gib: float
    # The file NeMo RL's gIB plugin reads for NCCL tuning on this machine family
    # (seed 1's values.yaml step; cluster-toolkit's a3-ultragpu-8g Dockerfile).
    nccl_tuner_config: str
    # The `gpu_family` dimension of Cloud Quotas' GPUS-PER-GPU-FAMILY-per-project-region quota for its GPUs
    # (NVIDIA_H100 in Google's quota docs; the others named alike).
    gpu_family: str


# GCE accelerator-optimized machine types the tutorials use (GPU type and count are fixed by GCE;
# vCPUs and memory from the GCE accelerator-optimized machines page).
GPU_MACHINES: dict[str, GpuMachine] = {
    "a3-ultragpu-8g": GpuMachine("nvidia-h200-141gb", 8, 224, 2952, "/usr/local/gib/configs/tuner_config_a3u.txtpb",
                                 "NVIDIA_H200"),
    "a4-highgpu-8g": GpuMachine("nvidia-b200", 8, 224, 3968, "/usr/local/gib/configs/tuner_config_a4.txtpb",
                                "NVIDIA_B200"),
}


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
