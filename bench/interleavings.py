"""Seeded interleavings of the reaper and a train message's wake (tests/test_interleavings.py), with crashes and
lost responses, checked for invariant violations; and the same number of schedules without the scheduler's
crashes as the baseline of how long a schedule takes.

Usage: python bench/interleavings.py [SCHEDULES]   (default 10,000)
"""

import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_interleavings import explore  # noqa: E402


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    violations, traces = [], set()
    began = time.perf_counter()
    with pytest.MonkeyPatch.context() as monkeypatch:
        for seed in range(count):
            try:
                traces.add(tuple(explore(seed, monkeypatch).trace))
            except AssertionError as violation:
                violations.append(str(violation).splitlines()[0])
    seconds = time.perf_counter() - began
    for line in violations[:5]:
        print(f"violation: {line}")
    print(f"seconds: {seconds:.1f}")
    print(f"distinct-interleavings: {len(traces)}")
    print(f"interleavings-per-second: {count / seconds:.0f} (goal >= 80)")
    print(f"interleavings-explored: {count} (goal >= 10000)")
    print(f"invariant-violations: {len(violations)} (goal == 0)")


if __name__ == "__main__":
    main()
