"""What the `reap` function does, and the wake `train` does before it submits.

The pool's state is `PREFIX/environments/ENV/pool.json` in the state bucket: whether it is scaled
down, since when, when a train message last woke it, and whether the last scale finished. Both
sides write it with the generation they read as a precondition, and act only after their write
landed: a train message accepted after the reaper looked makes the reaper's write fail, so it
scales nothing down. A scale that stopped part way (an API error) is finished by the next tick
(down) or by the train message's redelivery (up).

Scaling down: locally, the GPU-pool Ray worker nodes are stopped; on GKE the RayCluster's GPU worker
groups go to 0 replicas and the GPU node pools are resized to 0 at once (billing stops now, not
after the cluster autoscaler's ten minutes). Waking restores the spec's sizes.
"""

import random
import time

from google.api_core import exceptions as gexc

from rlops.logs import emit
from rlops.reaper.policy import Decision, Picture, decide
from rlops.state.bucket import read_json, write_json

ACTIVE = ("PENDING", "RUNNING")


class PoolState:
    def __init__(self, bucket, prefix: str, environment: str):
        self.blob = bucket.blob(f"{prefix}/environments/{environment}/pool.json")

    @classmethod
    def of(cls, site) -> "PoolState":
        return cls(site.records.bucket, site.env.state.prefix, site.name)

    def read(self) -> tuple[dict, int]:
        content, generation = read_json(self.blob)
        return content or {"scaled_down": False, "since": None, "woken_at": None}, generation

    def write(self, content: dict, generation: int) -> bool:
        try:
            write_json(self.blob, content, if_generation_match=generation)
        except gexc.PreconditionFailed:
            return False
        return True


def picture(site, state: dict, now: float) -> Picture:
    from rlops.runs import jobs as run_jobs

    mine = [j for j in site.ray.all() if (run_jobs.described(j) or {}).get("environment") == site.name]
    status = [str(getattr(j.status, "value", j.status)) for j in mine]
    ends = [j.end_time / 1000 for j in mine if j.end_time]
    return Picture(now=now, active_jobs=sum(s in ACTIVE for s in status), last_job_end=max(ends, default=None),
                   last_accepted=state.get("accepted_at"), woken_at=state.get("woken_at") or state.get("created_at"),
                   scaled_down=bool(state.get("scaled_down")))


def reap(site, dry_run: bool = False) -> tuple[Decision, list[str]]:
    """Decide, and unless `dry_run`, scale down; (the decision, what was or would be done)."""
    pool = PoolState.of(site)
    state, generation = pool.read()
    now = time.time()
    if generation == 0:  # first look at this environment: idleness is measured from now
        state = {**state, "created_at": now}
        if not dry_run:
            pool.write(state, 0)
        return Decision(False, "first look at this environment: idleness counts from now"), []
    actions = _actions(site, down=True)
    if state.get("scaled_down") and not state.get("scaled", True):
        # The last scale-down stopped part way (an API error, a timeout): this tick finishes it.
        if not dry_run:
            _scale_and_mark(site, pool, down=True)
        return Decision(True, "finishing a scale-down that stopped part way", state.get("since")), actions
    decision = decide(picture(site, state, now), site.env.idle.timeout_seconds)
    if not decision.scale_down or dry_run:
        return decision, actions if decision.scale_down else []
    if not pool.write({**state, "scaled_down": True, "since": now, "scaled": False}, generation):
        return Decision(False, "a train message arrived while deciding"), []
    _scale_and_mark(site, pool, down=True)
    site.publish({"type": "scaled-down", "environment": site.name, "reason": decision.reason, "at": now,
                  "actions": actions})
    emit("INFO", "GPU pool scaled down", environment=site.name, reason=decision.reason, actions=actions)
    return decision, actions


def wake(site) -> bool:
    """Record a train message's acceptance and bring a scaled-down pool back; True if it was down.

    A wake that stopped part way (`scaled` false) is finished by the message's redelivery.
    """
    pool = PoolState.of(site)
    for attempt in range(10):
        time.sleep(random.uniform(0, 0.05 * attempt))  # concurrent deliveries of one message take turns
        state, generation = pool.read()
        now = time.time()
        must_scale = bool(state.get("scaled_down")) or not state.get("scaled", True)
        woken = {**state, "accepted_at": now,
                 **({"scaled_down": False, "since": None, "woken_at": now, "scaled": False} if must_scale else {})}
        if pool.write(woken, generation):
            if must_scale:
                _scale_and_mark(site, pool, down=False)
                site.publish({"type": "woken", "environment": site.name, "at": now})
                emit("INFO", "GPU pool woken for a train message", environment=site.name)
            return must_scale
    raise RuntimeError(f"{pool.blob.name} keeps changing; the message will be delivered again")


def _scale_and_mark(site, pool: PoolState, down: bool) -> None:
    """Scale, then record that the scale finished, unless the other side has changed the wish meanwhile."""
    _scale(site, down)
    state, generation = pool.read()
    if bool(state.get("scaled_down")) == down:
        pool.write({**state, "scaled": True}, generation)


def _actions(site, down: bool) -> list[str]:
    from rlops.spec.model import LocalEnvironment

    env = site.env
    if isinstance(env, LocalEnvironment):
        verb = "stop" if down else "start"
        return [f"{verb} Ray worker node ray-worker-{i} ({env.local.gpu_pool.resource})"
                for i in range(env.local.gpu_pool.workers)]
    size = lambda pool: 0 if down else pool.ray_worker_replicas  # noqa: E731
    actions = [f"RayCluster {env.ray.cluster_name}: worker group {p.name} to {size(p)} replicas"
               for p in env.gpu_pools] if "ray-workers" in env.idle.scale_down else []
    actions += [f"node pool {p.name}: resize to {size(p)} nodes" for p in env.gpu_pools
                if "node-pools" in env.idle.scale_down]
    return actions


def _scale(site, down: bool) -> None:
    from rlops.spec.model import LocalEnvironment

    if isinstance(site.env, LocalEnvironment):
        from rlops.local.stack import Stack

        stack = Stack(site.name, site.env, lambda line: emit("INFO", line))
        stack.stop_pool() if down else stack.start_pool()
        return
    _scale_gke(site, down)


def _scale_gke(site, down: bool) -> None:
    from rlops.cloud.container import ContainerAdapter
    from rlops.kube.cluster import Ref, connect
    from rlops.provision.service import connection_from_environment, target_of

    env = site.env
    adapter = ContainerAdapter(target_of(site.name, env), connection_from_environment())
    cluster = adapter.read("cluster", env.cluster.name, {})
    if "ray-workers" in env.idle.scale_down and cluster is not None:
        api = connect(cluster.fields.get("dns_endpoint_host"))
        ref = Ref("RayCluster", env.ray.cluster_name, env.ray.namespace)
        sizes = {p.name: 0 if down else p.ray_worker_replicas for p in env.gpu_pools}
        api.set_worker_replicas(ref, sizes)
    if "node-pools" in env.idle.scale_down:
        for pool in env.gpu_pools:
            adapter.resize_pool(pool.name, 0 if down else pool.autoscaling.min_nodes or pool.ray_worker_replicas)
