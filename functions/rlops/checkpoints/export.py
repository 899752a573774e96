"""A checkpoint copied to Cloud Storage, and proven identical to its manifest object by object.

Managed Lustre is one zone; an export is the copy that survives it. The destination holds
`DEST/step-N/<the checkpoint's files>` and `DEST/step-N.manifest.json`. Cloud Storage keeps a crc32c of
every object, the same checksum the manifest holds per file (as base64 of the big-endian value), so
an export is verified by listing the objects' metadata alone: every file present with its size and
crc32c, nothing more.
"""

import json
from pathlib import Path

from rlops.checkpoints import manifest


def objects_prefix(destination: str, step: int) -> str:
    return f"{destination.rstrip('/')}/step-{step}/"


def manifest_object(destination: str, step: int) -> str:
    return f"{destination.rstrip('/')}/step-{step}.manifest.json"


def differences(listed: dict[str, tuple[int, str]], content: dict) -> dict[str, list[str]]:
    """{"missing", "extra", "changed"} between the objects listed under a step's prefix ({relative path: (size,
    crc32c)}) and the manifest (all empty: the export is the checkpoint)."""
    expected = {entry["path"]: (entry["size"], entry["crc32c"]) for entry in content["files"]}
    return {"missing": sorted(set(expected) - set(listed)),
            "extra": sorted(set(listed) - set(expected)),
            "changed": sorted(name for name in set(expected) & set(listed) if listed[name] != expected[name])}


def upload(bucket, destination: str, checkpoint: Path, content: dict) -> int:
    """Every file of the manifest, then the manifest; the client checks each upload's crc32c. The object count."""
    prefix = objects_prefix(destination, content["step"])
    for entry in content["files"]:
        bucket.blob(prefix + entry["path"]).upload_from_filename(str(checkpoint / entry["path"]), checksum="crc32c")
    bucket.blob(manifest_object(destination, content["step"])).upload_from_string(
        json.dumps(content, indent=1, sort_keys=True), content_type="application/json")
    return len(content["files"])


def verify(bucket, destination: str, content: dict) -> dict[str, list[str]]:
    """The export of `content`'s step under `destination`, against it: one listing, no download."""
    prefix = objects_prefix(destination, content["step"])
    listed = {blob.name[len(prefix):]: (blob.size, blob.crc32c) for blob in bucket.list_blobs(prefix=prefix)}
    return differences(listed, content)


def said(found: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(v)} {k} ({', '.join(v[:3])})" for k, v in found.items() if v)


def checked(content: dict) -> dict:
    """A manifest read back from the bucket, refused when its digest does not match (it was altered)."""
    if not manifest.intact(content):
        raise manifest.ManifestError(f"the manifest of step {content.get('step')} was altered: its digest does not "
                                     "match")
    return content
