"""The reaper and a train message's wake under chosen interleavings (tests/fakes/interleave.py): the real
`reap.reap` and `reap.wake`, the real lock and pool state, on a bucket with Cloud Storage's generation rules, a
simulated GPU pool and a simulated clock; crashes at any yield point, and the redeliveries and next ticks that
follow a crash or an error, as Pub/Sub and Cloud Scheduler would bring them.

Invariants, checked once every actor has ended and the world has settled:
- the pool is where pool.json says it is (a wake that pool.json records as done left the pool up; a finished
  scale-down left it down), so no run waits behind a pool that the state says is up;
- only the holder of the environment's lock scales the pool.
"""

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ENVIRONMENTS
from fakes.interleave import (
    MemoryBucket,
    Scheduler,
    SimulatedPool,
    explore_seeds,
    phases,
    seeded,
    simulated_datetime,
    simulated_threading,
    simulated_time,
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


def forgotten_run(world: "World", state: str = "RUNNING") -> None:
    """Run r1's record: attempt 1, which a restarted Ray head no longer lists (submitted long ago)."""
    record = run_records.new({"environment": "local", "recipe": "tiny-arith", "run": "r1", "requested-by": "tests",
                              "settings": "{}", "checkpoint-dir": "/lustre/checkpoints/tiny-arith/r1",
                              "attempt": "1"}, "rlops.local.r1.1", world.scheduler.clock - 3600)
    record.state = record.current.state = state
    record.current.resume_point = {"step": 2, "set_aside": [], "verified": True}
    assert world.site.records.create(record)


class World:
    def __init__(self, scheduler: Scheduler, monkeypatch, pool: PoolStatus | None, up: bool):
        self.scheduler = scheduler
        self.bucket = MemoryBucket(scheduler)
        layout = Layout(ENV.state.prefix, "local")
        self.pool = SimulatedPool(scheduler, self.bucket, layout.lock, up=up)
        self.site = Site("local", ENV, Endpoints(), NoJobs(), self.bucket, lambda event: None, self.pool.scale,
                         lambda scaled_down: None, "/nonexistent", {"gpu_pool": 1}, checkpoints_here=False)
        for module in (reap, lock_module):
            monkeypatch.setattr(module, "time", simulated_time(scheduler))
        monkeypatch.setattr(lock_module, "datetime", simulated_datetime(scheduler))
        monkeypatch.setattr(lock_module, "threading", simulated_threading())
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


def test_the_reaper_finishing_a_scale_down_does_not_undo_a_wake_that_came_in_between(monkeypatch):
    """Issue 34, 3: the reaper reads an interrupted scale-down, a train message wakes the pool (under the lock) and
    ends, then the reaper takes the lock and finishes its scale-down: the pool was left down while pool.json said up,
    and every later wake did nothing (`must_scale` false)."""
    scheduler = Scheduler(phases(("reap", "write rlops/locks/"), ("wake", None), ("reap", None)))
    world = World(scheduler, monkeypatch, INTERRUPTED, up=True)
    outcomes = world.run({"reap": lambda: reap.reap(world.site), "wake": lambda: reap.wake(world.site)})
    assert outcomes["wake"].result is True and outcomes["reap"].error is None
    decision, _ = outcomes["reap"].result
    assert not decision.scale_down and "woke the pool" in decision.reason
    world.check()


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


REAP_WAKE_SCHEDULES = 400
CONTROL_PLANE_SCHEDULES = 10_000  # issue 34: at least 10,000 schedules of the whole plane, with crashes, in `make test`


def explored_without_violations(one, count: int, distinct: float) -> None:
    """`count` seeded schedules of `one` on every core: none violates an invariant, and at least `distinct` of them
    are interleavings no other seed made (else the seeds explore less than they seem to)."""
    explored = explore_seeds(one, count)
    assert explored.schedules == count
    assert not explored.violations, (
        f"{len(explored.violations)} of {count} schedules violated an invariant; the first (replay it with "
        f"`python bench/interleavings.py --replay {one.__name__} SEED`):\n{explored.violations[0]}")
    assert len(explored.interleavings) >= distinct * count, \
        f"only {len(explored.interleavings)} distinct interleavings in {count} schedules"


def test_a_reap_and_a_wake_in_every_order_with_a_crash_anywhere_leave_the_pool_where_the_state_says():
    explored_without_violations(explore, REAP_WAKE_SCHEDULES, distinct=0.5)


class LockWorld:
    """The lock alone, on the interleaving bucket and the simulated clock."""

    def __init__(self, scheduler: Scheduler, monkeypatch):
        self.scheduler, self.bucket = scheduler, MemoryBucket(scheduler)
        monkeypatch.setattr(lock_module, "time", simulated_time(scheduler))
        monkeypatch.setattr(lock_module, "datetime", simulated_datetime(scheduler))
        monkeypatch.setattr(lock_module, "threading", simulated_threading())

    def lock(self, operation: str, ttl: float = 900) -> "lock_module.Lock":
        return lock_module.Lock(self.bucket, "rlops", "env", ttl_seconds=ttl, operation=operation)


def test_a_refresh_whose_response_was_lost_keeps_the_lock(monkeypatch):
    """Issue 34, 7: the refresh's write landed, its response did not; the retried write meets 412 on its own
    generation. The previous code gave up refreshing there, silently, and the lock expired under its holder."""
    scheduler = Scheduler(lambda ready: next(iter(ready)), lose_response={"apply": 2})
    world = LockWorld(scheduler, monkeypatch)
    apply = world.lock("apply")

    def holds() -> list:
        apply.acquire(0)
        kept = [apply.refresh(), apply.refresh()]  # the first refresh's response is lost
        apply._stop.set()
        return kept
    assert scheduler.run({"apply": holds})["apply"].result == [True, True]
    assert apply.lost is None and world.bucket.holder(apply.blob.name) == "apply"


def test_a_holder_whose_lock_was_taken_stops_before_its_next_change_and_its_release_deletes_nothing(monkeypatch):
    """The holder stalls past its TTL (a long wait, a paused VM); the reaper takes the expired lock. The holder's
    next refresh finds another's lock: `ensure_held` stops it, and its release (DELETE if the generation is still
    its own) leaves the reaper's lock alone."""
    scheduler = Scheduler(phases(("apply", "sleep"), ("apply", "write"), ("reap", None), ("apply", None)))
    world = LockWorld(scheduler, monkeypatch)
    apply, reaper = world.lock("apply", ttl=60), world.lock("reap", ttl=60)

    def applying() -> None:
        apply.acquire(0)
        apply._stop.set()
        lock_module.time.sleep(120)  # stalled, unrefreshed, past the TTL
        assert not apply.refresh()
        apply.ensure_held()

    def reaping() -> None:
        reaper.acquire(0)
        reaper._stop.set()
    outcomes = scheduler.run({"apply": applying, "reap": reaping})
    assert isinstance(outcomes["apply"].error, lock_module.LockLost) and "taken by" in str(outcomes["apply"].error)
    assert outcomes["reap"].error is None
    scheduler.run({"apply": apply.release})
    assert world.bucket.holder(reaper.blob.name) == "reap"


def test_force_unlock_does_not_remove_a_lock_its_holder_refreshed_meanwhile(monkeypatch):
    scheduler = Scheduler(phases(("holder", "sleep"), ("unlock", "delete"), ("holder", None), ("unlock", None)))
    world = LockWorld(scheduler, monkeypatch)
    holder = world.lock("apply")

    def holding() -> None:
        holder.acquire(0)
        holder._stop.set()
        lock_module.time.sleep(1)
        assert holder.refresh()
    outcomes = scheduler.run({"holder": holding,
                              "unlock": lambda: lock_module.force_unlock(world.bucket, "rlops", "env")})
    assert "its holder is alive" in str(outcomes["unlock"].error)
    assert world.bucket.holder(holder.blob.name) == "holder"


def test_a_run_a_restarted_ray_head_forgot_keeps_its_pool_and_its_resubmission_wakes_a_reaped_one(monkeypatch):
    """Issue 34, 2: the reaper measured idleness from Ray's job table and `accepted_at` alone, so once a restarted
    head forgot a running run's job, the pool was reaped; the watcher then resubmitted the attempt without waking
    the pool, and every later tick said "already scaled down" while the run stayed PENDING."""
    scheduler = Scheduler(lambda ready: next(iter(ready)))
    world = World(scheduler, monkeypatch, replace(INTERRUPTED, scaled_down=False, scaled=True, since=None), up=True)
    scheduler.clock += 3600  # an hour idle by the job table and the last train message
    forgotten_run(world)
    decision, _ = scheduler.run({"reap": lambda: reap.reap(world.site)})["reap"].result
    assert not decision.scale_down and decision.reason == "1 run(s) not ended (their run records)"
    assert world.pool.up

    # Reaped anyway (by a version without that rule, or a race): the watcher's resubmission brings the pool back.
    assert world.site.pool.write(replace(world.site.pool.read()[0], scaled_down=True, since=scheduler.clock),
                                 world.site.pool.read()[1])
    world.pool.up = False
    ray = SimulatedRay(scheduler.time)
    world.site.ray = ray
    monkeypatch.setattr(watch, "time", simulated_time(scheduler))
    outcome = scheduler.run({"watch": lambda: watch.tick(world.site)})["watch"]
    assert outcome.error is None, outcome.error
    assert "rlops.local.r1.2" in ray.jobs and world.pool.up
    state, _ = world.site.pool.read()
    assert not state.scaled_down and state.scaled
    world.check()


def test_a_watch_tick_whose_record_write_lost_to_another_writer_keeps_the_ended_attempt(monkeypatch):
    """Issue 34, 4: the tick resubmits attempt 2, then its record write loses to a snapshot's write of the same
    record; the next tick found attempt 2 in Ray and appended it, and attempt 1 stayed RUNNING with no end for
    ever (`rlops cost` charged it until now). Now the superseded attempt is ended as Ray says it ended."""
    from rlops.cloud.ray_jobs import described
    from rlops.runs import jobs

    scheduler = Scheduler(phases(("watch", "write rlops/environments/local/runs/r1.json"), ("snapshot", None),
                                 ("watch", None)))
    world = World(scheduler, monkeypatch, replace(INTERRUPTED, scaled_down=False, scaled=True, since=None), up=True)
    ray = world.site.ray = SimulatedRay(scheduler.time)
    monkeypatch.setattr(watch, "time", simulated_time(scheduler))
    submitted = scheduler.clock - 600
    ray.script("rlops.local.r1.1", start=5, steps=[(60, 1)], end=300, status="FAILED",
               error_type="JOB_SUPERVISOR_ACTOR_DIED", resumed=None)
    ray.script("rlops.local.r1.2", start=5, steps=[], end=10**6)
    now, scheduler.clock = scheduler.clock, submitted
    request = jobs.for_site(world.site, "tiny-arith", "r1", {}, "tests", 1)
    assert jobs.submit(world.site, request, "r1")
    assert world.site.records.create(run_records.new(described(request), request.submission_id, submitted))
    scheduler.clock = now

    snapshot = lambda: world.site.records.update("r1", lambda r: r.manifests.update({"2": {"digest": "d"}}))  # noqa: E731
    outcomes = scheduler.run({"watch": lambda: watch.tick(world.site), "snapshot": snapshot})
    assert outcomes["snapshot"].result is True and "rlops.local.r1.2" in ray.jobs
    assert world.site.records.get("r1")[0].current.attempt == 1, "the tick's write did lose"
    scheduler.choose = lambda ready: next(iter(ready))
    scheduler.run({"next tick": lambda: watch.tick(world.site)})
    record = world.site.records.get("r1")[0]
    first, second = record.attempts
    assert (first.state, first.ended_at, first.failure.kind) == ("FAILED", submitted + 300, "node-lost")
    assert second.attempt == 2 and record.manifests == {"2": {"digest": "d"}}


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
    from rlops.runs import checkpoint_transfers, report_writer
    for module in (watch, train, run_records, snapshot, checkpoint_transfers):
        monkeypatch.setattr(module, "time", simulated_time(scheduler))
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


@pytest.mark.exhaustive
def test_train_watch_snapshot_reap_and_apply_in_any_order_with_crashes_keep_every_invariant():
    explored_without_violations(explore_control_plane, CONTROL_PLANE_SCHEDULES, distinct=0.75)


def test_a_wake_during_a_long_apply_is_accepted_and_the_next_tick_brings_the_pool_back(monkeypatch):
    """Issue 34, 8: an apply holds the lock for its whole run (30 minutes or more); a train message's wake waited
    120 s for it and raised, so Pub/Sub redelivered it at once, five times, into the dead-letter topic, with
    pool.json already saying the pool was wanted up. Now the wake is accepted and the reaper's next tick finishes
    it once the apply has released the lock."""
    scheduler = Scheduler(phases(("apply", "sleep"), ("wake", None), ("apply", None)))
    world = World(scheduler, monkeypatch, replace(INTERRUPTED, scaled=True), up=False)  # reaped: scaled down

    def applying() -> None:
        lock = world.site.lock("apply")
        lock.acquire(0)
        with lock:
            lock_module.time.sleep(1800)  # creating a regional cluster, pools and Lustre
    outcomes = world.run({"apply": applying, "wake": lambda: reap.wake(world.site)})
    assert outcomes["wake"].error is None and outcomes["wake"].result is True, outcomes["wake"]
    state, _ = world.site.pool.read()
    assert not state.scaled_down and not state.scaled and not world.pool.up  # wanted up, not up yet
    decision, actions = world.run({"next tick": lambda: reap.reap(world.site)})["next tick"].result
    assert decision.reason == "finished a wake that stopped part way" and world.pool.up
    assert actions == ["start Ray worker node ray-worker-0 (gpu_pool)"]
    world.check()


def test_a_manifest_written_by_one_snapshot_tick_and_relinked_by_another_is_said_once(monkeypatch):
    """Two snapshot ticks at once: one writes step 2's manifest, and before it links it from the run record the
    other's relink finds it unlinked, links it and says so. The writer, linking next, finds it linked and says
    nothing: one `checkpoint` event, one "manifest written" line (the local loop's three concurrent ticks said
    it twice)."""
    from rlops.checkpoints import manifest
    from rlops.runs import snapshot

    # The writer runs until it would read the run record to link what it has written; the relink, whole; then it.
    scheduler = Scheduler(phases(("store", "read rlops/environments/local/runs/r1.json"), ("relink", None),
                                 ("store", None)))
    world = World(scheduler, monkeypatch, None, up=True)
    forgotten_run(world)
    content = {"run": "r1", "step": 2, "layout": "trl", "files": {}, "total_bytes": 0, "save": "s1"}
    content["digest"] = manifest.digest(content)
    events = []
    world.site.publish = events.append
    outcomes = world.run({"store": lambda: snapshot._store(world.site, "r1", content),
                          "relink": lambda: snapshot._relink(world.site, {"r1": world.site.records.get("r1")[0]})})
    assert all(outcome.error is None for outcome in outcomes.values()), outcomes
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [2], events
    assert world.site.records.get("r1")[0].manifests["2"]["save"] == "s1"
