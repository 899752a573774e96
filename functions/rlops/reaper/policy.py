"""When an environment's GPU pool may be scaled down. Pure: a picture of the environment in, a decision out.

Idle means: no Ray job pending or running and no train message accepted, for longer than the
spec's idle timeout since the last of these ended (or since the pool was woken). A pending or
running job always keeps the pool, whatever the clock says, and so does a run whose record has not
ended: a restarted Ray head forgets its jobs, and a preempted attempt is resubmitted a tick after it
ended, while the run waits for the pool in both cases.

What a scale-down saves depends on how the pool's VMs are bought: on-demand and Spot VMs stop
billing once GKE removes them; a pool consuming a specific reservation saves nothing, since GCP bills
a reservation whether VMs run in it or not (it frees the capacity for other work in the project).
"""

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Picture:
    now: float
    active_jobs: int                 # pending or running
    open_runs: int                   # runs whose record has not ended (whatever Ray's job table says)
    last_job_end: float | None       # when the last job ended
    last_accepted: float | None      # when the last train message was accepted
    woken_at: float | None           # when the pool was last brought up (by apply, up or a wake)
    scaled_down: bool                # already at zero


@dataclass(frozen=True)
class Decision:
    scale_down: bool
    reason: str
    idle_since: float | None = None


def decide(picture: Picture, timeout_seconds: float) -> Decision:
    if picture.scaled_down:
        return Decision(False, "already scaled down")
    if picture.active_jobs:
        return Decision(False, f"{picture.active_jobs} job(s) pending or running")
    if picture.open_runs:
        return Decision(False, f"{picture.open_runs} run(s) not ended (their run records)")
    marks = [t for t in (picture.last_job_end, picture.last_accepted, picture.woken_at) if t is not None]
    if not marks:
        return Decision(False, "nothing has happened yet to measure idleness from")
    since = max(marks)
    idle = picture.now - since
    if idle <= timeout_seconds:
        return Decision(False, f"idle for {idle:.0f}s of the {timeout_seconds:.0f}s timeout", since)
    return Decision(True, f"idle for {idle:.0f}s, more than the {timeout_seconds:.0f}s timeout", since)


def savings(env) -> list[str]:
    """What scaling down this environment's GPU pools saves, one line per pool, for events and the README."""
    gpu_pools = getattr(env, "gpu_pools", None)
    if gpu_pools is None:
        return ["local Ray worker nodes: no cloud bill"]
    resized = "node-pools" in env.idle.scale_down
    lines = []
    for pool in gpu_pools:
        vms = f"{pool.autoscaling.max_nodes} x {pool.machine_type}"
        if pool.reservation:
            lines.append(f"node pool {pool.name}: nothing; reservation {pool.reservation} is billed whether its "
                         f"{vms} VMs run or not (scaling down frees them for other work in the project)")
        elif resized:
            lines.append(f"node pool {pool.name}: up to {vms} {'Spot' if pool.spot else 'on-demand'} VMs stop billing "
                         "as GKE removes them, within minutes")
        else:
            lines.append(f"node pool {pool.name}: its VMs bill until the cluster autoscaler removes them, "
                         "about 10 minutes after their Ray workers are gone")
    return lines


# What a wake costs until this environment has measured its own: a GPU node's start, the pull of a ~20 GB
# NeMo RL image and the Ray join take minutes; a local worker node, seconds.
DEFAULT_WAKE_SECONDS = {"gcp": 600.0, "local": 20.0}
WAKES_MEASURED = 5      # the median of the last few: one slow image pull does not set the timeout
GAPS_TO_LEARN = 1       # idle gaps seen before the timeout is fitted to them
GAPS_FITTED = 50        # the most recent ones: the fit follows a team whose habits change
MARGIN = 1.25           # a gap like one seen may run a little longer: waiting exactly as long would miss it


def wake_seconds(measured: list[float], provider: str) -> tuple[float, str]:
    """The wake cost the timeout is weighed against, and what it is based on."""
    recent = measured[-WAKES_MEASURED:]
    if not recent:
        return DEFAULT_WAKE_SECONDS[provider], f"no wake measured yet: {DEFAULT_WAKE_SECONDS[provider]:.0f}s assumed"
    return statistics.median(recent), f"median of the last {len(recent)} measured wakes"


def idle_cost(gap: float, timeout: float, wake: float) -> float:
    """Billed seconds an idle gap of `gap` costs with `timeout`: idle the whole gap, or `timeout` and then a wake."""
    return gap if gap <= timeout else timeout + wake


def auto_timeout(wake: float, gaps: list[float]) -> tuple[float, str]:
    """`idle.timeout: auto`. With no idle gap known yet, the break-even rule: wait as long as a wake costs (never
    more than twice the best possible on any arrival pattern). Then the timeout in [0, wake] that would have cost
    least over the recent gaps, with a margin: where most gaps outlast a wake, waiting the break-even time pays
    nearly twice the optimum and scaling down at once about once (bench/reaper.py). A timeout above the wake
    cost never helps: a gap that long costs less by scaling down at once."""
    if len(gaps) < GAPS_TO_LEARN:
        return wake, f"break-even: {wake:.0f}s, what a wake costs (no idle gap seen yet)"
    recent = gaps[-GAPS_FITTED:]
    candidates = sorted({0.0, wake, *(gap for gap in recent if gap < wake)})
    best = min(candidates, key=lambda timeout: (sum(idle_cost(gap, timeout, wake) for gap in recent), -timeout))
    chosen = min(wake, best * MARGIN)
    return chosen, (f"fitted to the last {len(recent)} idle gaps: {best:.0f}s would have cost least with a {wake:.0f}s "
                    f"wake, {chosen:.0f}s with a margin")


def idle_gaps(busy: list[tuple[float, float | None]], now: float) -> list[float]:
    """The idle gaps between busy spans [(first submitted, last ended or None while running)]: from the end of one
    busy period to the next submission."""
    gaps, end = [], None
    for start, stop in sorted(busy):
        if end is not None and start > end:
            gaps.append(start - end)
        end = now if stop is None else max(end or stop, stop)
    return gaps
