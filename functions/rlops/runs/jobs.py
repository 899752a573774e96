"""The Ray job a train message becomes: submission id, command, non-secret runtime env, metadata; and its submission.

The submission id is derived from the environment, the run and the attempt, so a replayed message
names a job Ray already has. '.' cannot occur in either name, so two pairs never give one id.
Secrets never go here: Ray returns a job's runtime env in plain text to API clients. The Ray nodes
carry them as files (`rlops.kube.tokens`), and a NeMo RL job's runtime env the GPU workers' own settings
(`actor_env`).

Every attempt's command starts with the checkpoint gate (`rlops.checkpoints.gate`), which verifies
the run's checkpoints against their manifests where they are and sets aside what does not verify,
so the workload resumes only from a verified one; `submit` ships the manifests with the job.
"""

import dataclasses
import hashlib
import json
import shlex
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import rlops
from rlops.checkpoints import gate, manifest
from rlops.cloud.ray_jobs import META_PREFIX, JobRequest
from rlops.kube import render
from rlops.sites import Site
from rlops.spec import nemo_rl, nemo_rl_reward
from rlops.spec.model import GcpEnvironment, LocalEnvironment, Recipe

LUSTRE = PurePosixPath("/lustre")


def submission_id(environment: str, run: str, attempt: int) -> str:
    return f"rlops.{environment}.{run}.{attempt}"


def checkpoint_dir(recipe: Recipe, run: str, lustre_root: str) -> str:
    """CHECKPOINT_ROOT/RUN, with /lustre where this environment mounts it (a local directory, locally)."""
    return on_lustre(str(PurePosixPath(recipe.checkpoint_root) / run), lustre_root)


def on_lustre(path: str, lustre_root: str) -> str:
    """A path under /lustre where this environment mounts it; any other path or URL as it is."""
    if not path.startswith("/") or not PurePosixPath(path).is_relative_to(LUSTRE):
        return path
    return str(PurePosixPath(lustre_root) / PurePosixPath(path).relative_to(LUSTRE))


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def command(recipe: Recipe, settings: dict[str, Any], directory: str, data: dict[str, Any] | None = None,
            gpus: tuple[str, int] | None = None, hold: int = 0) -> str:
    """The job's shell command: the checkpoint gate (with `data`, the recipe's data steps and reward check:
    `nemo_rl_reward.for_job`; with `hold`, a backoff before it looks for the GPUs), then the workload. NeMo RL's
    example scripts, configs and prompts are paths relative to the repository in the image, so its command starts
    there, whatever the Ray worker's own directory. `gpus`: what a local trl recipe whose driver plays NeMo RL's
    (`pool_gpus`) asks Ray for."""
    limit = recipe.set_aside
    checked = ["python", "-m", "rlops.checkpoints.gate", "--run-dir", directory,
               *(["--unverified"] if recipe.resume_from == "newest" else []), "--keep", str(limit.count),
               *(["--keep-bytes", str(limit.gib * 2**30)] if limit.gib else []),
               *(["--data", json.dumps(data, sort_keys=True)] if data else []),
               *(["--hold", str(hold)] if hold else [])]
    if recipe.runner == "nemo-rl":
        nodes, per_node = settings.get("cluster.num_nodes"), settings.get("cluster.gpus_per_node")
        if isinstance(nodes, int) and isinstance(per_node, int):  # the GPUs NeMo RL's driver asks Ray for
            checked += ["--wait-for", f"GPU={nodes * per_node}", "--wait-seconds", str(recipe.gpu_wait_seconds)]
        words = nemo_rl.words(recipe, settings, directory)
        return f"{_shell(checked)} && cd {nemo_rl.WORKDIR} && {_shell(words)}"
    asked = [] if gpus is None else ["--gpus", f"{gpus[0]}={gpus[1]}"]
    if gpus is not None:
        checked += ["--wait-for", asked[1], "--wait-seconds", str(recipe.gpu_wait_seconds)]
    words = ["python", "-m", recipe.entrypoint, "--output-dir", directory, *asked,
             *(f"{key}={_text(value)}" for key, value in sorted(settings.items()))]
    return f"{_shell(checked)} && {_shell(words)}"


