"""The GPU pool's state (`pool.json`): whether the reaper scaled it down, since when, when a train message
last woke it, and whether the last scale finished. The reaper and the wake write it with the generation
they read as a precondition; `up` and the run report only read it."""

from rlops.state.bucket import read_json, write_json_if
from rlops.state.layout import Layout


class PoolState:
    def __init__(self, bucket, prefix: str, environment: str):
        self.blob = bucket.blob(Layout(prefix, environment).pool)

    def read(self) -> tuple[dict, int]:
        content, generation = read_json(self.blob)
        return content or {"scaled_down": False, "since": None, "woken_at": None}, generation

    def write(self, content: dict, generation: int) -> bool:
        return write_json_if(self.blob, content, generation)
