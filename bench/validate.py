"""How much `rlops validate` costs over parsing the same specs with plain `yaml.safe_load`.

Usage: python bench/validate.py [ROUNDS]. Prints seconds per round for each, then the ratio.
"""

import sys
import time
from pathlib import Path

import yaml

from rlops.spec.load import load

SPECS = sorted((Path(__file__).resolve().parent.parent / "environments").glob("*.yaml"))


def _best_of(rounds: int, work) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    for spec in SPECS:
        assert not load(spec).problems, spec
    plain = _best_of(rounds, lambda: [yaml.safe_load(p.read_text()) for p in SPECS])
    validate = _best_of(rounds, lambda: [load(p) for p in SPECS])
    print(f"yaml.safe_load of {len(SPECS)} specs: {plain * 1000:.1f} ms")
    print(f"rlops validate of {len(SPECS)} specs: {validate * 1000:.1f} ms")
    print(f"validate-vs-safe-load: {validate / plain:.2f} (goal <= 2)")


if __name__ == "__main__":
    main()
