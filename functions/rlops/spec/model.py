"""The environment spec: typed models of `environments/NAME.yaml`.

Every model is strict (no coercion: `"18000"` is not a number) and closed (an unknown key is an
error). Rules that span several fields live in `rules.py` and `recipe_rules.py`, where each can name
the exact field it is about; the models hold shapes, single-field constraints and defaults. This
module holds the environments, their recipes, secrets, idle policy and local stack; `gcp_sections.py`
the GCP environment's project, networks, cluster, pools, Lustre and Ray; `field_types.py` the
constrained values they share.
"""

import math
import re
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from rlops.spec import catalog, images
from rlops.spec.field_types import (
    DNS_LABEL,
    REGION,
    ZONE,
    AbsolutePath,
    BucketName,
    DnsLabel,
    Duration,
    EnvVar,
    GcsPrefix,
    GkeName,
    JsonlPath,
    JsonlSource,
    MachineType,
    OverrideKey,
    RayResource,
    Region,
    Scalar,
    SecretName,
    SecretVersion,
    Spec,
    Zone,
    described,
    seconds,
)
from rlops.spec.gcp_sections import Cluster, GpuPool, Lustre, Networks, Project, Ray


class State(Spec):
    """Where rlops keeps its state: the lock, the resource record, run records and manifests."""

    bucket: BucketName = Field(description="Cloud Storage bucket for state, locks, run records and manifests.")
    prefix: DnsLabel = Field(
        default="rlops",
        description=described("The folder of the bucket rlops writes under (PREFIX/locks/, PREFIX/environments/ENV/)",
                              DNS_LABEL))


class SecretRef(Spec):
    """Where a secret's value lives. The value itself never appears in a spec."""

    secret_manager: SecretVersion | None = Field(
        default=None, description="gcp: projects/P/secrets/NAME/versions/V, read at apply into the cluster's Secret.")
    env: EnvVar | None = Field(default=None, description="local only: an environment variable of the local processes")
    file: StrictStr | None = Field(default=None, min_length=1, description="local only: a file holding the value")


class AllowedOverride(Spec):
    type: Literal["int", "float", "bool", "str"] = Field(description="The JSON type a train message's value must have.")
    min: StrictInt | StrictFloat | None = Field(
        default=None, description="int and float only: the smallest value a message may set.")
    max: StrictInt | StrictFloat | None = Field(
        default=None, description="int and float only: the largest value a message may set.")
    pattern: StrictStr | None = Field(
        default=None, description="str only: a regular expression the whole value must match")
    max_length: StrictInt = Field(
        default=256, ge=1, le=4096, description="str only: the longest value a message may set, in characters.")
    default: Scalar = Field(default=None, description="The value used when a train message does not set it.")

    def problem_with(self, value: object) -> str | None:
        """Why `value` may not be sent for this override, or None when it may."""
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[self.type]
        if isinstance(value, bool) != (self.type == "bool") or not isinstance(value, expected):
            return f"expected {self.type}, got {type(value).__name__}"
        # The type's own check, above, makes each isinstance below hold: they tell the checker which type it is.
        if self.type in ("int", "float") and isinstance(value, int | float):
            if not math.isfinite(value):
                return f"{value} is not a finite number"
            if self.min is not None and value < self.min:
                return f"{value} is below the minimum {self.min}"
            if self.max is not None and value > self.max:
                return f"{value} is above the maximum {self.max}"
        if self.type == "str" and isinstance(value, str):
            if len(value) > self.max_length:
                return f"longer than {self.max_length} characters"
            if self.pattern is not None and not re.fullmatch(self.pattern, value):
                return f"does not match {self.pattern}"
        return None


class ExportPolicy(Spec):
    """Which complete, manifested checkpoints the snapshot tick copies to Cloud Storage and verifies there."""

    when: Literal["none", "final", "every"] = Field(
        default="none", description="final: the last checkpoint of a run that succeeded; every: every `every`-th "
        "checkpoint.")
    every: StrictInt | None = Field(default=None, ge=1, le=10_000, description="with when: every, the N of every N-th.")
    to: GcsPrefix | None = Field(
        default=None, description="gs://BUCKET/PREFIX; RUN/step-N/ goes under it. Default: the state bucket, under "
        "state.prefix/environments/ENV/runs/RUN/exports.")


