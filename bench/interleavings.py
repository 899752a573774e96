"""Seeded interleavings of rlops's control plane (tests/reaper/test_interleavings.py), with crashes, lost responses and
Ray head restarts, checked for invariant violations: the reaper against train messages' wakes, and the whole
plane (train, watch, snapshot, reap and apply's lock, tick after tick). Prints how many schedules each explored,
how many distinct interleavings that was, and how fast, on one core (the baseline) and on every core (as
`make test` runs them).

Usage: python bench/interleavings.py [REAP_WAKE_SCHEDULES [CONTROL_PLANE_SCHEDULES]]   (default 10,000 and 10,000)
       python bench/interleavings.py --replay explore|explore_control_plane SEED   (one schedule, its steps said)
"""

import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from fakes.interleave import explore_seeds, workers  # noqa: E402
from interleavings_support import explore, explore_control_plane  # noqa: E402

SCENARIOS = {"reap-wake": explore, "control-plane": explore_control_plane}


def run(name: str, count: int, processes: int) -> tuple[int, int, float]:
    began = time.perf_counter()
    explored = explore_seeds(SCENARIOS[name], count, processes)
    seconds = time.perf_counter() - began
    for violation in explored.violations[:5]:
        print(f"violation[{name}]: {violation.splitlines()[0]}")
    print(f"distinct-interleavings[{name}, {processes} processes]: {len(explored.interleavings)} of {count}")
    print(f"interleavings-per-second[{name}, {processes} processes]: {count / seconds:.0f}")
    return count, len(explored.violations), seconds


def replay(name: str, seed: int) -> None:
    """One schedule again, in this process: each step it took, then the violation if it has one."""
    one = {function.__name__: function for function in SCENARIOS.values()}[name]
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        try:
            scheduler = one(seed, monkeypatch, Path(tmp))
        except AssertionError as violation:
            print(f"seed {seed} of {name} violates an invariant: {violation}")
            raise SystemExit(1) from None
    for actor, what in scheduler.trace:
        print(f"{actor}: {what}")
    print(f"seed {seed} of {name}: {len(scheduler.trace)} steps, no violation")


def main() -> None:
    if sys.argv[1:2] == ["--replay"]:
        replay(sys.argv[2], int(sys.argv[3]))
        return
    counts = [int(arg) for arg in sys.argv[1:3]] + [10_000, 10_000][len(sys.argv[1:3]):]
    cores = workers()
    total = violated = 0
    for (name, count) in zip(SCENARIOS, counts, strict=True):
        _, violations_alone, alone = run(name, count, 1)
        explored, violations, spread = run(name, count, cores)
        total, violated = total + explored, violated + violations_alone + violations  # the same seeds twice
        print(f"interleavings-speedup[{name}]: {alone / spread:.2f} (goal >= {0.8 * cores:.1f}, {cores} cores)")
    print(f"interleavings-explored: {total} (goal >= 10000)")
    print(f"invariant-violations: {violated} (goal == 0)")


if __name__ == "__main__":
    main()
