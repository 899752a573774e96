"""Why a run's GPU workers are not up (issue 20, part 3): the one-line cause, locally from Ray's nodes and on GKE
from what the fake API server (its scheduler, autoscaler and kubelet: fakes.kube_scheduling) and the fake GKE
and Compute APIs report."""

import pytest

from rlops import waiting
from rlops.cloud import base
from rlops.endpoints import Endpoints

HEAD = {"node_id": "h", "state": "ALIVE", "is_head_node": True}


def test_a_local_attempt_waits_for_a_gpu_pool_node_and_says_why():
    worker = {"node_id": "w", "state": "ALIVE"}
    assert waiting.on_local([HEAD, worker], False) is None
    assert "the reaper scaled the GPU pool down" in waiting.on_local([HEAD, dict(worker, state="DEAD")], True)
    assert "`rlops up` starts it again" in waiting.on_local([HEAD], False)


def _pod(name: str, group: str = "gpu-pool", phase: str = "Pending", ready: bool = False, **status) -> dict:
    return {"metadata": {"name": name, "labels": {"ray.io/group": group}}, "spec": {"nodeName": f"node-of-{name}"},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       **status}}


def _event(pod: str, reason: str, message: str, at: str = "2026-12-06T10:00:00Z") -> dict:
    return {"involvedObject": {"kind": "Pod", "name": pod}, "reason": reason, "message": message, "lastTimestamp": at}


def test_the_most_specific_gke_cause_wins():
    up = _pod("w1", phase="Running", ready=True)
    workers = waiting.GkeWorkers(wanted={"gpu-pool": 2}, pods=[up, _pod("w2")])
    assert waiting.missing(workers) == {"gpu-pool": 1}
    assert waiting.on_gke(workers) == "1 of 2 GPU nodes not up: worker pods starting (the image pull, then Ray joins)"
    workers.events = [_event("w2", "FailedScheduling", "0/2 nodes are available: ..."),
                      _event("w2", "TriggeredScaleUp", "pod triggered scale-up: [{g 0->1 (max: 1)}]"),
                      _event("w1", "FailedScaleUp", "about another pod, which runs now")]
    assert waiting.on_gke(workers).endswith("TriggeredScaleUp: pod triggered scale-up: [{g 0->1 (max: 1)}]")
    workers.events += [_event("w2", "NotTriggerScaleUp", "pod didn't trigger scale-up: older", "2026-12-06T09:00:00Z"),
                       _event("w2", "NotTriggerScaleUp", "pod didn't trigger scale-up: newer")]
    assert waiting.on_gke(workers).endswith("NotTriggerScaleUp: pod didn't trigger scale-up: newer")
    workers.pool_problems["gpu-pool"] = "no capacity (GCE_STOCKOUT)"
    assert waiting.on_gke(workers).endswith("node pool gpu-pool: no capacity (GCE_STOCKOUT)")
    workers.reservations["gpu-pool"] = ("res", 1, 4)  # one unused: enough for the one missing worker
    assert waiting.on_gke(workers).endswith("node pool gpu-pool: no capacity (GCE_STOCKOUT)")
    workers.reservations["gpu-pool"] = ("res", 0, 4)
    assert waiting.on_gke(workers) == "1 of 2 GPU nodes not up: reservation res has 0 unused of 4"
    workers.pool_scaled_down = True
    assert waiting.on_gke(workers) == f"1 of 2 GPU nodes not up: {waiting.REAPED}"
    assert waiting.on_gke(waiting.GkeWorkers({"gpu-pool": 1}, [up])) is None


def test_a_scheduled_worker_waiting_for_the_nccl_installer_and_a_group_kuberay_has_not_filled():
    installing = _pod("w1", initContainerStatuses=[{"name": waiting.NCCL_INIT_CONTAINER, "state": {"running": {}}}])
    assert "the NCCL gIB installer has not run on node-of-w1" in waiting.on_gke(
        waiting.GkeWorkers({"gpu-pool": 1}, [installing], [_event("w1", "FailedScheduling", "before it was placed")]))
    assert waiting.on_gke(waiting.GkeWorkers({"gpu-pool": 2}, [])) == \
        "2 of 2 GPU nodes not up: KubeRay has made 0 of 2 worker pods (the RayCluster's replicas)"


@pytest.fixture
def h200(cloud_fakes, specs, monkeypatch):
    """The h200 seed applied to the fake GCP and cluster (one reservation-backed pool of two GPU workers)."""
    from rlops import cli, sites
    from rlops.kube.gke_cluster import GkeCluster
    from rlops.provision.service import target_of

    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    assert cli.main(["apply", "--yes", "h200", "--skip-doctor"]) == 0
    env = sites.load_environment("h200")
    return cloud_fakes, GkeCluster(target_of("h200", env), env, Endpoints.from_environment())


