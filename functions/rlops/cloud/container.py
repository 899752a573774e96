"""GKE: the cluster (with its system pool) and the GPU node pools (google-cloud-container, REST).

One handler per kind (`Clusters`, `NodePools`), each following `cloud.base.ResourceAdapter`; both read
through the one list of the location's clusters (each carries its node pools), which the engine makes
once for every environment of the project.
"""

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from google.api_core import exceptions as gexc
from google.cloud import container_v1 as gke
from google.rpc import code_pb2

from rlops.cloud.base import Connection, Pending, Read, Target, call, get_or_none, last_segment
from rlops.permissions import Need, Scope, calls
from rlops.resource_shapes import Live, Resource

API = "container"
RECENT_OPERATION = timedelta(hours=1)  # an older failure of a node pool's operation no longer says why it waits
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# A cluster or node pool that names a node service account is created only by a caller who may act as it
# (cloud.google.com/kubernetes-engine/docs/how-to/service-accounts).
ACT_AS_NODES = (Need("iam.serviceAccounts.actAs", Scope.NODE_SERVICE_ACCOUNT),)
_SETTLED = {gke.Cluster.Status.RUNNING, gke.Cluster.Status.ERROR, gke.Cluster.Status.DEGRADED}
_POOL_SETTLED = {gke.NodePool.Status.RUNNING, gke.NodePool.Status.RUNNING_WITH_ERROR, gke.NodePool.Status.ERROR}


