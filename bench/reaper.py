"""What idle GPU pools cost in a simulated week, by scale-down policy, on three arrival patterns.

The cost of a policy is the GPU time billed while nothing trains: idle (the pool up, no run) plus
waking (each scale-up bills a node start, an image pull and a Ray join, WAKE seconds, before the run
can start). Runs are the same for every policy; a pool of 2 nodes x 8 GPUs.

Patterns (seeded): `week` (weekdays 8-20h about one run an hour, nights and weekends rarely; runs of
lognormal length, median 40 min); `bursty-daytime` (weekday bursts of 3-8 short runs a few minutes
apart, a few bursts a day); `sparse-nightly` (one or two long runs a night, nothing by day).

Policies:
- never: the pool stays up from the first run on;
- GKE default: the cluster autoscaler removes nodes 10 minutes after the last pod leaves, plus about
  a minute to drain and delete them (GKE's best case: it assumes the Ray workers leave with the run);
- rlops with a fixed timeout (5 minutes as SkyPilot's default, 30 minutes as the seeds'), and with
  `idle.timeout: auto`: the reaper's real decision (`rlops.reaper.policy.decide`) ticking every
  minute, the auto timeout from the real `auto_timeout` over the idle gaps seen so far (`idle_gaps`
  of the runs started so far, as the reaper reads them from Ray's job list);
- the offline optimum, which knows the next arrival: each idle gap costs min(gap, WAKE).

Then `auto` again with the wake today's image pull gives and with the one the image cache gives (image streaming
from an Artifact Registry remote repository: issue 37), both from the fake cluster's timings
(tests/fakes/kube_scheduling.py `Timings`, the ones tests/reaper/test_wake_phases.py measures), its assumptions printed;
the reaper assumes the machine-type default (`assumed_wake`: h200's A3 Ultra, its RDMA stack, the image pulled or
streamed) until it has measured a wake, then the median of those it measured (`wake_seconds`). The offline
optimum's own ratio is printed beside each: no timeout can do better than it.

Usage: python bench/reaper.py [SEED]
"""

import math
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from fakes.kube_scheduling import Timings  # noqa: E402
from rlops.reaper.policy import Picture, assumed_wake, auto_timeout, decide, idle_gaps, wake_seconds  # noqa: E402
from rlops.spec.load import load_or_raise  # noqa: E402

WEEK = 7 * 24 * 3600
GPUS = 2 * 8
TICK = 60.0
WAKE = 600.0  # the simulated wake of the policies' table, known to `auto` from the start
GKE_UNNEEDED, GKE_REMOVAL = 600.0, 60.0


