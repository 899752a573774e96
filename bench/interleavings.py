"""Seeded interleavings of rlops's control plane (tests/test_interleavings.py), with crashes, lost responses and
Ray head restarts, checked for invariant violations: the reaper against train messages' wakes, and the whole
plane (train, watch, snapshot, reap and apply's lock, tick after tick). Prints how many schedules each explored,
how many distinct interleavings that was, and how fast.

Usage: python bench/interleavings.py [REAP_WAKE_SCHEDULES [CONTROL_PLANE_SCHEDULES]]   (default 10,000 and 2,000)
"""

import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_interleavings import explore, explore_control_plane  # noqa: E402


def run(name: str, count: int, one) -> tuple[int, int]:
    violations, traces = [], set()
    began = time.perf_counter()
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        for seed in range(count):
            try:
                traces.add(tuple(one(seed, monkeypatch, Path(tmp)).trace))
            except AssertionError as violation:
                violations.append(str(violation).splitlines()[0])
    seconds = time.perf_counter() - began
    for line in violations[:5]:
        print(f"violation[{name}]: {line}")
    print(f"distinct-interleavings[{name}]: {len(traces)} of {count}")
    print(f"interleavings-per-second[{name}]: {count / seconds:.0f}")
    return count, len(violations)


def main() -> None:
    counts = [int(arg) for arg in sys.argv[1:3]] + [10_000, 2_000][len(sys.argv[1:3]):]
    explored, violated = zip(run("reap-wake", counts[0], lambda seed, mp, tmp: explore(seed, mp)),
                             run("control-plane", counts[1], explore_control_plane))
    print(f"interleavings-explored: {sum(explored)} (goal >= 10000)")
    print(f"invariant-violations: {sum(violated)} (goal == 0)")


if __name__ == "__main__":
    main()
