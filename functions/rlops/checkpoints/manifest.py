"""A checkpoint's manifest: every file with its size, crc32c and mtime, the run's metrics, and a digest of it all.

crc32c is written as Cloud Storage writes it (base64 of the big-endian 4 bytes), so a manifest can
be checked against `gsutil hash -c` or an object's metadata.

Files are read with `readinto` into a 1 MiB buffer each worker thread reuses, and hashed by the C
library google-crc32c ships (libcrc32c, its public `crc32c_extend`) through ctypes, which releases
the GIL: reading and hashing of several files proceed on several cores at once. (google-crc32c's
Python `extend` takes only `bytes` and holds the GIL: a copy per chunk, one core.) Where the wheel
has no such library, the chunks go to the Python `extend`. A Ray job on a cluster whose image has
no google-crc32c finds the library in the `rlops_crc32c` module the snapshot tick ships with it
(`native_module`). A path that leaves the checkpoint (a symlink out of it, `..` in a manifest) is
refused.
"""

import base64
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

try:
    import google_crc32c
except ImportError:  # a cluster image without it: the library shipped with the job (rlops_crc32c) does the work
    google_crc32c = None

from rlops import paths
from rlops.checkpoints.layout import METRICS_FILE, identify, incomplete_reason

FORMAT = "rlops.checkpoint-manifest/1"
CHUNK = 1024 * 1024
# Below this in all, files are hashed in the calling thread: starting a pool's threads costs more than hashing a
# few MiB (a small recipe's checkpoint, a tick's every few seconds on one).
SMALL = 8 * CHUNK


class ManifestError(Exception):
    """A checkpoint or manifest rlops will not read: the path and why."""


def _files(root: Path) -> list[str]:
    """Every regular file under `root`, as a POSIX path relative to it; symlinks may not lead outside."""
    resolved_root = root.resolve()
    found = []
    for directory, subdirectories, names in os.walk(root, followlinks=False):
        for name in subdirectories + names:
            path = Path(directory) / name
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(resolved_root):
                    raise ManifestError(f"{path}: a symlink to {target}, outside the checkpoint {root}")
                if target.is_dir():
                    raise ManifestError(f"{path}: a symlink to a directory; checkpoints are read without them")
        for name in names:
            path = Path(directory) / name
            if path.is_file():
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


SHIPPED_MODULE = "rlops_crc32c"


def _libraries() -> list[Path]:
    """libcrc32c where google-crc32c's wheel keeps it, then in the shipped module."""
    found = []
    if google_crc32c is not None:
        found += sorted((Path(google_crc32c.__file__).parent.parent / "google_crc32c.libs").glob("libcrc32c*.so*"))
    shipped = importlib.util.find_spec(SHIPPED_MODULE)
    for folder in (shipped.submodule_search_locations or []) if shipped else []:
        found += sorted(Path(folder).glob("libcrc32c*.so*"))
    return found


@functools.cache
def _native_extend():
    """libcrc32c's `uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t count)`, or None."""
    libraries = _libraries()
    if not libraries:
        if google_crc32c is None:
            raise ManifestError("no crc32c implementation here: install google-crc32c (or ship rlops_crc32c)")
        return None
    extend = ctypes.CDLL(str(libraries[0])).crc32c_extend
    extend.argtypes, extend.restype = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_uint32
    return extend


def native_module(folder: Path) -> Path | None:
    """Write the `rlops_crc32c` module (libcrc32c and an empty __init__) under `folder`, for a Ray job's
    py_modules; None where this machine has no libcrc32c to give."""
    libraries = _libraries()
    if not libraries:
        return None
    module = folder / SHIPPED_MODULE
    module.mkdir(parents=True, exist_ok=True)
    (module / "__init__.py").write_text('"""libcrc32c for rlops.checkpoints.manifest, shipped with a Ray job."""\n')
    shutil.copy2(libraries[0], module / libraries[0].name)
    return module


def _hash(path: Path, buffer: bytearray) -> tuple[int, str]:
    extend = _native_extend()
    address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer)) if extend else None
    view = memoryview(buffer)
    checksum = size = 0
    with open(path, "rb", buffering=0) as stream:
        while count := stream.readinto(buffer):
            if extend is not None:
                checksum = extend(checksum, address, count)
            else:
                assert google_crc32c is not None  # `_native_extend` raised otherwise
                checksum = google_crc32c.extend(checksum, bytes(view[:count]))
            size += count
    return size, base64.b64encode(struct.pack(">I", checksum)).decode()


