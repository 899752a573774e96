"""A checkpoint copied to Cloud Storage, and proven identical to its manifest object by object.

Managed Lustre is one zone; an export is the copy that survives it. The destination holds
`DEST/step-N/<the checkpoint's files>` and `DEST/step-N.manifest.json`. Cloud Storage keeps a crc32c of
every object, the same checksum the manifest holds per file (as base64 of the big-endian value), so
an export is verified by listing the objects' metadata alone: every file present with its size and
crc32c, nothing more.
"""

import json
import shutil
from pathlib import Path

from google.cloud import storage

from rlops import paths
from rlops.checkpoints import manifest
from rlops.permissions import calls


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


@calls("storage.objects.insert")
def upload(bucket: storage.Bucket, destination: str, checkpoint: Path, content: dict) -> None:
    """Every file of the manifest; the client checks each upload's crc32c."""
    prefix = objects_prefix(destination, content["step"])
    sources = [(entry["path"], _inside(checkpoint, entry["path"])) for entry in content["files"]]
    for name, source in sources:
        bucket.blob(prefix + name).upload_from_filename(str(source), checksum="crc32c")


@calls("storage.objects.insert")
def upload_manifest(bucket: storage.Bucket, destination: str, content: dict) -> None:
    bucket.blob(manifest_object(destination, content["step"])).upload_from_string(
        json.dumps(content, indent=1, sort_keys=True), content_type="application/json")


@calls("storage.objects.get")
def download(bucket: storage.Bucket, destination: str, content: dict, target: Path) -> None:
    """The export of `content`'s step into the directory `target`, which appears only once every file is there and
    matches the manifest: the files land in `target`'s sibling `.importing-NAME` first, renamed into place at
    the end, so that no reader takes a half-copied checkpoint for a complete one."""
    if target.exists():
        raise manifest.ManifestError(f"{target} exists already; import into a run that does not have that step")
    manifest.confined(content, f"the manifest of step {content.get('step')}")  # all of it, before a byte is written
    staging = target.with_name(f".importing-{target.name}")
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted import left
    staging.mkdir(parents=True)
    prefix = objects_prefix(destination, content["step"])
    for entry in content["files"]:
        path = _inside(staging, entry["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        bucket.blob(prefix + entry["path"]).download_to_filename(str(path), checksum="crc32c")
    found = manifest.verify(staging, content)
    if any(found.values()):
        raise manifest.ManifestError(f"the copy in {staging} does not match the manifest: {said(found)}")
    staging.rename(target)


@calls("storage.objects.list")
def verify(bucket: storage.Bucket, destination: str, content: dict) -> dict[str, list[str]]:
    """The export of `content`'s step under `destination`, against it: one listing, no download."""
    prefix = objects_prefix(destination, content["step"])
    listed = {blob.name[len(prefix):]: (blob.size, blob.crc32c) for blob in bucket.list_blobs(prefix=prefix)}
    return differences(listed, content)


def said(found: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(v)} {k} ({', '.join(v[:3])})" for k, v in found.items() if v)


def checked(content: dict) -> dict:
    """A manifest read back from the bucket, refused when its digest does not match (it was altered) or when a
    file entry would leave the checkpoint (a digest proves nothing about that: anyone can recompute it)."""
    if not manifest.intact(content):
        raise manifest.ManifestError(f"the manifest of step {content.get('step')} was altered: its digest does not "
                                     "match")
    return manifest.confined(content, f"the manifest of step {content.get('step')}")


def _inside(root: Path, name: str) -> Path:
    try:
        return paths.within(root, name, "manifest entry")
    except paths.OutsideDirectory as error:
        raise manifest.ManifestError(str(error)) from None
