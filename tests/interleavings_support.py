"""The worlds the interleaving tests run the control plane in (tests/fakes/interleave.py's scheduler, bucket and
pool; the real reaper, watcher, lock and pool state), and the seeded schedules `explore` and
`explore_control_plane` that the tests and bench/interleavings.py run by the thousand."""

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

from conftest import ENVIRONMENTS
from fakes.interleave import (
    MemoryBucket,
    Scheduler,
    SimulatedPool,
    seeded,
    simulated_clock,
    simulated_threading,
)
from fakes.ray import SimulatedRay
from rlops.endpoints import Endpoints
from rlops.reaper import reap
from rlops.runs import watch
from rlops.sites import Site
from rlops.spec.load import load_text
from rlops.state import lock as lock_module
from rlops.state import run_records
from rlops.state.layout import Layout
from rlops.state.lock import LockHeld
from rlops.state.pool import PoolStatus

ENV = load_text((ENVIRONMENTS / "local.yaml").read_text(), "local", "local.yaml").environment


class NoJobs:
    def all(self) -> list:
        return []

    def nodes(self) -> list:
        return []


class World:
    def __init__(self, scheduler: Scheduler, monkeypatch, pool: PoolStatus | None, up: bool):
        self.scheduler = scheduler
        self.bucket = MemoryBucket(scheduler)
        layout = Layout(ENV.state.prefix, "local")
        self.pool = SimulatedPool(scheduler, self.bucket, layout.lock, up=up)
        self.site = Site("local", ENV, Endpoints(), NoJobs(), self.bucket, lambda event: None, self.pool.scale,
                         lambda scaled_down: None, "/nonexistent", {"gpu_pool": 1}, checkpoints_here=False,
                         clock=simulated_clock(scheduler))
        monkeypatch.setattr(lock_module, "threading", simulated_threading())  # the lock's refresher: parked
        if pool is not None:
            assert self.site.pool.write(pool, 0)

    def run(self, actors: dict) -> dict:
        return self.scheduler.run(actors)

    def settle(self, redeliver: list[str]) -> None:
        """What happens next in production, one at a time: Pub/Sub delivers again a wake that raised, and the reaper
        ticks every minute (Cloud Scheduler) for as long as a crashed holder's lock takes to expire."""
        self.scheduler.choose, self.scheduler.crash, self.scheduler.lose_response = (lambda ready: next(iter(ready))), \
            {}, {}
        for name in redeliver:
            outcome = self.run({f"{name} redelivered": lambda: reap.wake(self.site)})[f"{name} redelivered"]
            assert outcome.error is None, outcome.error
        for _ in range(20):
            self.scheduler.clock += 60
            outcome = self.run({"next tick": lambda: reap.reap(self.site)})["next tick"]
            assert outcome.error is None, outcome.error

    def check(self) -> None:
        state, _ = self.site.pool.read()
        assert not self.pool.unlocked_scales, self.pool.unlocked_scales
        if state.scaled and not state.scaled_down:
            assert self.pool.up, f"pool.json says up ({state}), the pool is down: a waiting run would wait for ever"
        if state.scaled and state.scaled_down:
            assert not self.pool.up, f"pool.json says scaled down ({state}), the pool is up and billing"


INTERRUPTED = PoolStatus(scaled_down=True, since=1_789_999_000.0, scaled=False, created_at=1_789_990_000.0,
                         error="ServiceUnavailable: 503",
                         transitions=((1_789_990_000.0, "up"), (1_789_999_000.0, "down")))