def hash_files(root: Path, relative: list[str], workers: int | None = None) -> dict[str, dict]:
    """{path: {size, crc32c, mtime}} for the files, several at once (a few small ones in this thread), each worker
    with its own reused buffer."""
    local = threading.local()

    def one(name: str) -> tuple[str, dict]:
        if not hasattr(local, "buffer"):
            local.buffer = bytearray(CHUNK)
        path = root / name
        mtime = path.stat().st_mtime
        size, crc = _hash(path, local.buffer)
        return name, {"path": name, "size": size, "crc32c": crc,
                      "mtime": datetime.fromtimestamp(mtime, UTC).isoformat()}

    workers = min(workers or min(8, (os.cpu_count() or 2) * 2), len(relative))
    if workers <= 1 or sum((root / name).stat().st_size for name in relative) < SMALL:
        return dict(map(one, relative))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, relative))


def digest(manifest: dict) -> str:
    body = {key: value for key, value in manifest.items() if key != "digest"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def intact(manifest: dict) -> bool:
    """Whether the manifest is as it was written: its digest still matches (an altered one proves nothing)."""
    return manifest.get("digest") == digest(manifest)


def build(path: Path, run: str | None = None) -> dict:
    """The manifest of the complete checkpoint at `path`."""
    checkpoint = identify(path)  # never through a symlink
    if checkpoint is None:
        raise ManifestError(f"{path}: {incomplete_reason(path)}")
    files = hash_files(path, _files(path))
    manifest = {
        "format": FORMAT, "layout": checkpoint.layout, "run": run or path.resolve().parent.name,
        "step": checkpoint.step, "save": save_id(path), "files": [files[name] for name in sorted(files)],
        "total_bytes": sum(entry["size"] for entry in files.values()),
        "metrics": _metrics(path / METRICS_FILE[checkpoint.layout], checkpoint.layout),
    }
    manifest["digest"] = digest(manifest)
    return manifest


def save_id(path: Path) -> str:
    """Which save of its step the complete checkpoint at `path` is, from two stats and no hashing: NeMo RL and
    the Trainer save a step again after resuming from an older checkpoint, into a new directory (a new inode)
    with a new metrics file (a new mtime). The manifest of the earlier save does not describe the later one."""
    checkpoint = identify(path)
    if checkpoint is None:
        raise ManifestError(f"{path}: {incomplete_reason(path)}")
    return f"{path.stat().st_ino:x}-{(path / METRICS_FILE[checkpoint.layout]).stat().st_mtime_ns:x}"


def _metrics(path: Path, layout: str) -> dict:
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ManifestError(f"{path}: not readable JSON ({error})") from None
    if layout == "nemo-rl":
        return content
    history = [entry for entry in content.get("log_history", []) if "step" in entry]
    last = history[-1] if history else {}
    return {"global_step": content.get("global_step"), **{k: v for k, v in last.items() if k != "step"}}


def load(path: Path) -> dict:
    """A manifest file, checked: its format, its digest, and no path that could leave the checkpoint."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ManifestError(f"{path}: not a readable manifest ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{path}: format: expected {FORMAT!r}")
    if manifest.get("digest") != digest(manifest):
        raise ManifestError(f"{path}: digest: the manifest was changed after it was written")
    return confined(manifest, str(path))


def confined(manifest: dict, where: str) -> dict:
    """The manifest, refused when a file entry names a path that could leave the checkpoint: its digest is a
    checksum anyone can recompute, so it proves the paths are as written, not that they are safe."""
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(entry, dict) for entry in files):
        raise ManifestError(f"{where}: files: expected a list of entries")
    for entry in files:
        why = paths.refusal(entry.get("path"))
        if why:
            raise ManifestError(f"{where}: files: {entry.get('path')!r} {why}: it would leave the checkpoint; "
                                "nothing was read or written")
    return manifest


def verify(path: Path, manifest: dict) -> dict[str, list[str]]:
    """{"missing", "extra", "changed"}: how the checkpoint at `path` differs from `manifest` (all empty: identical)."""
    expected = {entry["path"]: entry for entry in manifest["files"]}
    present = _files(path)
    actual = hash_files(path, [name for name in present if name in expected])
    changed = []
    for name, entry in sorted(actual.items()):
        if entry["size"] != expected[name]["size"]:
            changed.append(f"{name}: {expected[name]['size']} bytes in the manifest, {entry['size']} now")
        elif entry["crc32c"] != expected[name]["crc32c"]:
            changed.append(f"{name}: crc32c {expected[name]['crc32c']} in the manifest, {entry['crc32c']} now")
    return {"missing": sorted(set(expected) - set(present)), "extra": sorted(set(present) - set(expected)),
            "changed": changed}
