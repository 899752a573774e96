"""The GPU pool's state (`pool.json`): whether the reaper scaled it down, since when, when a train message
last woke it, and whether the last scale finished. The reaper and the wake write it with the generation
they read as a precondition; `up` and the run report only read it. Its JSON form is versioned like a run
record's (`state.run_records`)."""

from dataclasses import asdict, dataclass

from rlops.state.bucket import read_json, write_json_if
from rlops.state.layout import Layout
from rlops.state.run_records import readable

VERSION = 1


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

    def to_json(self) -> dict:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, content: dict) -> "PoolStatus":
        return cls(**readable(cls, content, "pool.json", VERSION))


class PoolState:
    def __init__(self, bucket, prefix: str, environment: str):
        self.blob = bucket.blob(Layout(prefix, environment).pool)

    def read(self) -> tuple[PoolStatus, int]:
        content, generation = read_json(self.blob)
        return (PoolStatus() if content is None else PoolStatus.from_json(content)), generation

    def write(self, status: PoolStatus, generation: int) -> bool:
        return write_json_if(self.blob, status.to_json(), generation)
