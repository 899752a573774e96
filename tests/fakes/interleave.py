"""Deterministic interleavings of rlops's real control-plane code, in the spirit of FoundationDB's simulation.

Each actor (a reap tick, a train message's wake, ...) runs the real functions in a greenlet of its own, and only
one runs at a time: every state-bucket call, pool scale and sleep is a yield point where the actor stops and the
scheduler picks who goes next. The choices are the schedule: the same choices give the same run, a seeded chooser
explores, and a named list replays a known race. An actor can be crashed at a yield point (the process died there:
`Crash` is raised inside it) and a write's response can be lost (it lands, the caller sees an error, as a timeout).

`MemoryBucket` keeps Cloud Storage's semantics for what rlops uses: every object has a generation; a write or a
delete with `ifGenerationMatch` fails with 412 when the live generation differs (0: the object must not exist),
which fake-gcs-server does not enforce on DELETE (https://cloud.google.com/storage/docs/request-preconditions).

`explore_seeds` runs many seeded schedules on every core (forked worker processes, each schedule whole in one):
what each found, a digest of each distinct interleaving, and each violation with its seed and its log lines.
"""

import contextlib
import hashlib
import io
import multiprocessing
import os
import random
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.api_core import exceptions as gexc
from greenlet import greenlet


class Crash(BaseException):
    """The actor's process died at this yield point (BaseException: no `except Exception` in rlops catches it)."""


@dataclass
class Outcome:
    result: object = None
    error: BaseException | None = None
    crashed: bool = False


class Scheduler:
    def __init__(self, choose: Callable[[dict[str, str]], str], crash: dict[str, int] | None = None,
                 lose_response: dict[str, int] | None = None, max_steps: int = 5000):
        self.choose = choose
        self.crash = dict(crash or {})  # actor -> the index of the yield point where it dies
        self.lose_response = dict(lose_response or {})  # actor -> the index of the write whose response is lost
        self.max_steps = max_steps
        self.trace: list[tuple[str, str]] = []
        self.clock = 1_790_000_000.0
        self._names: dict[greenlet, str] = {}
        self._main: greenlet | None = None
        self._points: dict[str, int] = {}
        self._writes: dict[str, int] = {}

    # -- called by the actors' code (through the fakes) ------------------------------------------------------------
    def point(self, what: str) -> None:
        name = self.actor
        if name is None:
            return  # not an actor (the test itself, before or after the run; a thread of the code under test)
        index = self._points[name] = self._points.get(name, 0) + 1
        self._main.switch(what)  # parked: the scheduler resumes this actor when it chooses it
        self.trace.append((name, what))
        if self.crash.get(name) == index:
            raise Crash(f"{name} crashed before {what}")

    def response_lost(self) -> bool:
        """Whether the write about to land is one whose response the caller never gets."""
        name = self.actor
        if name is None:
            return False
        index = self._writes[name] = self._writes.get(name, 0) + 1
        return self.lose_response.get(name) == index

    @property
    def actor(self) -> str | None:
        return self._names.get(greenlet.getcurrent())

    def time(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.point(f"sleep {seconds:.2f}s")
        self.clock += seconds

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self, actors: dict[str, Callable[[], object]]) -> dict[str, Outcome]:
        """Each actor is a greenlet: one runs at a time, on this thread, until its next yield point."""
        outcomes = {name: Outcome() for name in actors}
        self._main = greenlet.getcurrent()

        def body(name: str, act: Callable[[], object]) -> str:
            try:
                self.point("start")
                outcomes[name].result = act()
            except Crash:
                outcomes[name].crashed = True
            except Exception as error:  # what the function would have raised to its caller
                outcomes[name].error = error
            return _ENDED

        parked: dict[str, str] = {}
        order = sorted(actors)
        runners = {}
        for name, act in actors.items():
            runners[name] = greenlet(lambda name=name, act=act: body(name, act))
            self._names[runners[name]] = name
            parked[name] = runners[name].switch()  # up to its first yield point
        for _ in range(self.max_steps):
            if not parked:
                break
            chosen = self.choose({name: parked[name] for name in order if name in parked})  # by name
            del parked[chosen]
            said = runners[chosen].switch()
            if said is not _ENDED:
                parked[chosen] = said
        else:
            raise AssertionError(f"no end after {self.max_steps} steps: {self.trace[-20:]}")
        for runner in runners.values():
            self._names.pop(runner, None)
        return outcomes


_ENDED = object()