class _Gke:
    """What the two kinds share: the client, the paths, the list of the location's clusters, operations."""

    kind: str

    def __init__(self, target: Target, connection: Connection):
        self.target = target
        self.client = connection.gapic(API, gke.ClusterManagerClient)

    @property
    def _location(self) -> str:
        return f"projects/{self.target.project}/locations/{self.target.region}"

    def _cluster_path(self, name: str | None = None) -> str:
        return f"{self._location}/clusters/{name or self.target.cluster}"

    def _pool_path(self, pool: str, cluster: str | None = None) -> str:
        return f"{self._cluster_path(cluster)}/nodePools/{pool}"

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,)

    # -- read -------------------------------------------------------------------------------
    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        """The list of the location's clusters, with their node pools: one call for every cluster and pool."""
        return [Read((API, self._location), self._clusters, lambda found: self._pick(found, wanted))]

    def _pick(self, found: dict[str, gke.Cluster], wanted: list[tuple[str, str, dict]]) -> dict[str, Live | None]:
        raise NotImplementedError

    @calls("container.projects.locations.clusters.list")
    def _clusters(self) -> dict[str, gke.Cluster]:
        def listed() -> list[gke.Cluster]:
            answer = self.client.list_clusters(parent=self._location)
            if answer.missing_zones:  # a partial list would plan an existing cluster as new; retried as a 503 is
                raise gexc.ServiceUnavailable(f"zones {', '.join(answer.missing_zones)} did not answer")
            return list(answer.clusters)

        return {cluster.name: cluster for cluster in call(API, f"list clusters in {self.target.region}", listed)}

    def _cluster_live(self, cluster: gke.Cluster, fields: dict) -> Live:
        live, path = self._cluster_fields(cluster, fields), self._cluster_path(cluster.name)
        if cluster.status not in _SETTLED:
            live = replace(live, settling=Pending(f"cluster {cluster.name} is {cluster.status.name}", lambda: (
                call(API, f"get cluster {cluster.name}", self.client.get_cluster, name=path).status in _SETTLED, None)))
        return live

    def _pool_live(self, pool: gke.NodePool, fields: dict, path: str) -> Live:
        live = self._pool_fields(pool, fields)
        if pool.status not in _POOL_SETTLED:
            live = replace(live, settling=Pending(f"node pool {pool.name} is {pool.status.name}", lambda: (
                call(API, f"get node pool {pool.name}", self.client.get_node_pool, name=path).status in _POOL_SETTLED,
                None)))
        return live

    def _cluster_fields(self, cluster: gke.Cluster, wanted: dict) -> Live:
        addons = cluster.addons_config
        version = cluster.current_master_version
        minimum = wanted.get("min_master_version")
        return Live({
            "location": cluster.location, "network": last_segment(cluster.network),
            "workload_pool": cluster.workload_identity_config.workload_pool or None,
            "datapath_provider": cluster.network_config.datapath_provider.name,
            "enable_multi_networking": cluster.network_config.enable_multi_networking,
            "use_ip_aliases": cluster.ip_allocation_policy.use_ip_aliases,
            "release_channel": cluster.release_channel.channel.name,
            # A minimum version is met by any version it prefixes (1.33 by 1.33.2-gke.1475000).
            "min_master_version": minimum if minimum and version.startswith(minimum) else version or None,
            "ray_operator": addons.ray_operator_config.enabled,
            "lustre_csi_driver": addons.lustre_csi_driver_config.enabled,
            "lustre_legacy_port": addons.lustre_csi_driver_config.enable_legacy_lustre_port,
            "lustre_multi_nic": not addons.lustre_csi_driver_config.disable_multi_nic,
            "dns_endpoint": cluster.control_plane_endpoints_config.dns_endpoint_config.allow_external_traffic,
            # Not a setting: where rlops reaches the Kubernetes API.
            "dns_endpoint_host": cluster.control_plane_endpoints_config.dns_endpoint_config.endpoint or None,
        }, self.target.owns_labels(cluster.resource_labels))

    def _pool_fields(self, pool: gke.NodePool, wanted: dict) -> Live:
        config = pool.config
        accelerator = config.accelerators[0] if config.accelerators else None
        affinity = config.reservation_affinity
        specific = affinity.consume_reservation_type == gke.ReservationAffinity.Type.SPECIFIC_RESERVATION
        return Live({
            "cluster": wanted.get("cluster", self.target.cluster), "machine_type": config.machine_type,
            "disk_size_gb": config.disk_size_gb,
            "accelerator_type": accelerator.accelerator_type if accelerator else None,
            "accelerator_count": accelerator.accelerator_count if accelerator else 0,
            "gpu_driver_version": (accelerator.gpu_driver_installation_config.gpu_driver_version.name
                                   if accelerator else None),
            "reservation": affinity.values[0] if specific and affinity.values else None,
            "spot": config.spot,
            "additional_networks": [[last_segment(n.network), last_segment(n.subnetwork)]
                                    for n in pool.network_config.additional_node_network_configs],
            "placement_type": pool.placement_policy.type_.name,
            "placement_policy": pool.placement_policy.policy_name,
            "node_locations": list(pool.locations),
            "autoscaling": pool.autoscaling.enabled,
            "min_nodes": pool.autoscaling.min_node_count if pool.autoscaling.enabled else None,
            "max_nodes": pool.autoscaling.max_node_count if pool.autoscaling.enabled else None,
            "image_streaming": config.gcfs_config.enabled,
        }, self.target.owns_labels(config.resource_labels))

    def _sequence(self, description: str, updates: list[tuple[str, Callable[[], gke.Operation]]]) -> Pending:
        """Each (what, start) in turn, the next started once the last is done: GKE runs one operation per cluster."""
        remaining = list(updates)
        current: list[Pending] = []

        def poll() -> tuple[bool, str | None]:
            if current:
                done, error = current[0].poll()
                if not done or error:
                    return done, error
                current.clear()
            if not remaining:
                return True, None
            what, start = remaining.pop(0)
            current.append(self._wait(call(API, what, start)))
            return False, None

        return Pending(description, poll)

    # -- request pieces ---------------------------------------------------------------------
    def _node_pool(self, name: str, d: dict, labels: dict) -> gke.NodePool:
        config = gke.NodeConfig(machine_type=d["machine_type"], disk_size_gb=d["disk_size_gb"], spot=d["spot"],
                                resource_labels=labels)
        if d["accelerator_type"]:
            config.accelerators = [gke.AcceleratorConfig(
                accelerator_type=d["accelerator_type"], accelerator_count=d["accelerator_count"],
                gpu_driver_installation_config=gke.GPUDriverInstallationConfig(
                    gpu_driver_version=gke.GPUDriverInstallationConfig.GPUDriverVersion[_driver(d["gpu_driver_version"])]))]
            config.gvnic = gke.VirtualNIC(enabled=True)
        if d.get("image_streaming"):
            config.gcfs_config = gke.GcfsConfig(enabled=True)
        if d["reservation"]:
            config.reservation_affinity = gke.ReservationAffinity(
                consume_reservation_type=gke.ReservationAffinity.Type.SPECIFIC_RESERVATION, key=RESERVATION_KEY,
                values=[d["reservation"]])
        pool = gke.NodePool(name=name, config=config, initial_node_count=d["initial_node_count"])
        if d["autoscaling"]:
            pool.autoscaling = self._autoscaling(d)
        if d["node_locations"]:
            pool.locations = d["node_locations"]
        if d.get("placement_type", "TYPE_UNSPECIFIED") != "TYPE_UNSPECIFIED":
            pool.placement_policy = gke.NodePool.PlacementPolicy(
                type_=gke.NodePool.PlacementPolicy.Type[d["placement_type"]], policy_name=d["placement_policy"])
        if d["additional_networks"]:
            pool.network_config = gke.NodeNetworkConfig(additional_node_network_configs=[
                gke.AdditionalNodeNetworkConfig(network=network, subnetwork=subnetwork)
                for network, subnetwork in d["additional_networks"]])
        return pool

    @staticmethod
    def _autoscaling(d: dict) -> gke.NodePoolAutoscaling:
        return gke.NodePoolAutoscaling(enabled=True, min_node_count=d["min_nodes"], max_node_count=d["max_nodes"])

    @staticmethod
    def _addons(d: dict) -> gke.AddonsConfig:
        # enable_legacy_lustre_port is deprecated too: false (left out of the request) but for an existing
        # instance made with gke-support-enabled, which "requires" it on every node version (its proto comment).
        return gke.AddonsConfig(
            ray_operator_config=gke.RayOperatorConfig(enabled=d["ray_operator"]),
            lustre_csi_driver_config=gke.LustreCsiDriverConfig(enabled=d["lustre_csi_driver"],
                                                               enable_legacy_lustre_port=d["lustre_legacy_port"],
                                                               disable_multi_nic=not d["lustre_multi_nic"]))

    @staticmethod
    def _endpoints(d: dict) -> gke.ControlPlaneEndpointsConfig:
        return gke.ControlPlaneEndpointsConfig(
            dns_endpoint_config=gke.ControlPlaneEndpointsConfig.DNSEndpointConfig(allow_external_traffic=d["dns_endpoint"]))

    def _wait(self, operation: gke.Operation) -> Pending:
        path = f"{self._location}/operations/{operation.name}"

        def poll() -> tuple[bool, str | None]:
            current = call(API, f"get operation {operation.name}", self.client.get_operation, name=path)
            if current.status != gke.Operation.Status.DONE:
                return False, None
            error = current.error.message if current.error and current.error.message else None
            return True, error or None

        return Pending(f"GKE operation {operation.name} ({operation.operation_type.name.lower()})", poll)


