"""The Ray job a train message becomes: submission id, command, non-secret runtime env, metadata. Pure.

The submission id is derived from the environment, the run and the attempt, so a replayed message
names a job Ray already has. '.' cannot occur in either name, so two pairs never give one id.
Secrets never go here: Ray returns a job's runtime env in plain text to API clients. The pods
(or, locally, the Ray nodes) carry them in their environment.
"""

import json
import shlex
from pathlib import PurePosixPath

from rlops.cloud.ray_jobs import META_PREFIX, JobRequest
from rlops.spec import nemo_rl

LUSTRE = PurePosixPath("/lustre")


def submission_id(environment: str, run: str, attempt: int) -> str:
    return f"rlops.{environment}.{run}.{attempt}"


def checkpoint_dir(recipe, run: str, lustre_root: str) -> str:
    """CHECKPOINT_ROOT/RUN, with /lustre where this environment mounts it (a local directory, locally)."""
    path = PurePosixPath(recipe.checkpoint_root) / run
    if path.is_relative_to(LUSTRE):
        path = PurePosixPath(lustre_root) / path.relative_to(LUSTRE)
    return str(path)


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def command(recipe, settings: dict, directory: str) -> str:
    """The job's shell command. NeMo RL's example scripts, configs and prompts are paths relative to the
    repository in the image, so the command starts there, whatever the Ray worker's own directory."""
    if recipe.runner == "nemo-rl":
        words = nemo_rl.words(recipe, settings, directory)
        return f"cd {nemo_rl.WORKDIR} && " + " ".join(shlex.quote(word) for word in words)
    words = ["python", "-m", recipe.entrypoint, "--output-dir", directory,
             *(f"{key}={_text(value)}" for key, value in sorted(settings.items()))]
    return " ".join(shlex.quote(word) for word in words)


def request(environment: str, recipe_name: str, recipe, run: str, settings: dict, requested_by: str,
            attempt: int, lustre_root: str, entrypoint_resources: dict[str, float] | None = None) -> JobRequest:
    directory = checkpoint_dir(recipe, run, lustre_root)
    runtime_env: dict = {}
    if recipe.runner == "nemo-rl":
        runtime_env = {"env_vars": {"HF_HOME": f"{lustre_root}/hf", "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}}
    metadata = {"environment": environment, "recipe": recipe_name, "run": run, "attempt": str(attempt),
                "requested-by": requested_by, "checkpoint-dir": directory,
                "settings": json.dumps(settings, sort_keys=True)}
    return JobRequest(submission_id=submission_id(environment, run, attempt),
                      entrypoint=command(recipe, settings, directory),
                      metadata={META_PREFIX + key: value for key, value in metadata.items()},
                      runtime_env=runtime_env, entrypoint_resources=entrypoint_resources or {})


def for_site(site, recipe_name: str, run: str, settings: dict, requested_by: str, attempt: int) -> JobRequest:
    """`request`, placed where the site's jobs run (its /lustre, the driver's Ray resources)."""
    return request(site.name, recipe_name, site.env.recipes[recipe_name], run, settings, requested_by, attempt,
                   site.lustre_root, site.entrypoint_resources)