PLANTED = {
    "spot or capacity pending": (lambda gcp, kube: None,
                                 "TriggeredScaleUp: pod triggered scale-up: [{gke-gpu-pool-grp 0->1 (max: 1)}]"),
    "the pool at its maximum": (lambda gcp, kube: setattr(kube.scheduling, "scale_up_refused",
                                                          "1 max node group size reached"),
                                "NotTriggerScaleUp: pod didn't trigger scale-up: 1 max node group size reached"),
    "the cloud out of GPUs": (lambda gcp, kube: setattr(kube.scheduling, "scale_up_failed", "GCE out of resources"),
                              "FailedScaleUp: Node scale up in zones us-central1-b associated with this pod failed: "
                              "GCE out of resources. Pod is at risk of not being scheduled."),
    "a stockout on the node pool": (lambda gcp, kube: gcp.node_pool_trouble(
        "gpu-pool", "GCE_STOCKOUT", "Zone us-central1-b does not have enough resources"),
        "node pool gpu-pool: RUNNING_WITH_ERROR: Zone us-central1-b does not have enough resources (GCE_STOCKOUT)"),
    "a wake that met a stockout": (lambda gcp, kube: _failed_resize(gcp), "node pool gpu-pool: its last operation "
                                   "(SET_NODE_POOL_SIZE) failed: ZONE_RESOURCE_POOL_EXHAUSTED: The zone "
                                   "'us-central1-b' does not have enough resources available."),
    "the reservation used up": (lambda gcp, kube: gcp.put_reservation(
        "rlops-h200-example", "us-central1-b", "h200-reservation", "a3-ultragpu-8g", "nvidia-h200-141gb", 8,
        count=4, in_use=4), "reservation h200-reservation has 0 unused of 4"),
}


def _failed_resize(gcp):
    """The reaper's wake (a node pool resize, as GkeCluster.scale sends it) meets a stockout: GKE accepts it and
    the operation ends DONE with the error; the pool itself stays RUNNING."""
    from rlops.cloud.base import Connection
    from rlops.cloud.container import NodePools
    from rlops.provision.service import target_of
    from rlops.sites import load_environment

    gcp.fail_operations(1, "SET_NODE_POOL_SIZE", 8, "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'us-central1-b' does "
                        "not have enough resources available.")
    pools = NodePools(target_of("h200", load_environment("h200")), Connection.to(Endpoints.from_environment()))
    assert pools.resize("gpu-pool", 2).wait(30)  # the error, once the operation is done


@pytest.mark.parametrize("planted", PLANTED)
def test_on_the_fake_gke_a_planted_cause_is_the_one_said_and_only_read(h200, planted):
    (gcp, kube), cluster = h200
    assert cluster.waiting(False) is None  # both workers up
    kube.grant_gpu_nodes(0)
    plant, said = PLANTED[planted]
    plant(gcp, kube)
    gcp_before, kube_before = len(gcp.mutations()), len(kube.writes())
    assert cluster.waiting(False) == f"2 of 2 GPU nodes not up: {said}"
    assert cluster.waiting(True) == f"2 of 2 GPU nodes not up: {waiting.REAPED}"
    assert (len(gcp.mutations()), len(kube.writes())) == (gcp_before, kube_before)  # it only reads


def test_on_the_fake_gke_a_worker_on_a_node_without_the_nccl_installer(h200):
    (gcp, kube), cluster = h200
    kube.grant_gpu_nodes(1)
    kube.scheduling.installer_missing.add("gke-gpu-node-0")
    assert cluster.waiting(False) == (
        "2 of 2 GPU nodes not up: the NCCL gIB installer has not run on gke-gpu-node-0 (the nccl-rdma-installer "
        "DaemonSet); TriggeredScaleUp: pod triggered scale-up: [{gke-gpu-pool-grp 1->2 (max: 2)}]")
    kube.scheduling.installer_missing.clear()
    assert cluster.waiting(False).startswith("1 of 2 GPU nodes not up: TriggeredScaleUp")


def test_a_local_worker_told_to_join_late_and_the_gates_wait_are_said_with_when_they_end():
    """Issue 32: a GPU-pool node started with local.gpu_pool.join_delay, and the attempt's gate waiting for its
    GPUs (its last `[rlops-wait]` line), each say until when."""
    at = 1_700_000_000.0  # 22:13:20 UTC
    assert waiting.on_local([HEAD], False, {"ray-worker-0": at}) == (
        "no GPU-pool node is up: ray-worker-0 was started and joins Ray at about 22:13:20 UTC "
        "(local.gpu_pool.join_delay)")
    assert waiting.on_local([HEAD, {"node_id": "w", "state": "ALIVE"}], False, {"ray-worker-0": at}) is None
    line = {"resource": "gpu_pool", "have": 0.0, "need": 1.0, "waited": 15, "until": at + 60}
    assert waiting.in_gate(line) == ("the attempt's gate waits for 1 gpu_pool (Ray has 0) until 22:14:20 UTC, then "
                                     "the attempt is retried")
    assert waiting.in_gate({**line, "got": True}) is None and waiting.in_gate(None) is None
    assert waiting.in_gate({"backoff": 30, "until": at}) == ("the attempt's gate backs off until 22:13:20 UTC: the "
                                                            "GPUs did not come for the one before")