class Clusters(_Gke):
    kind = "cluster"

    def _pick(self, found: dict[str, gke.Cluster], wanted: list[tuple[str, str, dict]]) -> dict[str, Live | None]:
        return {f"cluster/{name}": self._cluster_live(found[name], fields) if name in found else None
                for _, name, fields in wanted}

    @calls("container.projects.locations.clusters.get")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        cluster = get_or_none(API, f"get cluster {name}", self.client.get_cluster, name=self._cluster_path(name))
        return None if cluster is None else self._cluster_live(cluster, fields)

    @calls("container.projects.locations.clusters.create", "container.projects.locations.operations.get",
           also=ACT_AS_NODES)
    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        cluster = gke.Cluster(
            name=resource.name, network=d["network"], resource_labels=resource.labels,
            workload_identity_config=gke.WorkloadIdentityConfig(workload_pool=d["workload_pool"] or ""),
            network_config=gke.NetworkConfig(datapath_provider=gke.DatapathProvider[d["datapath_provider"]],
                                             enable_multi_networking=d["enable_multi_networking"]),
            ip_allocation_policy=gke.IPAllocationPolicy(use_ip_aliases=d["use_ip_aliases"]),
            release_channel=gke.ReleaseChannel(channel=gke.ReleaseChannel.Channel[d["release_channel"]]),
            initial_cluster_version=d["min_master_version"] or "",
            addons_config=self._addons(d),
            control_plane_endpoints_config=self._endpoints(d),
            node_pools=[self._node_pool(d["system_pool"].get("name", "default-pool"), d["system_pool"],
                                        resource.labels)],
        )
        return self._wait(call(API, f"create cluster {resource.name}", self.client.create_cluster,
                               parent=self._location, cluster=cluster))

    @calls("container.projects.locations.clusters.update", "container.projects.locations.operations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d, name = resource.desired, resource.name
        # GKE applies one desired_* field per update call, so each changed group is its own operation.
        updates = []
        if {"ray_operator", "lustre_csi_driver", "lustre_legacy_port", "lustre_multi_nic"} & set(changed):
            updates.append(("add-ons", gke.ClusterUpdate(desired_addons_config=self._addons(d))))
        if "release_channel" in changed:
            updates.append(("release channel", gke.ClusterUpdate(
                desired_release_channel=gke.ReleaseChannel(channel=gke.ReleaseChannel.Channel[d["release_channel"]]))))
        if "workload_pool" in changed:
            updates.append(("workload identity", gke.ClusterUpdate(
                desired_workload_identity_config=gke.WorkloadIdentityConfig(workload_pool=d["workload_pool"] or ""))))
        if "dns_endpoint" in changed:
            updates.append(("DNS endpoint",
                            gke.ClusterUpdate(desired_control_plane_endpoints_config=self._endpoints(d))))
        if "min_master_version" in changed:
            updates.append(("version", gke.ClusterUpdate(desired_master_version=d["min_master_version"])))
        path = self._cluster_path(name)
        return self._sequence(f"cluster {name} updates", [
            (f"update {what} of cluster {name}",
             lambda update=update: self.client.update_cluster(name=path, update=update)) for what, update in updates])

    @calls("container.projects.locations.clusters.delete", "container.projects.locations.operations.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        return self._wait(call(API, f"delete cluster {name}", self.client.delete_cluster,
                               name=self._cluster_path(name)))


