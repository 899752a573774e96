"""A run's report: gathered from what rlops already keeps (the run record, each attempt's per-step series,
the checkpoint manifests, the GPU pool's state) and drawn by `runs.report`; kept in the state bucket
beside the run record (`runs/RUN/report/`) when the run ends, or written to a folder on request.
"""

import tempfile
from pathlib import Path

from rlops.runs import report
from rlops.state.run_records import RunRecord

CONTENT_TYPES = {".md": "text/markdown; charset=utf-8", ".png": "image/png"}


def _checkpoints(site, run: str) -> list[dict]:
    from rlops.runs import snapshot

    rows = snapshot.listing(site, run) or []
    return [{"step": row["step"], "bytes": row["total_bytes"],
             "verified": True if row["verified"] == "yes" else False if row["verified"].startswith("NO") else None}
            for row in rows]


def write(site, record: RunRecord, out_dir: Path) -> report.Report:
    run = record.run
    series = {a.attempt: site.records.metrics(run, a.attempt) or {"steps": [], "saves": []} for a in record.attempts}
    return report.write(out_dir, record.to_json(), series, _checkpoints(site, run), site.pool.read()[0].to_json(),
                        _cost(site, run))


def _cost(site, run: str) -> str:
    """The run's line of `rlops cost`, and the command that shows the rest."""
    from rlops.runs import costing

    (row,) = costing.gather(site, run=run)["runs"]
    hours, usd = row["gpu_hours"], row["usd"]
    return (f"{hours['used']:.2f} GPU-hours running, {hours['waking']:.2f} waking for its pool, "
            f"${usd['used'] + usd['waking']:,.2f} at list prices; {row['steps_redone']} steps done again after "
            f"resumes; `rlops cost {site.name} --run {run}` for the pool's idle and reaped time")


def publish(site, record: RunRecord) -> str:
    """Draws the report and uploads it beside the run record; the object name of its markdown page."""
    layout = site.records.layout
    with tempfile.TemporaryDirectory(prefix="rlops-report-") as scratch:
        drawn = write(site, record, Path(scratch))
        for path in [drawn.markdown, *drawn.plots]:
            site.bucket.blob(layout.report(record.run, path.name)).upload_from_filename(
                str(path), content_type=CONTENT_TYPES[path.suffix])
    return layout.report(record.run, drawn.markdown.name)
