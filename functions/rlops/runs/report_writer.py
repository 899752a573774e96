"""A run's report from what rlops already keeps (the run record, each attempt's per-step series, the checkpoint
manifests, the GPU pool's state, the environment's spec and last apply), drawn by `runs.report_page`: kept in the
state bucket beside the run record (`runs/RUN/report/`) when the run ends, or written to a folder on request.
Several runs' comparison is written to a folder.
"""

import tempfile
import time
from pathlib import Path
from typing import Any

from rlops.runs import environment_cost, jobs, report_page, snapshot
from rlops.sites import Site
from rlops.spec import nemo_rl
from rlops.spec.model import GcpEnvironment, LocalEnvironment, Recipe
from rlops.state.resources import AppliedSpec
from rlops.state.run_records import RunRecord

CONTENT_TYPES = {".md": "text/markdown; charset=utf-8", ".png": "image/png"}


def _checkpoints(site: Site, run: str) -> list[dict[str, Any]]:
    rows = snapshot.listing(site, run) or []
    return [{"step": row["step"], "bytes": row["total_bytes"],
             "verified": True if row["verified"] == "yes" else False if row["verified"].startswith("NO") else None}
            for row in rows]


def _series(site: Site, record: RunRecord) -> dict[int, dict[str, Any]]:
    return {a.attempt: site.records.metrics(record.run, a.attempt) or {"steps": [], "saves": []}
            for a in record.attempts}


def write(site: Site, record: RunRecord, out_dir: Path) -> report_page.Report:
    run = record.run
    return report_page.write(out_dir, record.to_json(), _series(site, record), _checkpoints(site, run),
                             site.pool.read()[0].to_json(), _cost(site, run), about(site, record))


def compare(site: Site, records: list[RunRecord], out_dir: Path) -> report_page.Report:
    return report_page.compare(out_dir, [(record, _series(site, record)) for record in records], time.time())


def about(site: Site, record: RunRecord) -> dict[str, str]:
    """What the report says the run ran on that its record does not hold: the image, the spec's commit, W&B."""
    env = site.env
    applied = AppliedSpec(site.bucket, env.state.prefix, site.name).read() or {}
    # A run record keeps no commit of its own: the environment's last complete apply is what its cluster ran when
    # the report was drawn, which a later apply may have moved past.
    commit = (f"{applied['commit']} (the environment's last complete apply when this report was drawn; runs do "
              "not record their own)") if applied.get("commit") else \
        "not recorded (no apply of this environment named a commit; runs do not record their own)"
    found = {"image": env.ray.image if env.provider == "gcp" else "local (the Ray head of this machine)",
             "spec commit": commit}
    said = wandb_said(env, record)
    if said:
        found["W&B"] = said
    return found


def wandb_said(env: GcpEnvironment | LocalEnvironment, record: RunRecord) -> str | None:
    """Where the run's W&B run is: its URL when the recipe's config names the entity and project, else its id and
    what is known; None when the run logs to no W&B (the local recipe, or a config with wandb_enabled off)."""
    recipe = env.recipes.get(record.recipe)
    if recipe is None or recipe.runner != "nemo-rl":
        return None  # TRL's local recipe runs with report_to="none"
    logger = _logger_config(env, recipe, record)
    if not logger.get("wandb_enabled"):
        return None
    if not recipe.driver_on_head:
        return "on; its run id is W&B's own (rlops sets WANDB_RUN_ID only for a driver it places on the head)"
    run_id = jobs.wandb_run_id(record.environment, record.run)
    wandb = logger.get("wandb") or {}
    entity, project = wandb.get("entity"), wandb.get("project")
    if entity and project:
        return f"https://wandb.ai/{entity}/{project}/runs/{run_id}"
    where = f"project {project}" if project else "W&B's default project"
    return (f"run id {run_id} in {where} (the recipe's config names no entity: the W&B key's default one; "
            f"https://wandb.ai/ENTITY/{project or 'PROJECT'}/runs/{run_id})")


def _logger_config(env: GcpEnvironment | LocalEnvironment, recipe: Recipe, record: RunRecord) -> dict[str, Any]:
    """The recipe's `logger` section as the job composed it, from rlops's copy of the image's configs; without a
    copy, the run's own settings (`logger.*` keys) alone."""
    tag = jobs.data_tag(env)
    if tag is not None and recipe.config:
        composed = nemo_rl.compose(tag, recipe.config, nemo_rl.assignments(recipe, record.settings,
                                                                           record.checkpoint_dir))
        if composed.config is not None:
            return composed.config.get("logger") or {}
    logger: dict[str, Any] = {}
    for key, value in record.settings.items():
        if key.startswith("logger."):
            *parents, leaf = key.removeprefix("logger.").split(".")
            place = logger
            for parent in parents:
                place = place.setdefault(parent, {})
            place[leaf] = value
    return logger


def _cost(site: Site, run: str) -> str:
    """The run's line of `rlops cost`, and the command that shows the rest."""
    (row,) = environment_cost.gather(site, run=run)["runs"]
    hours, usd = row["gpu_hours"], row["usd"]
    return (f"{hours['used']:.2f} GPU-hours running, {hours['waking']:.2f} waking for its pool, "
            f"${usd['used'] + usd['waking']:,.2f} at list prices; {row['steps_redone']} steps done again after "
            f"resumes; `rlops cost {site.name} --run {run}` for the pool's idle and reaped time")


def publish(site: Site, record: RunRecord) -> str:
    """Draws the report and uploads it beside the run record; the object name of its markdown page."""
    layout = site.records.layout
    with tempfile.TemporaryDirectory(prefix="rlops-report-") as scratch:
        drawn = write(site, record, Path(scratch))
        for path in [drawn.markdown, *drawn.plots]:
            site.bucket.blob(layout.report(record.run, path.name)).upload_from_filename(
                str(path), content_type=CONTENT_TYPES[path.suffix])
    return layout.report(record.run, drawn.markdown.name)