class NodePools(_Gke):
    kind = "node_pool"

    def _pick(self, found: dict[str, gke.Cluster], wanted: list[tuple[str, str, dict]]) -> dict[str, Live | None]:
        read: dict[str, Live | None] = {}
        for _, pool, fields in wanted:  # a pool of a cluster the spec no longer names (a recorded one) too
            cluster = fields.get("cluster", self.target.cluster)
            live = {p.name: p for p in found[cluster].node_pools} if cluster in found else {}
            read[f"node_pool/{pool}"] = (self._pool_live(live[pool], fields, self._pool_path(pool, cluster))
                                         if pool in live else None)
        return read

    @calls("container.projects.locations.clusters.nodePools.get")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        path = self._pool_path(name, fields.get("cluster"))
        pool = get_or_none(API, f"get node pool {name}", self.client.get_node_pool, name=path)
        return None if pool is None else self._pool_live(pool, fields, path)

    @calls("container.projects.locations.clusters.nodePools.create", "container.projects.locations.operations.get",
           also=ACT_AS_NODES)
    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        operation = call(API, f"create node pool {resource.name}", self.client.create_node_pool,
                         parent=self._cluster_path(d["cluster"]),
                         node_pool=self._node_pool(resource.name, d, resource.labels))
        return self._wait(operation)

    @calls("container.projects.locations.clusters.nodePools.update",
           "container.projects.locations.clusters.nodePools.setAutoscaling",
           "container.projects.locations.operations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d, name = resource.desired, resource.name
        path, updates = self._pool_path(name, d["cluster"]), []
        if "node_locations" in changed:
            # `locations` alone, as the Terraform Google provider sends it: GKE adds and removes nodes to match.
            request = gke.UpdateNodePoolRequest(name=path, locations=d["node_locations"])
            updates.append((f"move node pool {name} to {', '.join(d['node_locations'])}",
                            lambda request=request: self.client.update_node_pool(request=request)))
        if "image_streaming" in changed:
            # gcfsConfig alone in its request, as `locations` above: one change per nodePools.update.
            request = gke.UpdateNodePoolRequest(name=path, gcfs_config=gke.GcfsConfig(enabled=d["image_streaming"]))
            updates.append((f"{'enable' if d['image_streaming'] else 'disable'} image streaming on node pool {name}",
                            lambda request=request: self.client.update_node_pool(request=request)))
        if {"autoscaling", "min_nodes", "max_nodes"} & set(changed):
            request = gke.SetNodePoolAutoscalingRequest(name=path, autoscaling=self._autoscaling(d))
            updates.append((f"set autoscaling of node pool {name}",
                            lambda request=request: self.client.set_node_pool_autoscaling(request=request)))
        return self._sequence(f"node pool {name} updates", updates)

    @calls("container.projects.locations.clusters.nodePools.delete", "container.projects.locations.operations.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        return self._wait(call(API, f"delete node pool {name}", self.client.delete_node_pool,
                               name=self._pool_path(name, fields.get("cluster"))))

    @calls("container.projects.locations.clusters.nodePools.get", "container.projects.locations.operations.list")
    def problems(self, names: list[str]) -> dict[str, str]:
        """What GKE says is wrong with each of these node pools: its error status and conditions (a stockout, a
        quota), else the error of its latest operation if that failed within the hour (a resize that met a
        stockout leaves the pool RUNNING). Pools with nothing wrong, or that do not exist, are left out."""
        found, healthy = {}, []
        for name in names:
            pool = get_or_none(API, f"get node pool {name}", self.client.get_node_pool, name=self._pool_path(name))
            if pool is None:
                continue
            codes = {c.message: _condition_code(c) for c in pool.conditions}
            said = [f"{message} ({code})" if code else message for message, code in codes.items()]
            failing = pool.status in (gke.NodePool.Status.ERROR, gke.NodePool.Status.RUNNING_WITH_ERROR)
            if failing and pool.status_message and pool.status_message not in codes:
                said.insert(0, pool.status_message)
            if said or failing:
                found[name] = f"{pool.status.name}: " * failing + "; ".join(said)
            else:
                healthy.append(name)
        if healthy:  # one list of the location's operations for all of them
            operations = call(API, f"list the operations of {self.target.region}", self.client.list_operations,
                              parent=self._location).operations
            for name in healthy:
                mine = [op for op in operations if op.target_link.endswith(f"/nodePools/{name}")]
                latest = max(mine, key=lambda op: op.start_time, default=None)  # RFC 3339 UTC: sorts as text
                if latest is not None and latest.status == gke.Operation.Status.DONE and latest.error.message and \
                        datetime.now(UTC) - _time(latest.start_time) <= RECENT_OPERATION:
                    found[name] = f"its last operation ({latest.operation_type.name}) failed: {latest.error.message}"
        return found

    @calls("container.projects.locations.operations.list")
    def resizes(self, names: list[str]) -> list[tuple[float, float | None]]:
        """When each resize of these node pools GKE still lists ran: (start, end or None while running), in epoch
        seconds, for measuring a wake."""
        operations = call(API, f"list the operations of {self.target.region}", self.client.list_operations,
                          parent=self._location).operations
        pools = tuple(f"/nodePools/{name}" for name in names)
        return [(_time(op.start_time).timestamp(), _time(op.end_time).timestamp() if op.end_time else None)
                for op in operations if op.operation_type == gke.Operation.Type.SET_NODE_POOL_SIZE
                and op.target_link.endswith(pools) and op.start_time]

    @calls("container.projects.locations.clusters.nodePools.setSize", "container.projects.locations.operations.get")
    def resize(self, name: str, node_count: int) -> Pending:
        """The reaper's and the wake's resize: at once, not through the cluster autoscaler."""
        return self._wait(call(API, f"resize node pool {name} to {node_count}", self.client.set_node_pool_size,
                               request=gke.SetNodePoolSizeRequest(name=self._pool_path(name), node_count=node_count)))


HANDLERS = (Clusters, NodePools)


def _driver(version: str) -> str:
    return "INSTALLATION_DISABLED" if version == "DISABLED" else version


def _time(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


def _condition_code(condition: gke.StatusCondition) -> str:
    """GCE_STOCKOUT, GCE_QUOTA_EXCEEDED, ... (the deprecated `code`), else the canonical google.rpc code's name."""
    if condition.code:
        return condition.code.name
    return code_pb2.Code.Name(condition.canonical_code) if condition.canonical_code else ""
