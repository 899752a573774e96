"""`rlops checkpoints export`: a verified checkpoint copied to Cloud Storage and verified there, object by object.

Locally the checkpoint is read from the environment's Lustre directory and uploaded with the real
storage client (to the state bucket's emulator by default). On GKE the copy is the Lustre API's
`exportData`, which is not built yet.
"""

import json
import time
from pathlib import Path

from rlops.checkpoints import export, layout, manifest
from rlops.errors import Failure
from rlops.logs import emit
from rlops.runs import snapshot


def export_checkpoint(site, run: str, step: int | None, destination: tuple[object, str] | None) -> dict:
    """Export step `step` of `run` (default: its newest with a manifest) to (bucket, prefix) (default: the state
    bucket's `runs/RUN/exports`); what was done, once the export verified."""
    if not site.checkpoints_here:
        raise Failure("export from a GKE environment's Lustre needs the Lustre API's exportData, which rlops does "
                      "not drive yet; only local environments export for now")
    record, _ = site.records.get(run)
    if record is None:
        raise Failure(f"no run {run} in {site.name}")
    known = snapshot.known_steps(site, run)
    if not known:
        raise Failure(f"run {run} has no checkpoint with a manifest yet (run `rlops snapshot {site.name}` first)")
    step = max(known) if step is None else step
    if step not in known:
        raise Failure(f"run {run} has no manifest for step {step}; it has {sorted(known)}")
    content = export.checked(_read(known[step]))
    checkpoint = {c.step: c for c in layout.complete(Path(record.checkpoint_dir))}.get(step)
    if checkpoint is None:
        raise Failure(f"step {step} of {run} is no longer on Lustre; nothing to export")
    before = manifest.verify(checkpoint.path, content)
    if any(before.values()):
        raise Failure(f"step {step} of {run} does not match its manifest ({export.said(before)}); not exported")
    bucket, prefix = destination or (site.bucket, site.records.layout.exports(run))
    objects = export.upload(bucket, prefix, checkpoint.path, content)
    after = export.verify(bucket, prefix, content)
    if any(after.values()):
        raise Failure(f"the export of step {step} does not match its manifest: {export.said(after)}")
    done = {"destination": f"gs://{bucket.name}/{export.objects_prefix(prefix, step)}", "objects": objects,
            "bytes": content["total_bytes"], "verified_at": time.time()}
    if not site.records.update(run, lambda record: record.exports.update({str(step): done})):
        emit("WARNING", "export verified but not linked from the run record", run=run, step=step)
    site.publish({"type": "checkpoint-exported", "environment": site.name, "run": run, "step": step, **done})
    return {"step": step, **done}


def _read(blob) -> dict:
    return json.loads(blob.download_as_bytes())