def explore(seed: int, monkeypatch, tmp: Path | None = None) -> Scheduler:
    """One seeded schedule of a reap tick (on an idle pool or an interrupted scale-down), a wake and a duplicate
    delivery of it, each possibly crashed at one of its yield points or losing the response to one of its writes;
    then the redeliveries Pub/Sub makes of a wake that raised, and the reaper's next ticks. Raises on a violation.
    (`tmp`: unused; explore_seeds passes every schedule one.)"""
    rng = random.Random(seed)
    actors = ("reap", "wake", "again")
    scheduler = Scheduler(seeded(seed), crash={name: rng.randrange(1, 14) for name in actors if rng.random() < 0.4},
                          lose_response={name: rng.randrange(1, 5) for name in actors if rng.random() < 0.2})
    random.seed(seed)  # the wake's back-off jitter
    initial = rng.choice([INTERRUPTED, replace(INTERRUPTED, scaled_down=False, scaled=True, since=None)])
    world = World(scheduler, monkeypatch, initial, up=not initial.scaled_down)
    world.scheduler.clock += 3600  # idle for an hour: past the local timeout
    outcomes = world.run({"reap": lambda: reap.reap(world.site), "wake": lambda: reap.wake(world.site),
                          "again": lambda: reap.wake(world.site)})
    try:
        for name, outcome in outcomes.items():
            # A wake never raises for a lock: it would be redelivered at once, five times, into the dead-letter
            # topic (issue 34, 8); an error of the bucket's is redelivered, which settle() does.
            assert not isinstance(outcome.error, LockHeld), f"{name} raised {outcome.error}"
        world.settle(redeliver=[name for name, o in outcomes.items() if name != "reap" and o.error])
        world.check()
    except AssertionError as violation:
        raise AssertionError(f"seed {seed} (crash {scheduler.crash}, lost {scheduler.lose_response}): {violation}\n"
                             f"{scheduler.trace}") from None
    return scheduler


class ScriptedRay(SimulatedRay):
    """Ray on a script: every attempt runs 90 s, saving checkpoint-2 (a node-lost script for attempt 1 when
    asked); the GPU node's checkpoints are written into the run directory as the job reaches its save."""

    def __init__(self, scheduler: Scheduler, lustre: Path, preempt_first: bool):
        super().__init__(scheduler.time)
        self.lustre, self.preempt_first = lustre, preempt_first

    def submit_once(self, request) -> bool:
        if request.submission_id not in self.scripts:
            first = request.submission_id.endswith(".1") and self.preempt_first
            self.script(request.submission_id, start=5, steps=[(30, 1), (60, 2)], end=40 if first else 90,
                        status="FAILED" if first else "SUCCEEDED",
                        error_type="JOB_SUPERVISOR_ACTOR_DIED" if first else None)
            if not first:
                checkpoint = self.lustre / "checkpoints" / "tiny-arith" / "r1" / "checkpoint-2"
                checkpoint.mkdir(parents=True, exist_ok=True)
                (checkpoint / "model.safetensors").write_bytes(b"weights")
                (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [
                    {"step": 2, "reward": 0.5}]}))
        return super().submit_once(request)