class SetAsideLimit(Spec):
    """What the checkpoint gate keeps of the checkpoints it set aside (torn, altered, or not manifested yet); the
    oldest beyond either bound are deleted by the gate, which says so in the attempt's record."""

    count: StrictInt = Field(default=5, ge=1, le=1000, description="Set-aside checkpoints kept, the newest.")
    gib: StrictInt | None = Field(default=None, ge=1, le=10_000_000, description="Their total size kept, in GiB.")


class DataStep(Spec):
    """A data file each attempt's gate writes before the workload (on GKE on the head pod, into Lustre) from rows as
    their publisher publishes them, for the recipe's data path to name; `rlops train --check-data` reads published rows
    through it."""

    source: JsonlSource = Field(description="Where the rows are published: an https:// URL or an absolute path of a "
                                "JSON Lines file.")
    path: JsonlPath = Field(description="Where the gate writes them: an absolute .jsonl path on Lustre.")
    transform: Literal["gsm8k-final-answer"] = Field(
        description="gsm8k-final-answer: each row's answer, a worked solution ending in '#### N', becomes N (as NeMo "
        "RL's own gsm8k dataset does from v0.6.0), the ground truth its math reward can match.")


class Recipe(Spec):
    runner: Literal["nemo-rl", "trl"] = Field(
        description="nemo-rl (NVIDIA NeMo RL's GRPO) or trl (TRL's GRPOTrainer, the local recipe).")
    entrypoint: StrictStr = Field(
        min_length=1, max_length=512,
        description="The script the job runs (nemo-rl: inside the image, e.g. examples/run_grpo_math.py).")
    config: StrictStr | None = Field(default=None, max_length=512, description="nemo-rl: config path inside the image.")
    model: StrictStr = Field(min_length=1, max_length=256, description="The model it trains (a Hugging Face id).")
    gpu_pool: GkeName | None = Field(default=None, description="The pool it runs on; needed when there are several.")
    overrides: dict[OverrideKey, Scalar] = Field(default_factory=dict, description="Config values every run of the "
                                                 "recipe gets, by dotted key; a train message cannot change them.")
    allowed_overrides: dict[OverrideKey, AllowedOverride] = Field(
        default_factory=dict, description="What a train message may set, and within which bounds.")
    checkpoint_root: AbsolutePath = Field(description="Each run checkpoints into CHECKPOINT_ROOT/RUN.")
    resume_budget: StrictInt = Field(default=3, ge=0, le=100, description="Resubmissions after preemption.")
    resume_from: Literal["verified", "newest"] = Field(
        default="verified", description="verified: an attempt resumes only from a checkpoint that matches its manifest "
        "(others are set aside); newest: from the newest complete one, unhashed (for checkpoints too large to "
        "hash at every start).")
    export: ExportPolicy = Field(
        default=ExportPolicy(), description="When a run's checkpoints are exported to Cloud Storage.")
    driver: Literal["gpu-pool", "head"] | None = Field(
        default=None, description="Where the job's driver runs. head: on the CPU-only Ray head, as NeMo RL's does "
        "(always, for nemo-rl): its GPUs are its actors', so the gate waits for them first (gpu_wait). gpu-pool (trl's "
        "default): on a GPU-pool node, which Ray holds the job for. A local trl recipe with head plays NeMo RL's "
        "driver: it copies its environment into a training actor on the pool, after checking for it with NeMo RL's "
        "retries.")
    gpu_wait: Duration = Field(
        default="30m", description="A driver on the head: how long an attempt's gate waits for its GPUs (nemo-rl: "
        "cluster.num_nodes x cluster.gpus_per_node; local: a GPU-pool node's resource) before the workload starts "
        "(NeMo RL gives up after about a minute); an attempt that does not get them is resubmitted, within "
        "resume_budget.")
    set_aside: SetAsideLimit = Field(
        default=SetAsideLimit(), description="A bound on what set-aside/ grows to: a checkpoint can be hundreds of GB, "
        "and on GKE manifests lag the scan, so set-asides happen.")
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
        default="30m", description="auto: chosen from this environment's measured wakes and idle gaps (rlops reap "
        "--dry-run says which and why).")
    scale_down: list[Literal["ray-workers", "node-pools"]] = Field(
        description="What scaling down stops: the RayCluster's GPU workers, the GPU node pools, or both.",
        default_factory=lambda: ["ray-workers", "node-pools"], min_length=1)
    scale_reserved: StrictBool = Field(
        default=False, description="Scale down pools that consume a reservation too: that saves nothing (a reservation "
        "bills whether its VMs run or not) but frees its capacity for other work in the project.")

    @property
    def timeout_seconds(self) -> int | None:
        """The fixed timeout; None for auto."""
        if self.timeout == "auto":
            return None
        return seconds(self.timeout)


