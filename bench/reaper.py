"""Idle GPU-hours in a simulated week: rlops's reaper against GKE's default scale-down and against never.

A seeded week of train messages (weekdays 8-20h about one an hour, nights and weekends rarely;
runs of lognormal length, median 40 min) on a pool of 2 nodes x 8 GPUs, all up while any run is
live. The pool is billed from a scale-up until it is removed; "idle" is billed time with no run.
- rlops: the reaper's real policy (rlops.reaper.policy.decide), ticking every minute, resizes the
  pool to zero at once;
- GKE default: the cluster autoscaler removes a node 10 minutes after it is unneeded, plus about a
  minute to drain and delete it; this assumes the Ray workers leave when the run ends, which a
  RayCluster's workers do not (so it is GKE's best case);
- never: the pool stays up from the first run to the end of the week.
Scale-ups are taken as instant for all three (their cost is the same).

Usage: python bench/reaper.py [SEED]
"""

import math
import random
import sys

from rlops.reaper.policy import Picture, decide

WEEK = 7 * 24 * 3600
GPUS = 2 * 8
TICK = 60.0
GKE_UNNEEDED, GKE_REMOVAL = 600.0, 60.0


def week_of_runs(seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    runs, now = [], 0.0
    while now < WEEK:
        day, hour = int(now // 86400), (now % 86400) / 3600
        rate = 1 / 3600 if day < 5 and 8 <= hour < 20 else 1 / (8 * 3600)
        now += rng.expovariate(rate)
        if now < WEEK:
            runs.append((now, now + rng.lognormvariate(math.log(40 * 60), 0.8)))
    return runs


def live(runs, t: float) -> int:
    return sum(1 for a, e in runs if a <= t < e)


def busy_seconds(runs) -> float:
    total, end = 0.0, 0.0
    for a, e in sorted(runs):
        if e > end:
            total += e - max(a, end)
            end = e
    return total


def up_seconds_rlops(runs, timeout: float) -> tuple[float, int, int]:
    """Billed seconds, scale-downs, and scale-downs while a run was live (must be 0)."""
    up_since, billed, downs, bad = None, 0.0, 0, 0
    accepted = sorted(a for a, _ in runs)
    woken_at, t, i = None, 0.0, 0
    while t <= WEEK + timeout + TICK:
        while i < len(accepted) and accepted[i] <= t:  # a train message wakes the pool when it arrives
            if up_since is None:
                up_since, woken_at = accepted[i], accepted[i]
            i += 1
        if up_since is not None:
            picture = Picture(now=t, active_jobs=live(runs, t),
                              last_job_end=max((e for _, e in runs if e <= t), default=None),
                              last_accepted=accepted[i - 1] if i else None, woken_at=woken_at, scaled_down=False)
            if decide(picture, timeout).scale_down:
                bad += picture.active_jobs > 0
                billed += t - up_since
                up_since, downs = None, downs + 1
        t += TICK
    return billed, downs, bad


def up_seconds_gke(runs) -> float:
    billed, spans = 0.0, []
    for a, e in sorted(runs):
        if spans and a <= spans[-1][1] + GKE_UNNEEDED:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([a, e])
    for a, e in spans:
        billed += e - a + GKE_UNNEEDED + GKE_REMOVAL
    return billed


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    runs = week_of_runs(seed)
    busy = busy_seconds(runs)
    never = WEEK - min(a for a, _ in runs)
    gke = up_seconds_gke(runs)
    print(f"{len(runs)} runs in a week (seed {seed}), pool busy {busy / 3600:.1f} h, {GPUS} GPUs")
    print(f"{'policy':>22}  idle GPU-hours  scale-downs")
    print(f"{'never':>22}  {(never - busy) * GPUS / 3600:14.1f}  {0:11d}")
    print(f"{'GKE default (best)':>22}  {(gke - busy) * GPUS / 3600:14.1f}  {'-':>11}")
    figures = {}
    for timeout in (120, 300, 1200, 1800):
        billed, downs, bad = up_seconds_rlops(runs, timeout)
        figures[timeout] = ((billed - busy) / (gke - busy), bad)
        print(f"{f'rlops, timeout {timeout // 60}m':>22}  {(billed - busy) * GPUS / 3600:14.1f}  {downs:11d}"
              f"  ({bad} during a live run)")
    ratio, bad = figures[120]
    print(f"reaper-idle-vs-gke-default-2m: {ratio:.2f} (goal <= 0.3)")
    print(f"reaper-idle-vs-gke-default-30m: {figures[1800][0]:.2f} (goal <= 1)")
    print(f"reaper-scale-downs-during-runs: {sum(b for _, b in figures.values())} (goal == 0)")


if __name__ == "__main__":
    main()
