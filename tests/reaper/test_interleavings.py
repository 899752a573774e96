"""The reaper and a train message's wake under chosen interleavings (tests/fakes/interleave.py): the real
`reap.reap` and `reap.wake`, the real lock and pool state, on a bucket with Cloud Storage's generation rules, a
simulated GPU pool and a simulated clock; crashes at any yield point, and the redeliveries and next ticks that
follow a crash or an error, as Pub/Sub and Cloud Scheduler would bring them.

Invariants, checked once every actor has ended and the world has settled:
- the pool is where pool.json says it is (a wake that pool.json records as done left the pool up; a finished
  scale-down left it down), so no run waits behind a pool that the state says is up;
- only the holder of the environment's lock scales the pool.
"""

from dataclasses import replace

import pytest

from fakes.interleave import (
    MemoryBucket,
    Scheduler,
    explore_seeds,
    phases,
    simulated_clock,
    simulated_threading,
)
from fakes.ray import SimulatedRay
from interleavings_support import INTERRUPTED, World, explore, explore_control_plane
from rlops.reaper import reap
from rlops.runs import watch
from rlops.state import lock as lock_module
from rlops.state import run_records


def forgotten_run(world: "World", state: str = "RUNNING") -> None:
    """Run r1's record: attempt 1, which a restarted Ray head no longer lists (submitted long ago)."""
    record = run_records.new({"environment": "local", "recipe": "tiny-arith", "run": "r1", "requested-by": "tests",
                              "settings": "{}", "checkpoint-dir": "/lustre/checkpoints/tiny-arith/r1",
                              "attempt": "1"}, "rlops.local.r1.1", world.scheduler.clock - 3600)
    record.state = record.current.state = state
    record.current.resume_point = {"step": 2, "set_aside": [], "verified": True}
    assert world.site.records.create(record)


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
        monkeypatch.setattr(lock_module, "threading", simulated_threading())  # the lock's refresher: parked

    def lock(self, operation: str, ttl: float = 900) -> "lock_module.Lock":
        return lock_module.Lock(self.bucket, "rlops", "env", ttl_seconds=ttl, operation=operation,
                                clock=simulated_clock(self.scheduler))


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
        apply.clock.sleep(120)  # stalled, unrefreshed, past the TTL
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
        holder.clock.sleep(1)
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
            lock.clock.sleep(1800)  # creating a regional cluster, pools and Lustre
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