def _shell(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def pool_gpus(env: GcpEnvironment | LocalEnvironment, recipe: Recipe) -> tuple[str, int] | None:
    """For a local trl recipe whose driver runs on the head (`driver: head`), the Ray resource standing for GPUs and a
    GPU-pool node's count of it, which its driver checks for and its training actor holds; otherwise None."""
    if not isinstance(env, LocalEnvironment) or recipe.runner != "trl" or not recipe.driver_on_head:
        return None
    return env.local.gpu_pool.resource, env.local.gpu_pool.per_worker


def actor_env(env: GcpEnvironment | LocalEnvironment, recipe: Recipe) -> dict[str, str]:
    """What NeMo RL's actors need from the job: on GKE the settings of the recipe's GPU pool's workers
    (`render.actor_env`); locally nothing, as the driver runs on the GPU-pool node itself."""
    return render.actor_env(env, recipe.gpu_pool) if isinstance(env, GcpEnvironment) else {}


def request(environment: str, recipe_name: str, recipe: Recipe, run: str, settings: dict[str, Any], requested_by: str,
            attempt: int, lustre_root: str, entrypoint_resources: dict[str, float] | None = None,
            actors: dict[str, str] | None = None, tag: nemo_rl.Tag | None = None,
            gpus: tuple[str, int] | None = None, hold: int = 0) -> JobRequest:
    """`actors`: the environment NeMo RL's actors need (`actor_env`); `tag`: the NeMo RL tag of the environment's
    image (`data_tag`), whose data reading the gate's reward check follows; `gpus`: `pool_gpus`; `hold`: seconds the
    gate backs off first (`policy.backoff`). A driver on the head asks for no resource (`entrypoint_resources` are
    where any other driver runs)."""
    directory = checkpoint_dir(recipe, run, lustre_root)
    runtime_env: dict[str, Any] = {}
    if recipe.driver_on_head:
        # NeMo RL's init_ray copies the driver's os.environ into every actor: the job carries the actors' settings
        # (one HF_HOME among them), so they are the same whichever node the driver runs on.
        # NeMo RL calls wandb.init(**logger.wandb) with no id: W&B takes the run's from the environment, so every
        # attempt of one rlops run logs into one W&B run (resumed), not a new run per attempt.
        # NRL_VIRTUAL_CLUSTER_MAX_RETRIES: NeMo RL's own wait for the GPUs (nemo_rl/distributed/virtual_cluster.py
        # at v0.4.0-v0.7.0; 2**i seconds per try), raised from 6 (a minute) to 10 (17 minutes), behind the gate's.
        runtime_env = {"env_vars": {**(actors or {}), "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                    "WANDB_RUN_ID": wandb_run_id(environment, run), "WANDB_RESUME": "allow",
                                    "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "10"}}
    metadata = {"environment": environment, "recipe": recipe_name, "run": run, "attempt": str(attempt),
                "requested-by": requested_by, "checkpoint-dir": directory,
                "settings": json.dumps(settings, sort_keys=True)}
    return JobRequest(submission_id=submission_id(environment, run, attempt),
                      entrypoint=command(recipe, settings, directory, nemo_rl_reward.for_job(
                          tag, recipe, settings, lambda path: on_lustre(path, lustre_root)), gpus, hold),
                      metadata={META_PREFIX + key: value for key, value in metadata.items()},
                      runtime_env=runtime_env,
                      entrypoint_resources={} if recipe.driver_on_head else entrypoint_resources or {})


def wandb_run_id(environment: str, run: str) -> str:
    """One W&B run per rlops run: the run's name and a digest of environment and run (W&B ids: 64 characters at
    most, of letters, digits, - and _), the same for every attempt."""
    return f"{run}-{hashlib.sha256(f'{environment}/{run}'.encode()).hexdigest()[:8]}"


def for_site(site: Site, recipe_name: str, run: str, settings: dict[str, Any], requested_by: str, attempt: int,
             hold: int = 0) -> JobRequest:
    """`request`, placed where the site's jobs run (its /lustre, the driver's Ray resources, its actors' settings)."""
    recipe = site.env.recipes[recipe_name]
    return request(site.name, recipe_name, recipe, run, settings, requested_by, attempt, site.lustre_root,
                   site.entrypoint_resources, actor_env(site.env, recipe), data_tag(site.env),
                   pool_gpus(site.env, recipe), hold)


def data_tag(env: GcpEnvironment | LocalEnvironment) -> nemo_rl.Tag | None:
    """The NeMo RL tag of a GCP environment's image (None: rlops has no copy of it, or a local environment)."""
    return nemo_rl.tag_for(env.ray.image) if isinstance(env, GcpEnvironment) else None


MANIFESTS_SHIPPED = 16  # the newest ones; an older checkpoint is reached only if all of these fail to verify


def submit(site: Site, job: JobRequest, run: str) -> bool:
    """Submit `job` once, with the run's newest intact manifests for its gate (and, on GKE, rlops itself) as
    py_modules; True if this call submitted it."""
    newest = sorted(site.records.manifest_objects(run).items())[-MANIFESTS_SHIPPED:]
    read = {step: json.loads(blob.download_as_bytes()) for step, blob in newest}
    newest = {step: content for step, content in read.items() if manifest.intact(content)}
    with tempfile.TemporaryDirectory(prefix="rlops-job-") as staging:  # the submit uploads the py_modules
        modules = [str(gate.stage(Path(staging), newest))]
        if not site.checkpoints_here:
            modules += shipped_rlops(Path(staging))
        runtime_env = {**job.runtime_env, "py_modules": [*job.runtime_env.get("py_modules", []), *modules]}
        return site.ray.submit_once(dataclasses.replace(job, runtime_env=runtime_env))


def shipped_rlops(staging: Path) -> list[str]:
    """py_modules for a job on a cluster whose image has neither rlops nor google-crc32c: the rlops package and
    libcrc32c (`manifest.native_module`)."""
    native = manifest.native_module(staging)
    return [str(Path(rlops.__file__).parent), *([str(native)] if native else [])]
