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

from rlops.spec import catalog
from rlops.spec.model import GcpEnvironment, LocalEnvironment


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


def savings(env: GcpEnvironment | LocalEnvironment) -> list[str]:
    """What scaling down this environment's GPU pools saves, one line per pool, for events and the README."""
    if isinstance(env, LocalEnvironment):
        return ["local Ray worker nodes: no cloud bill"]
    resized = "node-pools" in env.idle.scale_down
    lines = []
    for pool in env.gpu_pools:
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


LOCAL_WAKE_SECONDS = 20.0  # a local worker process's start and Ray join, before `join_delay`
WAKES_MEASURED = 5      # the median of the last few: one slow image pull does not set the timeout
GAPS_TO_LEARN = 1       # idle gaps seen before the timeout is fitted to them
GAPS_FITTED = 50        # the most recent ones: the fit follows a team whose habits change
MARGIN = 1.25           # a gap like one seen may run a little longer: waiting exactly as long would miss it


def assumed_wake(env: GcpEnvironment | LocalEnvironment) -> tuple[float, str]:
    """What a wake of this environment's GPU pool is assumed to cost before one is measured, and its parts: its
    machine's node start and network stack, the image pulled or streamed (`ray.image_cache`), the start and join
    (catalog.yaml, wake_assumed); locally a worker's start and its `join_delay`."""
    if isinstance(env, LocalEnvironment):
        delay = env.local.gpu_pool.join_delay_seconds
        return LOCAL_WAKE_SECONDS + delay, (f"{LOCAL_WAKE_SECONDS:.0f}s for a local worker"
                                            + (f" + its {delay}s join_delay" if delay else ""))
    assumed, machine = catalog.WAKE_ASSUMED, env.machine
    pulled = "streamed" if env.ray.image_cache else "registry"
    parts = {"node start": assumed.node_seconds,
             f"{machine.transport.name} network stack": assumed.network_stack_seconds[machine.transport.name],
             f"image {'streamed' if env.ray.image_cache else 'pulled from its registry'}":
                 assumed.image_pull_seconds[pulled],
             "start and Ray join": assumed.start_and_join_seconds}
    total = sum(parts.values())
    return total, f"{machine.name}: " + ", ".join(f"{what} {seconds:.0f}s"
                                                  for what, seconds in parts.items() if seconds)


def wake_seconds(measured: list[float], assumed: tuple[float, str]) -> tuple[float, str]:
    """The wake cost the timeout is weighed against, and what it is based on: the median of the last measured
    wakes, else `assumed` (`assumed_wake`)."""
    recent = measured[-WAKES_MEASURED:]
    if not recent:
        return assumed[0], f"no wake measured yet: {assumed[0]:.0f}s assumed ({assumed[1]})"
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
