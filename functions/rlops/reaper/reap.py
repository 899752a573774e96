"""What the `reap` function does, and the wake `train` does before it submits.

The pool's state is `PREFIX/environments/ENV/pool.json` in the state bucket: whether it is scaled
down, since when, when a train message last woke it, and whether the last scale finished (and if
not, why). Both sides write it with the generation they read as a precondition, and act only after
their write landed: a train message accepted after the reaper looked makes the reaper's write fail,
so it scales nothing down. A scale that stopped part way (an API error, a failed resize) is
finished by the next tick (down) or by the train message's redelivery (up).

Scaling down: locally, the GPU-pool Ray worker nodes are stopped; on GKE the RayCluster's GPU worker
groups go to 0 replicas and the GPU node pools are resized to 0 at once (their VMs stop, not after
the cluster autoscaler's ten minutes), each resize awaited: GKE runs one operation per cluster.
Waking restores the spec's sizes.

Apply and the scaling share the environment's lock: the RayCluster's `workerGroupSpecs` is an atomic
list, so an apply that read the replicas before a scale and applied after it would undo the scale.
A reap tick that finds the lock held does nothing and looks again next tick; a wake waits for it a while,
then leaves pool.json saying the pool must come back, which the next reap tick finishes.
"""

import random
from dataclasses import replace

from rlops.cloud.ray_jobs import ACTIVE, JobView
from rlops.errors import Failure
from rlops.logs import emit
from rlops.reaper.policy import Decision, Picture, assumed_wake, auto_timeout, decide, idle_gaps, savings, wake_seconds
from rlops.sites import Site
from rlops.spec.model import LocalEnvironment
from rlops.state.lock import Lock, LockHeld
from rlops.state.pool import WAKES_KEPT, PoolState, PoolStatus, Wake
from rlops.state.run_records import TERMINAL

WAKE_LOCK_TIMEOUT_SECONDS = 120.0
# A wake whose first step has not come this long after it is recorded as far as it got (its run failed, was
# cancelled, or never asked for GPUs): not measured again.
WAKE_MEASURED_FOR_SECONDS = 6 * 3600.0


def picture(site: Site, state: PoolStatus, now: float, mine: list[JobView]) -> Picture:
    ends = [job.end_time / 1000 for job in mine if job.end_time]
    open_runs = sum(record.state not in TERMINAL for record, _ in site.records.all().values())
    return Picture(now=now, active_jobs=sum(job.status in ACTIVE for job in mine), open_runs=open_runs,
                   last_job_end=max(ends, default=None), last_accepted=state.accepted_at,
                   woken_at=state.woken_at or state.created_at, scaled_down=state.scaled_down)


def reap(site: Site, dry_run: bool = False) -> tuple[Decision, list[str]]:
    """Decide, and unless `dry_run`, scale down; (the decision, what was or would be done)."""
    pool = site.pool
    state, generation = pool.read()
    now = site.clock.time()
    if generation == 0:  # first look at this environment: idleness is measured from now
        if not dry_run:
            pool.write(replace(state, created_at=now, transitions=state.moved(now, "up")), 0)
        return Decision(False, "first look at this environment: idleness counts from now"), []
    if not state.scaled_down and not state.scaled and not dry_run:
        return _finish_wake(site, pool), _actions(site, down=False)
    actions = _actions(site, down=True)
    unfinished = state.scaled_down and not state.scaled
    if not isinstance(site.env, LocalEnvironment) and not site.env.reapable_pools:
        return Decision(False, "every GPU pool consumes a reservation: scaling down saves nothing (it bills whether "
                               "its VMs run or not); idle.scale_reserved: true frees the capacity anyway"), []
    mine = [job for job in map(JobView.of, site.ray.all()) if job.meta.get("environment") == site.name]
    if not dry_run:
        state, generation = _note_ready(site, state, generation)
        state, generation = _note_phases(site, state, generation, now)
    if unfinished:
        decision = Decision(True, "finishing a scale-down that stopped part way", state.since)
    else:
        seconds, why = timeout(site, state, mine, now)
        decision = decide(picture(site, state, now, mine), seconds)
        if decision.idle_since is not None:  # a decision by the idle clock: which timeout, and why
            decision = replace(decision, reason=f"{decision.reason} (timeout: {why})")
    if not decision.scale_down or dry_run:
        return decision, actions if decision.scale_down else []
    try:
        lock = _lock(site, "reap", timeout=0)
    except LockHeld as held:
        return Decision(False, f"not this tick: {held}"), []
    with lock:
        if unfinished:
            # Read again under the lock: a wake may have come and gone since (it takes the lock to scale).
            now_state, _ = pool.read()
            if not (now_state.scaled_down and not now_state.scaled):
                return Decision(False, "a train message woke the pool while deciding"), []
        elif not pool.write(replace(state, scaled_down=True, since=now, scaled=False,
                                    transitions=state.moved(now, "down")), generation):
            return Decision(False, "a train message arrived while deciding"), []
        _scale_and_mark(site, pool, down=True, lock=lock)
    saved = savings(site.env)
    site.publish({"type": "scaled-down", "environment": site.name, "reason": decision.reason, "at": now,
                  "actions": actions, "savings": saved})
    emit("INFO", "GPU pool scaled down", environment=site.name, reason=decision.reason, actions=actions, savings=saved)
    return decision, actions


