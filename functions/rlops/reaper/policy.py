"""When an environment's GPU pool may be scaled down. Pure: a picture of the environment in, a decision out.

Idle means: no Ray job pending or running and no train message accepted, for longer than the
spec's idle timeout since the last of these ended (or since the pool was woken). A pending or
running job always keeps the pool, whatever the clock says.

What a scale-down saves depends on how the pool's VMs are bought: on-demand and Spot VMs stop
billing once GKE removes them; a pool consuming a specific reservation saves nothing, since GCP bills
a reservation whether VMs run in it or not (it frees the capacity for other work in the project).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Picture:
    now: float
    active_jobs: int                 # pending or running
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