def week(rng: random.Random) -> list[tuple[float, float]]:
    runs, now = [], 0.0
    while now < WEEK:
        day, hour = int(now // 86400), (now % 86400) / 3600
        now += rng.expovariate(1 / 3600 if day < 5 and 8 <= hour < 20 else 1 / (8 * 3600))
        if now < WEEK:
            runs.append((now, now + rng.lognormvariate(math.log(40 * 60), 0.8)))
    return runs


def bursty_daytime(rng: random.Random) -> list[tuple[float, float]]:
    runs = []
    for day in range(5):
        for _ in range(rng.randint(2, 4)):
            now = day * 86400 + rng.uniform(9, 17) * 3600
            for _ in range(rng.randint(3, 8)):
                end = now + rng.lognormvariate(math.log(15 * 60), 0.5)
                runs.append((now, end))
                now = end + rng.uniform(60, 300)  # the next experiment of the burst, a few minutes later
    return sorted(runs)


def sparse_nightly(rng: random.Random) -> list[tuple[float, float]]:
    runs = []
    for day in range(7):
        for _ in range(rng.randint(1, 2)):
            start = day * 86400 + rng.uniform(0, 4) * 3600
            runs.append((start, start + rng.lognormvariate(math.log(2 * 3600), 0.4)))
    return sorted(runs)


PATTERNS = {"week": week, "bursty-daytime": bursty_daytime, "sparse-nightly": sparse_nightly}


def busy_periods(runs) -> list[list[float]]:
    periods = []
    for a, e in sorted(runs):
        if periods and a <= periods[-1][1]:
            periods[-1][1] = max(periods[-1][1], e)
        else:
            periods.append([a, e])
    return periods


def gaps_of(runs) -> list[float]:
    periods = busy_periods(runs)
    return [b[0] - a[1] for a, b in zip(periods, periods[1:], strict=False)]


def cost_by_gaps(runs, gap_cost) -> float:
    """One wake for the first run, then each idle gap's cost."""
    return WAKE + sum(gap_cost(gap) for gap in gaps_of(runs))


def rlops(runs, timeout_at, wake: float = WAKE) -> tuple[float, int, int]:
    """Idle plus waking seconds with the reaper ticking every minute; scale-downs; scale-downs while a run was live
    (must be 0). `timeout_at(t, started, wakes)` is the timeout in force at tick t, given the runs started and the
    wakes (each `wake` seconds) measured by then. The pool is billed from each wake (a run's arrival finding it
    down) to the scale-down after it."""
    ordered = sorted(runs)
    up_since, woken_at, billed, wakes, downs, bad, i, t = None, None, 0.0, 0, 0, 0, 0, 0.0
    horizon = max(e for _, e in runs) + 86400
    while t <= horizon:
        while i < len(ordered) and ordered[i][0] <= t:  # a train message wakes the pool when it arrives
            if up_since is None:
                up_since = woken_at = ordered[i][0]
                wakes += 1
            i += 1
        if up_since is not None:
            started = ordered[:i]
            live = sum(1 for a, e in started if a <= t < e)
            ended = [e for _, e in started if e <= t]
            picture = Picture(now=t, active_jobs=live, open_runs=0, last_job_end=max(ended, default=None),
                              last_accepted=started[-1][0] if started else None, woken_at=woken_at,
                              scaled_down=False)
            if decide(picture, timeout_at(t, started, [wake] * (wakes - 1))).scale_down:
                bad += live > 0
                billed += t - up_since
                up_since, downs = None, downs + 1
        t += TICK
    busy = sum(e - a for a, e in busy_periods(runs))
    return billed - busy + wakes * wake, downs, bad


def auto(t: float, started, measured=()) -> float:
    """`idle.timeout: auto` with the simulated wake (WAKE, as assumed) known from the start."""
    busy = [(a, e if e <= t else None) for a, e in started]
    return auto_timeout(WAKE, idle_gaps(busy, t))[0]


def auto_learning(assumed: tuple[float, str]):
    """`idle.timeout: auto` as the reaper runs it: the machine's assumed wake (`assumed_wake`) until one is
    measured, then their median."""
    def timeout_at(t: float, started, measured) -> float:
        busy = [(a, e if e <= t else None) for a, e in started]
        return auto_timeout(wake_seconds(list(measured), assumed)[0], idle_gaps(busy, t))[0]
    return timeout_at


# The wake of the fake cluster's timings: the GPU node's boot and Ready, the pod's scheduling, the image pull, the
# container's start, then Ray's join (the raylet's start after its container's, as tests/reaper/test_wake_phases.py
# has it).
RAY_JOIN = 9.0


def fake_wake(streaming: bool) -> float:
    t = Timings()
    return t.boot + t.node_ready + t.scheduling + t.pull[streaming] + t.container_start + RAY_JOIN


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(f"wake {WAKE / 60:.0f} min, {GPUS} GPUs, seed {seed}; idle + waking GPU-hours in a week")
    header = ("pattern", "runs", "never", "GKE default", "rlops 5m", "rlops 30m", "rlops auto", "optimum")
    print("  ".join(f"{h:>14}" for h in header))
    figures, bad_total = {}, 0
    for name, pattern in PATTERNS.items():
        runs = pattern(random.Random(seed))
        never = cost_by_gaps(runs, lambda gap: gap)
        gke = cost_by_gaps(runs, lambda gap: gap if gap <= GKE_UNNEEDED + GKE_REMOVAL
                           else GKE_UNNEEDED + GKE_REMOVAL + WAKE)
        best = cost_by_gaps(runs, lambda gap: min(gap, WAKE))
        results = {}
        for label, timeout_at in (("5m", lambda t, s, m: 300.0), ("30m", lambda t, s, m: 1800.0), ("auto", auto)):
            billed, downs, bad = rlops(runs, timeout_at)
            results[label] = billed
            bad_total += bad
        row = (name, str(len(runs)), *(f"{v * GPUS / 3600:.1f}" for v in
                                       (never, gke, results["5m"], results["30m"], results["auto"], best)))
        print("  ".join(f"{c:>14}" for c in row))
        figures[name] = (results["auto"] / best, results["auto"] / gke, best / gke)
    for name, (_, _, best_vs_gke) in figures.items():
        print(f"{name}: the offline optimum itself costs {best_vs_gke:.2f} of GKE's default")
    for name, (vs_best, _, _) in figures.items():
        print(f"reaper-auto-vs-offline-optimum[{name}]: {vs_best:.2f} (goal <= 1.3)")
    for name, (_, vs_gke, _) in figures.items():
        print(f"reaper-auto-vs-gke-default[{name}]: {vs_gke:.2f} (goal <= 0.5)")
    t, today, cached = Timings(), fake_wake(False), fake_wake(True)
    h200 = load_or_raise(REPO / "environments" / "h200.yaml")
    uncached = h200.model_copy(update={"ray": h200.ray.model_copy(update={"image_cache": False})})
    assumed = {"today": assumed_wake(uncached), "cached": assumed_wake(h200)}
    print(f"\nauto with the image cache: a wake of {cached:.0f}s against today's {today:.0f}s (the fake cluster's "
          f"timings: node boot {t.boot:.0f}s, Ready {t.node_ready:.0f}s, scheduling {t.scheduling:.0f}s, image pull "
          f"{t.pull[False]:.0f}s from nvcr.io or {t.pull[True]:.0f}s streamed from Artifact Registry, container start "
          f"{t.container_start:.0f}s, Ray join {RAY_JOIN:.0f}s); until it has measured one the reaper assumes h200's "
          f"machine-type default, {assumed['today'][0]:.0f}s today and {assumed['cached'][0]:.0f}s with the cache "
          f"({assumed['cached'][1]}); idle + waking GPU-hours in a week")
    cache_figures = {}
    for name, pattern in PATTERNS.items():
        runs = pattern(random.Random(seed))
        hours = {label: rlops(runs, auto_learning(assumed[label]), wake)[0] * GPUS / 3600
                 for label, wake in (("today", today), ("cached", cached))}
        optimum = {wake: wake + sum(min(gap, wake) for gap in gaps_of(runs)) for wake in (today, cached)}
        print(f"{name:>16}: today {hours['today']:.1f}, cached {hours['cached']:.1f}; the offline optimum's own "
              f"ratio {optimum[cached] / optimum[today]:.2f} (gaps shorter than either wake cost the same with both)")
        cache_figures[name] = hours["cached"] / hours["today"]
    print(f"reaper-scale-downs-during-runs: {bad_total} (goal == 0)")
    for name, ratio in cache_figures.items():
        print(f"reaper-auto-cached-vs-uncached[{name}]: {ratio:.2f} (goal <= 0.6)")


if __name__ == "__main__":
    main()