def seeded(seed: int) -> Callable[[dict[str, str]], str]:
    rng = random.Random(seed)
    return lambda ready: rng.choice(list(ready))


def phases(*steps: tuple[str, str | None]) -> Callable[[dict[str, str]], str]:
    """A named schedule: each (actor, until) runs that actor alone until the next thing it would do contains
    `until` (None: until it ends), then the next phase; after the last, the first ready actor."""
    queue = list(steps)

    def choose(ready: dict[str, str]) -> str:
        while queue:
            actor, until = queue[0]
            if actor not in ready or (until is not None and until in ready[actor]):
                queue.pop(0)
                continue
            return actor
        return next(iter(ready))
    return choose


@dataclass
class _Object:
    data: bytes
    generation: int
    writer: str | None  # the actor whose write this is
    updated: float  # the server's clock at the write


@dataclass
class MemoryBucket:
    scheduler: Scheduler
    name: str = "state"
    objects: dict[str, _Object] = field(default_factory=dict)
    _generations: int = 0

    def blob(self, name: str) -> "MemoryBlob":
        return MemoryBlob(self, name)

    def list_blobs(self, prefix: str = ""):
        self.scheduler.point(f"list {prefix}")
        return [self._listed(name) for name in sorted(name for name in self.objects if name.startswith(prefix))]

    def get_blob(self, name: str) -> "MemoryBlob | None":
        self.scheduler.point(f"metadata {name}")
        return self._listed(name) if name in self.objects else None

    def _listed(self, name: str) -> "MemoryBlob":
        blob = MemoryBlob(self, name)
        blob._seen(self.objects[name])
        return blob

    def _next_generation(self) -> int:
        self._generations += 1
        return self._generations

    def holder(self, name: str) -> str | None:
        live = self.objects.get(name)
        return live.writer if live else None


class MemoryBlob:
    def __init__(self, bucket: MemoryBucket, name: str):
        self.bucket, self.name = bucket, name
        self.generation: int | None = None
        self.size: int | None = None
        self._updated: float | None = None

    def _seen(self, live: _Object) -> None:
        self.generation, self.size, self._updated = live.generation, len(live.data), live.updated

    @property
    def updated(self):
        from datetime import datetime

        return None if self._updated is None else datetime.fromtimestamp(self._updated, UTC)

    def _live(self, verb: str, if_generation_match: int | None) -> _Object:
        """The object as the request finds it: 404 if there is none, 412 if its generation is not the one asked."""
        self.bucket.scheduler.point(f"{verb} {self.name}")
        live = self.bucket.objects.get(self.name)
        if live is None:
            raise gexc.NotFound(f"No such object: {self.bucket.name}/{self.name}")
        if if_generation_match is not None and live.generation != if_generation_match:
            raise gexc.PreconditionFailed(f"412 {self.name}: generation {live.generation}, not {if_generation_match}")
        return live

    def download_as_bytes(self, if_generation_match: int | None = None) -> bytes:
        live = self._live("read", if_generation_match)
        self._seen(live)
        return live.data

    def download_as_text(self) -> str:
        return self.download_as_bytes().decode()

    def exists(self) -> bool:
        self.bucket.scheduler.point(f"exists {self.name}")
        return self.name in self.bucket.objects

    def upload_from_string(self, data, content_type: str | None = None, if_generation_match: int | None = None):
        scheduler = self.bucket.scheduler
        scheduler.point(f"write {self.name}")
        live = self.bucket.objects.get(self.name)
        if if_generation_match is not None and (live.generation if live else 0) != if_generation_match:
            raise gexc.PreconditionFailed(f"412 {self.name}: generation {live and live.generation}, "
                                          f"not {if_generation_match}")
        written = _Object(data.encode() if isinstance(data, str) else data, self.bucket._next_generation(),
                          scheduler.actor, scheduler.clock)
        self.bucket.objects[self.name] = written
        if scheduler.response_lost():
            raise gexc.ServiceUnavailable(f"503 the response to the write of {self.name} was lost")
        self._seen(written)

    def delete(self, if_generation_match: int | None = None) -> None:
        self._live("delete", if_generation_match)
        del self.bucket.objects[self.name]