def timeout(site: Site, state: PoolStatus, mine: list[JobView], now: float) -> tuple[float, str]:
    """The idle timeout in force, and why: the spec's, or `auto` from this environment's wakes and idle gaps."""
    fixed = site.env.idle.timeout_seconds
    if fixed is not None:
        return fixed, f"idle.timeout {site.env.idle.timeout}"
    wake_cost, based = wake_seconds([ready - at for at, ready in state.ready], assumed_wake(site.env))
    busy = [(job.start_time / 1000, job.end_time / 1000 if job.end_time else None) for job in mine if job.start_time]
    seconds, why = auto_timeout(wake_cost, idle_gaps(busy, now))
    return seconds, f"auto, {why}; wake cost: {based}"


def _note_ready(site: Site, state: PoolStatus, generation: int) -> tuple[PoolStatus, int]:
    """When the last GPU node the wake brings back joined Ray, for each wake that has no such time yet (Ray's node
    table keeps its start time, so a late or repeated tick finds the same one)."""
    waiting = state.wakes_waiting()
    if not waiting:
        return state, generation
    starts = sorted(node["start_time_ms"] / 1000 for node in site.ray.nodes()
                    if not node.get("is_head_node") and node.get("start_time_ms"))
    wanted = max(1, site.env.woken_workers)
    joined = {at: [t for t in starts if t >= at] for at in waiting}
    found = [(at, joined[at][wanted - 1]) for at in waiting if len(joined[at]) >= wanted]
    if not found:
        return state, generation
    noted = replace(state, ready=(*state.ready, *found)[-WAKES_KEPT:])
    if site.pool.write(noted, generation):
        return site.pool.read()
    return state, generation


def _note_phases(site: Site, state: PoolStatus, generation: int, now: float) -> tuple[PoolStatus, int]:
    """Each recent wake phase by phase, as far as it got: what the environment reports (`Site.wake_phases`), then
    Ray's join (`ready`) and the job's first step (the first attempt submitted after it, its `first_step_at`).
    Rewritten each tick until the first step, so `rlops status` says which phase a wake is in."""
    unmeasured = state.wakes_unmeasured(WAKES_KEPT)
    if site.wake_phases is None or not unmeasured:
        return state, generation
    ready, wakes = dict(state.ready), state.wakes
    reported = site.wake_phases(unmeasured)  # one read of the cloud and the cluster for every wake
    stepped = [(a.submitted_at, a.first_step_at) for record, _ in site.records.all().values()
               for a in record.attempts if a.first_step_at is not None]
    for at in unmeasured:
        phases = list(reported[at])
        last = max((end for _, _, end in phases), default=at)
        if at in ready:
            phases.append(("ray-join", min(last, ready[at]), ready[at]))
        first = min((step for submitted, step in stepped if submitted >= at), default=None)
        if first is not None and at in ready:
            phases.append(("first-step", ready[at], max(first, ready[at])))
        measured = Wake(at, tuple(phases), done=len(phases) > 0 and phases[-1][0] == "first-step"
                        or now - at > WAKE_MEASURED_FOR_SECONDS)
        if measured != state.wake_of(at):
            wakes = (*(w for w in wakes if w.at != at), measured)[-WAKES_KEPT:]
    if wakes == state.wakes or not site.pool.write(replace(state, wakes=wakes), generation):
        return state, generation
    return site.pool.read()


