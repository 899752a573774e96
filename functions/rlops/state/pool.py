"""The GPU pool's state (`pool.json`): whether the reaper scaled it down, since when, when a train message
last woke it, and whether the last scale finished. The reaper and the wake write it with the generation
they read as a precondition; `up` and the run report only read it. Its JSON form is versioned like a run
record's (`state.run_records`)."""

from dataclasses import dataclass

from google.cloud import storage

from rlops.permissions import calls
from rlops.state.bucket import read_json, write_json_if
from rlops.state.layout import Layout
from rlops.state.run_records import plain_fields, readable

VERSION = 2  # 2: `wakes`, each wake's phases (a version 1 record reads as having none)
TRANSITIONS_KEPT = 2000  # a scale-down and a wake an hour for almost six weeks; `rlops cost` says what it knows from
WAKES_KEPT = 50


@dataclass(frozen=True)
class Wake:
    """One wake measured phase by phase from what the cloud, Kubernetes, Ray and the run records report."""

    at: float                                           # the wake (its "up" transition)
    phases: tuple[tuple[str, float, float], ...] = ()   # (phase, start, end), in the order a wake goes through them
    done: bool = False  # measured to the job's first step, or given up on: not looked at again


@dataclass(frozen=True)
class PoolStatus:
    scaled_down: bool = False
    since: float | None = None          # when it was scaled down
    scaled: bool = True                 # the last scale (down or up) finished; false: the next tick or redelivery does
    created_at: float | None = None     # the reaper's first look: idleness counts from then
    accepted_at: float | None = None    # the last train message accepted
    woken_at: float | None = None
    error: str | None = None            # why the last scale stopped part way
    error_at: float | None = None
    # [time, "up" | "down"] as the reaper's first look, its scale-downs and the wakes wrote them, in the same
    # conditional write as the state they changed: each once, whatever ticks repeat or go missing (rlops cost).
    transitions: tuple[tuple[float, str], ...] = ()
    # [wake time, when its last GPU node joined Ray (Ray's node table)]: what each wake cost (idle.timeout auto).
    ready: tuple[tuple[float, float], ...] = ()
    wakes: tuple[Wake, ...] = ()

    def to_json(self) -> dict:
        return {"version": VERSION, **plain_fields(self)}  # transitions and ready as lists of [time, what]

    @classmethod
    def from_json(cls, content: dict) -> "PoolStatus":
        fields = readable(cls, content, "pool.json", VERSION)
        fields["transitions"] = tuple((float(at), str(what)) for at, what in fields.get("transitions", ()))
        fields["ready"] = tuple((float(at), float(ready)) for at, ready in fields.get("ready", ()))
        fields["wakes"] = tuple(Wake(float(w["at"]), tuple((str(n), float(a), float(b)) for n, a, b in w["phases"]),
                                     bool(w.get("done"))) for w in fields.get("wakes", ()))
        return cls(**fields)

    def wake_times(self) -> list[float]:
        """When the pool was woken: each "up" after a "down"."""
        return [at for (at, what), before in zip(self.transitions[1:], self.transitions, strict=False)
                if what == "up" and before[1] == "down"]

    def wakes_waiting(self) -> list[float]:
        """Wakes whose GPU nodes have not all been seen joining yet."""
        known = {at for at, _ in self.ready}
        return [at for at in self.wake_times() if at not in known]

    def wake_of(self, at: float) -> Wake | None:
        return next((wake for wake in self.wakes if wake.at == at), None)

    def wakes_unmeasured(self, recent: int) -> list[float]:
        """The last `recent` wakes whose phases are not all measured yet."""
        return [at for at in self.wake_times()[-recent:] if not (self.wake_of(at) or Wake(at)).done]

    def moved(self, at: float, to: str) -> tuple[tuple[float, str], ...]:
        """The transitions with one more, the oldest dropped past TRANSITIONS_KEPT."""
        return (*self.transitions, (at, to))[-TRANSITIONS_KEPT:]


@calls("storage.objects.get", "storage.objects.insert")
class PoolState:
    def __init__(self, bucket: storage.Bucket, prefix: str, environment: str):
        self.blob = bucket.blob(Layout(prefix, environment).pool)

    def read(self) -> tuple[PoolStatus, int]:
        content, generation = read_json(self.blob)
        return (PoolStatus() if content is None else PoolStatus.from_json(content)), generation

    def write(self, status: PoolStatus, generation: int) -> bool:
        return write_json_if(self.blob, status.to_json(), generation)
