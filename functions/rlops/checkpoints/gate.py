"""The first thing every attempt of a run does, on the node that mounts its checkpoints: choose the resume point.

    python -m rlops.checkpoints.gate --run-dir DIR [--manifests MODULE] [--unverified] [--keep N]
        [--keep-bytes B] [--data PLAN] [--hold S] [--wait-for RESOURCE=COUNT --wait-seconds S] && <the workload>

Each attempt's Ray job runs this before the workload (`runs.jobs` puts it in the entrypoint), on the
node where the run directory is: locally the Ray worker's disk, on GKE the head pod, which mounts
/lustre and needs no GPU. So the checkpoints are verified where they are and at the moment the
workload is about to read them, with no second job to wait for and no state between the two. The
run's manifests come with the job as the py_module MODULE (a `manifests.json` inside), since the
cluster need not reach the state bucket. What does not verify is moved aside (`resume.prepare`);
the choice is printed as one `[rlops-resume] {...}` line the watcher reads from the job's output, with the
time the command began (when the attempt started running, for `rlops cost`).

`--unverified` (the recipe's `resume_from: newest`) still sets aside torn checkpoints but takes the
newest complete one without hashing it, for checkpoints too large to hash at every start. `--keep` and
`--keep-bytes` (the recipe's `set_aside` limit) bound what set-aside/ holds: the oldest beyond are deleted,
and the line says which and what is kept.

An attempt whose driver runs on the head (NeMo RL's) waits for its GPUs (`--wait-for`, `_capacity`) before the
workload, first backing off `--hold` seconds when it follows an attempt that lacked them (`runs.policy.backoff`).

`--data` (a nemo-rl recipe's, `spec.nemo_rl_reward.for_job`) comes first, before the wait for GPUs: the recipe's
data steps write their files (on GKE into Lustre, from the head), then the real data's own reference answers are
scored as NeMo RL scores a model's (`rlops train --check-data` on a local file does the same). One `[rlops-data]`
line says what was written and each mean; gold answers that score below the bar end the attempt in seconds with a
`[rlops-data-refused]` line and DATA_REFUSED, which the watcher takes as final (the recipe is wrong, not the cluster).
"""

import argparse
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

from rlops.checkpoints import manifest, resume
from rlops.spec import nemo_rl_reward as reward

PREFIX = "[rlops-resume] "
WAITING = "[rlops-wait] "
CAPACITY_MISSING = 75  # EX_TEMPFAIL: the attempt never started its workload; the watcher retries it
DATA = "[rlops-data] "
REFUSED = "[rlops-data-refused] "
DATA_REFUSED = 65  # EX_DATAERR: the recipe's gold answers do not earn its reward; retrying cannot help
MODULE = "rlops_resume_manifests"
FILE = "manifests.json"


def stage(folder: Path, manifests: dict[int, dict]) -> Path:
    """The py_module that carries `manifests` (by step) to the job; its path."""
    module = folder / MODULE
    module.mkdir(parents=True, exist_ok=True)
    (module / "__init__.py").write_text('"""A run\'s checkpoint manifests, shipped with its attempt by rlops."""\n')
    (module / FILE).write_text(json.dumps({str(step): content for step, content in manifests.items()}))
    return module


def _shipped(module: str) -> dict[int, dict]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return {}  # shipped nothing: no checkpoint can verify, so none is resumed from
    read = json.loads((Path(spec.submodule_search_locations[0]) / FILE).read_text())
    return {int(step): content for step, content in read.items() if manifest.intact(content)}


def _capacity(resource: str, needed: float, seconds: float, every: float = 15.0) -> bool:
    """Wait until the Ray cluster has `needed` of `resource`, saying how much it has every `every` seconds, and
    until when it waits (the watcher shows the last line as the run's waiting cause).

    NeMo RL's driver runs on the CPU-only head and checks the GPUs for about a minute (RayVirtualCluster:
    NRL_VIRTUAL_CLUSTER_MAX_RETRIES, 6 tries, 2**i seconds), then fails for good; GPU nodes woken or replaced after
    a preemption take minutes (boot, the image, gIB, Ray's join). So the attempt waits here first, within the
    recipe's bound, and an attempt that did not get them ends before its workload, which the watcher resubmits as a
    capacity failure (`gave_up`), never as the recipe's own failure."""
    import ray  # noqa: PLC0415 cold start: the watcher imports this module for its constants, and needs no Ray

    ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
    try:
        began, until = time.monotonic(), time.time() + seconds
        while True:
            have = ray.cluster_resources().get(resource, 0.0)
            waited = time.monotonic() - began
            done = have >= needed
            said = {"resource": resource, "have": have, "need": needed, "waited": round(waited), "until": until}
            if done or waited >= seconds:
                print(WAITING + json.dumps({**said, "got": done}), flush=True)
                return done
            print(WAITING + json.dumps(said), flush=True)
            time.sleep(min(every, seconds - waited))
    finally:
        ray.shutdown()