def wake(site: Site) -> bool:
    """Record a train message's acceptance and bring a scaled-down pool back; True if it was down.

    A wake that stopped part way (`scaled` false) is finished by the message's redelivery.
    """
    pool = site.pool
    for attempt in range(10):
        site.clock.sleep(random.uniform(0, 0.05 * attempt))  # concurrent deliveries of one message take turns
        state, generation = pool.read()
        now = site.clock.time()
        must_scale = state.scaled_down or not state.scaled
        woken = replace(state, accepted_at=now)
        if not state.transitions:  # before the reaper's first look: the pool is up, known from now
            woken = replace(woken, transitions=state.moved(now, "up"))
        if must_scale:
            woken = replace(woken, scaled_down=False, since=None, woken_at=now, scaled=False,
                            transitions=woken.transitions if not state.scaled_down else state.moved(now, "up"))
        if pool.write(woken, generation):
            if must_scale:
                try:
                    lock = _lock(site, "wake", timeout=WAKE_LOCK_TIMEOUT_SECONDS)
                except LockHeld as held:
                    # pool.json already says the pool must come back (scaled false): the next reap tick finishes
                    # it once the lock is free, and the message is not redelivered into a dead-letter topic.
                    emit("WARNING", "GPU pool wake left to the next tick: the environment is locked",
                         environment=site.name, reason=str(held))
                    return must_scale
                with lock:
                    _scale_and_mark(site, pool, down=False, lock=lock)
                site.publish({"type": "woken", "environment": site.name, "at": now})
                emit("INFO", "GPU pool woken for a train message", environment=site.name)
            return must_scale
    raise Failure(f"{pool.blob.name} keeps changing; the message will be delivered again")


def _finish_wake(site: Site, pool: PoolState) -> Decision:
    """A wake that stopped part way (its scale failed, or it could not take the lock): bring the pool back."""
    try:
        lock = _lock(site, "wake", timeout=0)
    except LockHeld as held:
        return Decision(False, f"a wake is unfinished; not this tick: {held}")
    with lock:
        state, _ = pool.read()
        if state.scaled_down or state.scaled:
            return Decision(False, "the unfinished wake was finished or undone meanwhile")
        _scale_and_mark(site, pool, down=False, lock=lock)
    site.publish({"type": "woken", "environment": site.name, "at": site.clock.time()})
    emit("INFO", "GPU pool woken: a train message's wake finished by the reaper's tick", environment=site.name)
    return Decision(False, "finished a wake that stopped part way")


def _lock(site: Site, operation: str, timeout: float) -> Lock:
    lock = site.lock(operation)
    lock.acquire(timeout, on_wait=lambda held: emit("INFO", f"{operation} waits for the environment's lock",
                                                     environment=site.name, held_by=held.get("operation")))
    return lock


def _scale_and_mark(site: Site, pool: PoolState, down: bool, lock: Lock) -> None:
    """Scale, then record that it finished, or why not, unless the other side has changed the wish meanwhile."""
    lock.ensure_held()
    try:
        site.scale(down)
    except Exception as error:
        state, generation = pool.read()
        if state.scaled_down == down:
            pool.write(replace(state, scaled=False, error=f"{type(error).__name__}: {error}",
                               error_at=site.clock.time()), generation)
        emit("ERROR", f"GPU pool scale-{'down' if down else 'up'} stopped part way; "
                      f"{'the next tick' if down else 'the message redelivery'} finishes it",
             environment=site.name, error=str(error))
        raise
    state, generation = pool.read()
    if state.scaled_down == down:
        pool.write(replace(state, scaled=True, error=None, error_at=None), generation)


def _actions(site: Site, down: bool) -> list[str]:
    env = site.env
    if isinstance(env, LocalEnvironment):
        verb = "stop" if down else "start"
        return [f"{verb} Ray worker node ray-worker-{i} ({env.local.gpu_pool.resource})"
                for i in range(env.local.gpu_pool.workers)]
    size = lambda pool: 0 if down else pool.ray_worker_replicas  # noqa: E731
    actions = [f"RayCluster {env.ray.cluster_name}: worker group {p.name} to {size(p)} replicas"
               for p in env.reapable_pools] if "ray-workers" in env.idle.scale_down else []
    actions += [f"node pool {p.name}: resize to {size(p)} nodes" for p in env.reapable_pools
                if "node-pools" in env.idle.scale_down]
    return actions
