"""Export verification of a 1,000-file checkpoint: by listing its objects' metadata, against downloading them.

`rlops checkpoints export` proves an export identical to its checkpoint from Cloud Storage's own
size and crc32c of every object (one paged listing). The baseline is what a tool without those
checksums must do: download every object and hash it. Both against fake-gcs-server (the real
google-cloud-storage client over HTTP on 127.0.0.1), in one run of this script; each figure is
the best of ROUNDS.

Usage: python bench/export.py [FILES] [KIB_PER_FILE] [ROUNDS]   (default 1000 64 3)
"""

import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import google_crc32c

from rlops.checkpoints import export, manifest
from rlops.endpoints import Endpoints
from rlops.state.bucket import client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fakes.gcs import fake_gcs  # noqa: E402


def generate(root: Path, files: int, kib: int) -> Path:
    """A TRL checkpoint directory of `files` files (trainer_state.json among them)."""
    step = root / "bench-run" / "checkpoint-100"
    (step / "shards").mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 100, "log_history": []}))
    for i in range(files - 1):
        (step / "shards" / f"part-{i:05d}.bin").write_bytes(os.urandom(kib * 1024))
    return step


def by_download(bucket, prefix: str, content: dict) -> bool:
    """The baseline: every object fetched and its crc32c computed here."""
    expected = {entry["path"]: entry["crc32c"] for entry in content["files"]}
    for blob in bucket.list_blobs(prefix=prefix):
        crc = google_crc32c.Checksum(blob.download_as_bytes()).digest()
        if base64.b64encode(crc).decode() != expected.get(blob.name[len(prefix):]):
            return False
    return True


def best(rounds: int, work) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        assert work()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    given = [int(a) for a in sys.argv[1:]]
    files, kib, rounds = (given + [1000, 64, 3][len(given):])[:3]
    with tempfile.TemporaryDirectory(prefix="rlops-bench-export-") as scratch, fake_gcs():
        checkpoint = generate(Path(scratch), files, kib)
        content = manifest.build(checkpoint)
        bucket = client("bench", Endpoints.from_environment()).create_bucket("rlops-bench-export")
        began = time.perf_counter()
        export.upload(bucket, "exports/bench-run", checkpoint, content)
        uploaded = time.perf_counter() - began
        prefix = export.objects_prefix("exports/bench-run", content["step"])
        listing = best(rounds, lambda: not any(export.verify(bucket, "exports/bench-run", content).values()))
        download = best(rounds, lambda: by_download(bucket, prefix, content))
    total_mib = content["total_bytes"] / 2**20
    print(f"{files} files, {total_mib:.0f} MiB: upload {uploaded:.1f} s; verify by listing {listing:.2f} s "
          f"({files / listing:.0f} objects/s); by download and hashing {download:.2f} s "
          f"({files / download:.0f} objects/s)")
    print(f"export-verify-objects-per-second: {files / listing:.0f} (goal >= 1000)")
    print(f"verify-by-listing-vs-download: {download / listing:.1f} (goal >= 5)")


if __name__ == "__main__":
    main()