def explore_control_plane(seed: int, monkeypatch, tmp: Path) -> Scheduler:
    """One seeded run of the control plane: a train message (and its duplicate delivery) and an apply holding the
    lock at first, then a tick a minute in which the watch, snapshot and reap functions run at once, every round
    interleaved by the seed, any actor possibly crashed at one of its yield points or losing a write's response,
    and the Ray head possibly restarted (forgetting every job); then calm ticks, one function at a time, until the
    world has settled. Raises on a violated invariant:
    - only the lock's holder scales the pool or changes what apply changes;
    - the pool is never scaled down while a run has not ended;
    - attempts are never lost, and every attempt before the last has ended with its end time;
    - the run ends, its complete checkpoint is manifested, and the pool is where pool.json says."""
    from rlops.runs import message, snapshot, train

    rng = random.Random(seed)
    scheduler = Scheduler(seeded(seed))
    random.seed(seed)
    world = World(scheduler, monkeypatch, replace(INTERRUPTED, scaled_down=rng.random() < 0.5, scaled=True),
                  up=True)
    world.pool.up = not world.site.pool.read()[0].scaled_down
    lustre = tmp / f"lustre-{seed}"
    ray = world.site.ray = ScriptedRay(scheduler, lustre, preempt_first=rng.random() < 0.6)
    world.site.lustre_root, world.site.checkpoints_here = str(lustre), True
    from rlops.runs import report_writer
    monkeypatch.setattr(report_writer, "publish", lambda site, record: None)  # plots: not what races
    violations = []
    scale_pool = world.pool.scale

    def scale(to_down: bool) -> None:
        if to_down and any(record.state not in run_records.TERMINAL
                           for record, _ in world.site.records.all().values()):
            violations.append(f"{scheduler.actor} scaled the pool down while a run had not ended")
        scale_pool(to_down)
    world.site.scale = scale

    def applying() -> None:
        lock = world.site.lock("apply")
        lock.acquire(60, poll_seconds=5)
        with lock:
            for step in range(2):
                lock.ensure_held()
                scheduler.point(f"apply step {step}")
                if world.bucket.holder(lock.blob.name) != "apply":
                    violations.append("apply changed something without holding the lock")

    request = message.parse(json.dumps({"environment": "local", "recipe": "tiny-arith", "run": "r1", "overrides": {},
                                        "requested_by": "tests"}).encode())
    settings = message.settings(request, message.recipe_of(request, world.site.env))
    actors = {"train": lambda: train.accept(world.site, request, settings),
              "again": lambda: train.accept(world.site, request, settings),
              "watch": lambda: watch.tick(world.site), "snapshot": lambda: snapshot.tick(world.site),
              "reap": lambda: reap.reap(world.site), "apply": applying}
    ticks = ("watch", "snapshot", "reap")
    restart_at = rng.randrange(0, 8) if rng.random() < 0.3 else None
    try:
        for round_ in range(8):
            names = [*ticks, *(("train", "again", "apply") if round_ == 0 else ())]
            names = [n for n in names if n in ("train", "watch") or rng.random() < 0.8]
            scheduler.crash = {n: rng.randrange(1, 12) for n in names if rng.random() < 0.15}
            scheduler.lose_response = {n: rng.randrange(1, 4) for n in names if rng.random() < 0.1}
            if round_ == restart_at:
                ray.jobs.clear()  # the Ray head restarted: its job table is empty
            outcomes = world.run({n: actors[n] for n in names})
            for name, outcome in outcomes.items():
                assert name in ("apply", "reap") or not isinstance(outcome.error, LockHeld), f"{name}: {outcome.error}"
            if any(o.crashed or o.error for n, o in outcomes.items() if n in ("train", "again")):
                scheduler.crash, scheduler.lose_response = {}, {}
                assert world.run({"redelivered": actors["train"]})["redelivered"].error is None  # Pub/Sub again
            scheduler.clock += 30
        scheduler.choose, scheduler.crash, scheduler.lose_response = (lambda ready: next(iter(ready))), {}, {}
        for _ in range(30):  # calm: a tick a minute, one function at a time, until nothing is left to finish
            scheduler.clock += 60
            for name in ticks:
                outcome = world.run({name: actors[name]})[name]
                assert outcome.error is None, f"{name}: {outcome.error!r}"
            record, _ = world.site.records.get("r1")
            if record and record.state == "SUCCEEDED" and "2" in record.manifests and \
                    world.site.pool.read()[0].scaled and not world.site.lock("x").blob.exists():
                break
        record, _ = world.site.records.get("r1")
        assert record is not None and record.state == "SUCCEEDED", f"the run did not end: {record}"
        assert [a.attempt for a in record.attempts] == list(range(1, len(record.attempts) + 1)), record.attempts
        assert all(a.state in run_records.TERMINAL and a.ended_at for a in record.attempts), record.attempts
        assert "2" in record.manifests, "the complete checkpoint was never manifested"
        assert not violations, violations
        world.check()
    except AssertionError as violation:
        raise AssertionError(f"seed {seed} (restart {restart_at}): {violation}\n{scheduler.trace[-40:]}") from None
    finally:
        shutil.rmtree(lustre, ignore_errors=True)  # thousands of schedules a run: each leaves nothing behind
    return scheduler
