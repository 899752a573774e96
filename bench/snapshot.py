"""Manifest throughput on a generated checkpoint tree, against `cat` of the same files and `sha256sum`, hot cache.

The tree is a NeMo RL step: SHARDS weight shards of SHARD_MB each plus small files (config,
training info, tokenizer). Every figure is the best of ROUNDS runs after one warm-up read, in one
run of this script; throughput = total bytes / wall time.

Usage: python bench/snapshot.py [SHARDS] [SHARD_MB] [ROUNDS]   (default 16 256 3: 4 GiB of shards)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlops.checkpoints import manifest


def generate(root: Path, shards: int, shard_mb: int) -> list[Path]:
    step = root / "bench-run" / "step_100"
    weights = step / "policy" / "weights" / "model"
    weights.mkdir(parents=True)
    block = os.urandom(4 * 1024 * 1024)
    for i in range(shards):
        with open(weights / f"shard-{i:05d}-of-{shards:05d}.safetensors", "wb") as out:
            for j in range(shard_mb // 4):
                out.write(block[j % 7:] + block[:j % 7])  # not one repeated block: a realistic read
    (step / "policy" / "tokenizer").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (step / "policy" / "tokenizer" / name).write_text(json.dumps({"name": name, "pad": "x" * 2000}))
    (step / "training_info.json").write_text(json.dumps({"total_steps": 100, "val:accuracy": 0.5}))
    (step / "config.yaml").write_text("grpo:\n  max_num_steps: 100\n" * 50)
    (step / "train_dataloader.pt").write_bytes(os.urandom(64 * 1024))
    return [step] + sorted(p for p in step.rglob("*") if p.is_file())


def best(rounds: int, work) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    shards, shard_mb, rounds = (int(a) for a in (sys.argv[1:] + ["16", "256", "3"][len(sys.argv) - 1:])[:3])
    root = Path(tempfile.mkdtemp(prefix="rlops-bench-snapshot-"))
    try:
        step, *files = generate(root, shards, shard_mb)
        total = sum(p.stat().st_size for p in files)
        names = [str(p) for p in files]
        subprocess.run(["cat", *names], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        cat = best(rounds, lambda: subprocess.run(["cat", *names], stdout=subprocess.DEVNULL, check=True))
        sha = best(rounds, lambda: subprocess.run(["sha256sum", *names], stdout=subprocess.DEVNULL, check=True))
        built = best(rounds, lambda: manifest.build(step))
    finally:
        shutil.rmtree(root)
    gib = total / 2**30
    print(f"{len(files)} files, {gib:.2f} GiB, {os.cpu_count()} cores, hot cache")
    for name, seconds in (("cat", cat), ("sha256sum", sha), ("rlops manifest", built)):
        print(f"{name:>15}: {seconds:6.2f} s  {gib / seconds:6.2f} GiB/s")
    print(f"manifest-vs-cat: {cat / built:.2f} (goal >= 0.8)")
    print(f"manifest-vs-sha256sum: {sha / built:.2f} (goal >= 1)")


if __name__ == "__main__":
    main()
