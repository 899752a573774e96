"""The snapshot job: manifests of a run's new complete checkpoints, computed where the checkpoints are.

    python -m rlops.checkpoints.scan --run NAME=DIR[:STEP@SAVE,...] ...

On GKE the `snapshot` function submits this as a small CPU-only Ray job on the environment's
cluster (with the rlops package as a py_module), because only the cluster mounts /lustre; each
manifest comes back as one `[rlops-manifest] {...}` line of the job's output, which the next tick
writes to the state bucket.
"""

import argparse
import json
import sys
from pathlib import Path

from rlops.checkpoints import layout, manifest

PREFIX = "[rlops-manifest] "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlops.checkpoints.scan")
    parser.add_argument("--run", action="append", default=[], metavar="NAME=DIR[:STEP@SAVE,...]")
    args = parser.parse_args(argv)
    for item in args.run:
        name, _, rest = item.partition("=")
        directory, _, known = rest.partition(":")
        # The steps with a manifest, and which save it describes (empty: not told; taken as this one).
        saves = {int(step): save for step, _, save in (entry.partition("@") for entry in known.split(",") if entry)}
        for checkpoint in layout.complete(Path(directory)):
            try:
                if checkpoint.step in saves and saves[checkpoint.step] in ("", manifest.save_id(checkpoint.path)):
                    continue
                print(PREFIX + json.dumps(manifest.build(checkpoint.path, name), sort_keys=True), flush=True)
            except (manifest.ManifestError, OSError) as error:
                print(f"[rlops] {name} step {checkpoint.step} not snapshotted: {error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