def waits(output: str) -> dict | None:
    """The gate's last wait line in a job's output: {resource, have, need, waited, until[, got]}, or {backoff,
    until} while it backs off; None when it printed none."""
    lines = [line for line in output.splitlines() if line.startswith(WAITING)]
    return json.loads(lines[-1][len(WAITING):]) if lines else None


def gave_up(output: str) -> bool:
    """Whether the gate ended its wait without the GPUs (its output's last lines, as Ray's failure message has them)."""
    last = waits(output)
    return last is not None and last.get("got") is False


def _lines(source: str) -> Iterator[str]:
    """A data file's lines, from an https:// URL or a path."""
    if source.startswith("https://"):
        with urlopen(source, timeout=60) as response:  # https only (the spec's pattern)
            for line in response:
                yield line.decode()
    else:
        with open(source, encoding="utf-8") as lines:
            yield from lines


def _write_rows(path: Path, rows: list[dict]) -> None:
    """Written whole, then renamed into place: a run reading the file sees the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    os.replace(partial, path)


def _data(plan: dict) -> bool:
    """The recipe's data steps, then the check of its reward on the real data; False when the gold answers do not
    earn it."""
    published: dict[str, list[dict]] = {}
    said: dict = {"steps": [], "checks": []}
    refusals = []
    for step in plan["steps"]:
        try:
            rows = published.setdefault(step["source"], reward.rows_of(_lines(step["source"])))
        except ValueError as error:  # rows NeMo RL could not load either: no retry mends them
            refusals.append({"source": step["source"], "reason": f"{step['source']}: {error}"})
            continue
        _write_rows(Path(step["path"]), [reward.TRANSFORMS[step["transform"]](row) for row in rows])
        said["steps"].append({"path": step["path"], "rows": len(rows), "transform": step["transform"]})
    if plan["unchecked"]:
        said["unchecked"] = plan["unchecked"]
    check = plan["check"] and reward.Check.from_json(plan["check"])
    for source in check.sources if check and not refusals else ():
        if source.published not in published and not reward.readable(source.published):
            said["checks"].append({"role": source.role, "source": source.published,
                                   "unchecked": "not JSON Lines (a Hugging Face dataset id?)"})
            continue
        try:
            rows = published[source.published][:plan["samples"]] if source.published in published else \
                reward.rows_of(_lines(source.published), plan["samples"])
        except ValueError as error:
            refusals.append({"role": source.role, "source": source.published,
                             "reason": f"{source.published}: {error}"})
            continue
        verdict = reward.score(check, source, rows)
        said["checks"].append({"role": source.role, "source": source.published, "mean": round(verdict.mean, 4),
                               "count": verdict.count, "earnable": verdict.earnable(plan["minimum"])})
        if not verdict.earnable(plan["minimum"]):
            example = dataclasses.asdict(verdict.example()) if verdict.scored else None
            refusals.append({"role": source.role, "mean": round(verdict.mean, 4), "count": verdict.count,
                             "reason": verdict.reason(plan["minimum"]), "example": example})
    print(DATA + json.dumps(said), flush=True)
    for refusal in refusals:  # last, so that Ray's failure message (the output's tail) carries them
        print(REFUSED + json.dumps(refusal, default=str), flush=True)
    return not refusals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlops.checkpoints.gate")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--manifests", default=MODULE, metavar="MODULE")
    parser.add_argument("--unverified", action="store_true")
    parser.add_argument("--keep", type=int, default=5, metavar="N", help="set-aside checkpoints kept, the newest")
    parser.add_argument("--keep-bytes", type=int, metavar="B", help="and at most this many bytes of them")
    parser.add_argument("--wait-for", metavar="RESOURCE=COUNT",
                        help="first wait until the Ray cluster has this much of a resource (GPU=16)")
    parser.add_argument("--wait-seconds", type=float, default=1800.0, metavar="S")
    parser.add_argument("--hold", type=float, default=0.0, metavar="S",
                        help="back off this long before the wait (the attempt follows one that lacked its GPUs)")
    parser.add_argument("--data", type=json.loads, metavar="PLAN", help="data steps and the reward check (JSON)")
    args = parser.parse_args(argv)
    started = time.time()  # the attempt's command began here: its running time (rlops cost) counts from now
    if args.data and not _data(args.data):
        return DATA_REFUSED
    if args.hold:
        print(WAITING + json.dumps({"backoff": args.hold, "until": time.time() + args.hold}), flush=True)
        time.sleep(args.hold)
    if args.wait_for:
        resource, _, count = args.wait_for.partition("=")
        if not _capacity(resource, float(count), args.wait_seconds):
            return CAPACITY_MISSING
    if args.unverified:
        point = resume.prepare(args.run_dir, {}, verify=False)
    else:
        point = resume.prepare(args.run_dir, _shipped(args.manifests))
    pruned, kept = resume.prune(args.run_dir, args.keep, args.keep_bytes)
    point = dataclasses.replace(point, pruned=pruned, kept=kept)
    print(PREFIX + json.dumps({**point.to_json(), "verified": not args.unverified, "at": started}, sort_keys=True),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
