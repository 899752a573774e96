"""A GKE environment's cluster as its runs reach it: the API server (through its DNS endpoint, with the caller's
Google token), the Ray head through the API server's service proxy, the GPU node pools (scaled by the reaper and
the wake) and why the GPU workers are not up. `rlops.sites` wires one into a GKE environment's `Site`."""

from rlops import waiting as workers_waiting
from rlops.cloud.base import Connection, Target
from rlops.cloud.container import Clusters, NodePools
from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.kube.cluster import connect, kubernetes_needs, ray_dashboard
from rlops.kube.objects import Ref
from rlops.kube.readiness import RAY_CLUSTER_LABEL
from rlops.permissions import requires
from rlops.spec.model import GcpEnvironment

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"  # on every GKE node: its node pool


class ScaleFailed(Failure):
    pass


class GkeCluster:
    """The cluster of the GKE environment at `target` (its name, project, location and cluster)."""

    RESIZE_TIMEOUT_SECONDS = 400.0  # a tick runs in a function with 540 s; a longer resize is finished next tick

    def __init__(self, target: Target, env: GcpEnvironment, endpoints: Endpoints):
        self.name, self.env, self.endpoints = target.environment, env, endpoints
        self.connection = Connection.to(endpoints)
        self.clusters, self.node_pools = Clusters(target, self.connection), NodePools(target, self.connection)

    def _endpoint(self) -> str | None:
        """The API server's DNS endpoint; None while the cluster does not exist."""
        cluster = self.clusters.read("cluster", self.env.cluster.name, {})
        return None if cluster is None else cluster.fields.get("dns_endpoint_host")

    def dashboard(self) -> tuple[str, dict[str, str]]:
        endpoint = self._endpoint()
        if endpoint is None:
            raise Failure(f"environment {self.name}: cluster {self.env.cluster.name} does not exist; "
                          f"run `rlops apply {self.name}`")
        return ray_dashboard(endpoint, self.env.ray.namespace, self.env.ray.cluster_name, self.endpoints)

    def scale(self, down: bool) -> None:
        """The RayCluster's GPU worker groups and the GPU node pools, as the spec's `idle.scale_down` says."""
        env = self.env
        endpoint = self._endpoint()
        if "ray-workers" in env.idle.scale_down and endpoint is not None:
            sizes = {p.name: 0 if down else p.ray_worker_replicas for p in env.reapable_pools}
            ray_cluster = Ref("RayCluster", env.ray.cluster_name, env.ray.namespace)
            connect(endpoint, self.endpoints).set_worker_replicas(ray_cluster, sizes)
        if "node-pools" in env.idle.scale_down:
            for pool in env.reapable_pools:  # one at a time: GKE refuses a second operation on a cluster at once
                size = 0 if down else pool.awake_nodes
                error = self.node_pools.resize(pool.name, size).wait(self.RESIZE_TIMEOUT_SECONDS)
                if error:
                    raise ScaleFailed(f"node pool {pool.name}: resize to {size} nodes failed: {error}")

    @requires(*kubernetes_needs(("pods", "events"), "list"))
    def waiting(self, pool_scaled_down: bool) -> str | None:
        """Why the RayCluster's GPU workers are not all up, from the pods, their events, the node pools and their
        reservations (each read only when a worker is missing); None when they are up, or there is no cluster."""
        env = self.env
        endpoint = self._endpoint()
        if endpoint is None:
            return None
        api = connect(endpoint, self.endpoints)
        workers = workers_waiting.GkeWorkers(
            wanted={pool.name: pool.ray_worker_replicas for pool in env.gpu_pools},
            pods=api.list_labelled("Pod", {RAY_CLUSTER_LABEL: env.ray.cluster_name,
                                           workers_waiting.NODE_TYPE_LABEL: "worker"}, env.ray.namespace),
            pool_scaled_down=pool_scaled_down)
        if pool_scaled_down or not workers_waiting.missing(workers):
            return workers_waiting.on_gke(workers)
        workers.events = api.list_labelled("Event", {}, env.ray.namespace, fields={"involvedObject.kind": "Pod"})
        workers.pool_problems = self.node_pools.problems([pool.name for pool in env.gpu_pools])
        from rlops.cloud import compute  # noqa: PLC0415 cold start: google-cloud-compute loads for seconds

        for pool in env.gpu_pools:
            if pool.reservation and (found := compute.reservation(self.connection, env.project.id, env.zone,
                                                                  pool.reservation)):
                reserved = found.specific_reservation
                workers.reservations[pool.name] = (pool.reservation, reserved.count - reserved.in_use_count,
                                                   reserved.count)
        return workers_waiting.on_gke(workers)

    @requires(*kubernetes_needs(("pods", "events", "nodes"), "list"))
    def wake_phases(self, wakes: list[float]) -> dict[float, list[tuple[str, float, float]]]:
        """Each wake phase by phase so far, from the GPU pools' resize operations, their Node objects, the worker
        pods and the kubelet's events about them, read once (rlops.waiting.gke_phases)."""
        env = self.env
        endpoint = self._endpoint()
        if endpoint is None:
            return dict.fromkeys(wakes, [])
        api = connect(endpoint, self.endpoints)
        pools = [pool.name for pool in env.gpu_pools]
        nodes = [node for pool in pools for node in api.list_labelled("Node", {GKE_NODEPOOL_LABEL: pool})]
        pods = api.list_labelled("Pod", {RAY_CLUSTER_LABEL: env.ray.cluster_name,
                                         workers_waiting.NODE_TYPE_LABEL: "worker"}, env.ray.namespace)
        events = api.list_labelled("Event", {}, env.ray.namespace, fields={"involvedObject.kind": "Pod"})
        resizes = self.node_pools.resizes(pools) if "node-pools" in env.idle.scale_down else []
        return {at: workers_waiting.gke_phases(at, env.woken_workers, resizes, nodes, pods, events) for at in wakes}