class SimulatedPool:
    """The GPU pool's real size, scaled only by whoever holds the environment's lock (what `Site.scale` does)."""

    def __init__(self, scheduler: Scheduler, bucket: MemoryBucket, lock_object: str, up: bool = True):
        self.scheduler, self.bucket, self.lock_object, self.up = scheduler, bucket, lock_object, up
        self.unlocked_scales: list[str] = []

    def scale(self, down: bool) -> None:
        self.scheduler.point(f"scale {'down' if down else 'up'}")
        if self.bucket.holder(self.lock_object) != self.scheduler.actor:
            self.unlocked_scales.append(f"{self.scheduler.actor} scaled {'down' if down else 'up'} while "
                                        f"{self.bucket.holder(self.lock_object)} held the lock")
        self.up = not down


class ParkedThread:
    """What the lock module starts as its refresher, never run: the real one first waits a third of the TTL in real
    time, longer than a whole schedule lasts, and if it woke it would write the bucket from outside the schedule. A
    refresh is exercised where a test calls `Lock.refresh` at a yield point it chose."""

    def __init__(self, target: Callable[[], None], daemon: bool = False, name: str | None = None):
        self.name = name

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


def simulated_threading() -> SimpleNamespace:
    """What the lock module calls `threading`: its stop event as it is, its refresher parked."""
    return SimpleNamespace(Thread=ParkedThread, Event=threading.Event)


def simulated_clock(scheduler: Scheduler) -> SimpleNamespace:
    """The clock a site under test is given (`rlops.clock.Clock`): the scheduler's time, and sleeps that yield."""
    return SimpleNamespace(time=scheduler.time, monotonic=scheduler.time, sleep=scheduler.sleep)


@dataclass
class Explored:
    schedules: int = 0
    interleavings: set[str] = field(default_factory=set)  # a digest of each distinct trace
    violations: list[str] = field(default_factory=list)   # each with its seed (which replays it) and its log

    def merge(self, other: "Explored") -> None:
        self.schedules += other.schedules
        self.interleavings |= other.interleavings
        self.violations += other.violations


MEMORY = "/dev/shm"  # a memory filesystem (Linux's), for the schedules' files where there is one
LOG_KEPT = 6000  # characters of a violating schedule's log lines kept in its report, the last ones


def _explore_chunk(one: Callable[[int, pytest.MonkeyPatch, Path], Scheduler], seeds: range) -> Explored:
    """`one(seed, monkeypatch, tmp)` for each seed, in this process. A schedule's log lines (rlops's `emit`, one
    JSON line each on stdout) are kept apart and shown only with its violation: ten thousand schedules print some
    hundred thousand lines, which would bury the one that matters."""
    explored = Explored()
    with pytest.MonkeyPatch.context() as monkeypatch, \
            tempfile.TemporaryDirectory(prefix="rlops-schedules-", dir=MEMORY if os.access(MEMORY, os.W_OK) else None) \
            as tmp:
        # Every temporary directory of the code under test too (a job's staging of its py_modules): made and removed
        # thousands of times, they cost more on a disk than the schedules' own work.
        monkeypatch.setattr(tempfile, "tempdir", tmp)
        for seed in seeds:
            log = io.StringIO()
            try:
                with contextlib.redirect_stdout(log):
                    scheduler = one(seed, monkeypatch, Path(tmp))
            except Exception as violation:  # an AssertionError, or a harness error: either names its seed
                said = str(violation) if isinstance(violation, AssertionError) else \
                    f"seed {seed}: {type(violation).__name__}: {violation}"
                explored.violations.append(f"{said}\nits log lines:\n{log.getvalue()[-LOG_KEPT:]}")
            else:
                explored.interleavings.add(hashlib.blake2b(repr(scheduler.trace).encode(), digest_size=16).hexdigest())
            explored.schedules += 1
    return explored


def workers() -> int:
    return len(os.sched_getaffinity(0))


def explore_seeds(one: Callable[[int, pytest.MonkeyPatch, Path], Scheduler], count: int,
                  processes: int | None = None) -> Explored:
    """Seeds 0..count-1 of `one` (a module-level function, found by name in the forked workers), spread over
    `processes` (default: every core this process may use). Each worker forks from this process, so it runs the
    code as loaded here, with its own monkeypatches, clock and temporary directory."""
    processes = processes or workers()
    if processes == 1 or count < 2:
        return _explore_chunk(one, range(count))
    step = -(-count // (processes * 4))  # four chunks a worker: one slow chunk does not leave a core idle
    explored = Explored()
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        for part in pool.map(_explore_chunk, [one] * len(range(0, count, step)),
                             [range(start, min(start + step, count)) for start in range(0, count, step)]):
            explored.merge(part)
    return explored