class LocalCountsAs(Spec):
    machine_type: MachineType = Field(
        default="a3-ultragpu-8g", description="The GPU machine type a local worker is priced as.")
    region: Region = Field(default="us-central1", description=described("The region whose list price is counted",
                                      REGION))
    spot: StrictBool = Field(default=False, description="Priced at the Spot rate.")
    usd_per_node_hour: StrictFloat | StrictInt | None = Field(
        default=None, gt=0, le=100_000, description="A price per node-hour instead of the catalog's.")


class LocalGpuPool(Spec):
    """Ray worker nodes carrying a custom resource that stands in for a GPU node pool."""

    name: DnsLabel = Field(
        default="gpu-pool", description=described("The pool's name, which a recipe's gpu_pool may name", DNS_LABEL))
    workers: StrictInt = Field(default=1, ge=0, le=8, description="Ray worker nodes in the pool when it is up.")
    resource: RayResource = Field(
        default="gpu_pool", description="The Ray custom resource that stands in for a GPU.")
    per_worker: StrictInt = Field(
        default=1, ge=1, le=64, description="Units of the resource each worker carries (its GPUs).")
    cpus_per_worker: StrictInt = Field(default=1, ge=1, le=64, description="CPUs each worker offers Ray.")
    join_delay: Duration | None = Field(
        default=None, description="Each worker joins Ray this long after `rlops up` or a wake starts it, as a GKE node "
        "that boots, pulls its image and joins takes minutes; unset: at once.")

    @property
    def join_delay_seconds(self) -> int:
        return seconds(self.join_delay) if self.join_delay else 0
    counts_as: LocalCountsAs = Field(default_factory=lambda: LocalCountsAs(),
                                       description="What rlops cost counts each worker as: a GPU node of this type.")



class LocalSection(Spec):
    lustre_dir: StrictStr = Field(default=".rlops/local/lustre", min_length=1, description="Stands in for /lustre.")
    gpu_pool: LocalGpuPool = Field(
        default=LocalGpuPool(), description="The Ray workers that stand in for a GPU node pool.")


class _Environment(Spec):
    state: State = Field(description="The Cloud Storage bucket (on local, its emulator's) where rlops keeps locks, "
                         "the resource record, run records and checkpoint manifests.")
    secrets: dict[SecretName, SecretRef] = Field(
        default_factory=dict, description="Secret references by name. Each is a file of the Ray nodes, never an "
        "environment variable; Hugging Face reads HF_TOKEN's (HF_TOKEN_PATH), W&B WANDB_API_KEY's (as a netrc, NETRC).")
    recipes: dict[DnsLabel, Recipe] = Field(min_length=1, description="The training recipes a train message may "
                                            "name, by name.")
    idle: IdlePolicy = Field(
        default=IdlePolicy(), description="When the reaper scales the idle GPU pool down, and what it scales.")


class GcpEnvironment(_Environment):
    provider: Literal["gcp"] = Field(
        description="gcp: GKE, Managed Lustre and the functions in a Google Cloud project.")
    project: Project = Field(description="The Google Cloud project the environment's resources are made in: its ID "
                             "and number.")
    region: Region = Field(description=described("The region of the cluster, the subnets and the GPU list "
                                      "prices", REGION))
    zone: Zone = Field(description=described("The zone, in region, of the GPU pools and the Lustre instance",
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
    local: LocalSection = Field(
        default=LocalSection(), description="The local stack: where /lustre is, the GPU-pool workers.")

    @property
    def woken_workers(self) -> int:
        return self.local.gpu_pool.workers


EnvironmentSpec = Annotated[GcpEnvironment | LocalEnvironment, Field(discriminator="provider")]

# The models an unknown key may be compared against, by the discriminator value.
ROOT_MODELS: dict[str, type[Spec]] = {"gcp": GcpEnvironment, "local": LocalEnvironment}
