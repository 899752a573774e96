"""NeMo RL's driver, in the behaviours a run's survival depends on, for the local loop (issue 32, 6).

Read from NVIDIA-NeMo/RL's nemo_rl/distributed/virtual_cluster.py (the same at v0.4.0, v0.5.0, v0.6.0 and v0.7.0),
written here anew:

- `init_ray` joins the running cluster (`address="auto"`, `log_to_driver=True`, no dashboard) with the runtime env
  `{"env_vars": dict(os.environ)}` less RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: every actor and task of the job
  gets the driver's whole environment, whichever node it runs on.
- `RayVirtualCluster._init_placement_groups` tries NRL_VIRTUAL_CLUSTER_MAX_RETRIES times (default 6; it asserts a
  positive number). Each try compares `int(ray.cluster_resources()["GPU"])` with the GPUs the cluster config asks for
  (one bundle per GPU), then the CPUs with one per bundle, and raises ResourceInsufficientError on a shortfall; the
  loop prints the error and `Retrying placement group creation... i/N. Next retry in 2**i seconds.`, sleeps 2**i
  seconds, and after the last try raises ResourceInsufficientError("Maximum number of retries reached (N). ..."):
  1 + 2 + ... + 32 = 63 seconds with the default.

On GKE the driver runs on the CPU-only head, so GPU nodes that join a minute after it started are too late. Here a
Ray custom resource (the local GPU pool's, `local.gpu_pool.resource`) stands for "GPU", and the training runs in one
actor that holds it, so that stopping the GPU-pool node loses the actor as a preemption loses NeMo RL's workers.
"""

import os
import time
from collections.abc import Callable
from typing import Any

import ray

DEFAULT_RETRIES = 6
RETRIES_VARIABLE = "NRL_VIRTUAL_CLUSTER_MAX_RETRIES"


class ResourceInsufficientError(Exception):
    """NeMo RL's name for it: the cluster has fewer GPUs (or CPUs) than the run asks for."""


def init_ray() -> None:
    copied = dict(os.environ)
    copied.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
    ray.init(address="auto", log_to_driver=True, include_dashboard=False, runtime_env={"env_vars": copied})


def check(resource: str, bundles: int, sleep: Callable[[float], None] = time.sleep) -> None:
    """The GPU check with NeMo RL's retries; `resource` stands for "GPU"."""
    retries = int(os.environ.get(RETRIES_VARIABLE, DEFAULT_RETRIES))
    if retries <= 0:
        raise ValueError(f"{RETRIES_VARIABLE}={retries} must be an integer greater than 0")
    for attempt in range(retries):
        have = ray.cluster_resources()
        try:
            if bundles > int(have.get(resource, 0)):
                raise ResourceInsufficientError(f"Not enough GPUs available. Requested {bundles} GPUs, but only "
                                                f"{int(have.get(resource, 0))} are available in the cluster.")
            if bundles > int(have.get("CPU", 0)):
                raise ResourceInsufficientError(f"Not enough CPUs available. Requested {bundles} CPUs, but only "
                                                f"{int(have.get('CPU', 0))} are available in the cluster.")
            return
        except ResourceInsufficientError as short:
            print(short, flush=True)
            print(f"Retrying placement group creation... {attempt + 1}/{retries}. Next retry in {2 ** attempt} "
                  "seconds.", flush=True)
            sleep(2 ** attempt)
    raise ResourceInsufficientError(f"Maximum number of retries reached ({retries}). Cluster resources may be "
                                    "insufficient or cluster itself is highly unstable. Please check your cluster "
                                    "configuration and your cluster logs.")


class GpuPoolActor:
    """Runs one call where Ray places it (on the GPU pool)."""

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)


def run_on_pool(resource: str, count: int, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a Ray actor holding `count` of `resource` (and a CPU); its output reaches the driver's
    (log_to_driver). A lost node ends the actor, and this call with RayActorError, as NeMo RL's driver ends."""
    actor = ray.remote(num_cpus=1, resources={resource: count}, max_restarts=0)(GpuPoolActor).remote()
    return ray.get(actor.call.remote(function, *args))
