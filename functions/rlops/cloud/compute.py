"""Compute Engine: networks, subnetworks, firewalls, global addresses and resource policies (google-cloud-compute,
REST).

One handler per kind (`HANDLERS`), each following `cloud.base.ResourceAdapter`; what they share (the
list read, the get, the delete, waiting on an operation) is `_ComputeKind`.
"""

from typing import Generic, TypeVar

from google.api_core.extended_operation import ExtendedOperation
from google.cloud import compute_v1

from rlops.cloud.base import (
    QUOTA_HINT,
    Connection,
    Pending,
    Read,
    Target,
    call,
    from_projects,
    get_or_none,
    last_segment,
)
from rlops.permissions import calls
from rlops.resource_shapes import Live, Resource

API = "compute"
Item = TypeVar("Item")  # the kind's compute_v1 message (compute_v1.Network, ...)


class _ComputeKind(Generic[Item]):
    kind: str
    client_class: type
    argument: str          # the resource's name in the client's calls: network=, firewall=, ...
    collection: str        # its REST collection, as IAM's tables name its methods (compute.COLLECTION.insert)
    regional: bool = False
    operations = "globalOperations"

    def __init__(self, target: Target, connection: Connection):
        self.target = target
        self.client = connection.gapic(API, self.client_class)
        # Our own operation clients: ExtendedOperation.result() ignores a custom endpoint (feasibility §2, gotcha 5).
        self.global_operations = connection.gapic(API, compute_v1.GlobalOperationsClient)
        self.region_operations = connection.gapic(API, compute_v1.RegionOperationsClient)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,)

    def _where(self, fields: dict) -> dict:
        return {"project": self.target.project, **({"region": fields["region"]} if self.regional else {})}

    def _network_url(self, name: str) -> str:
        return f"projects/{self.target.project}/global/networks/{name}"

    # -- read -------------------------------------------------------------------------------
    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        """One list call per kind (and region) instead of a get per resource, shared by the project's environments."""
        groups: dict[str | None, set[str]] = {}
        for _, name, fields in wanted:
            groups.setdefault(fields.get("region") if self.regional else None, set()).add(name)
        return [Read((API, self.target.project, self.kind, region), lambda region=region: self._list(region),
                     lambda listed, names=names: {f"{self.kind}/{name}": self.live(listed[name]) if name in listed
                                                  else None for name in names})
                for region, names in groups.items()]

    @calls("compute.{collection}.list")
    def _list(self, region: str | None) -> dict:
        where = {"project": self.target.project, **({"region": region} if self.regional else {})}
        return {item.name: item for item in call(API, f"list {self.kind}s", lambda: list(self.client.list(**where)))}

    @calls("compute.{collection}.get")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        found = get_or_none(API, f"get {kind} {name}", self.client.get, **self._where(fields), **{self.argument: name})
        return None if found is None else self.live(found)

    def live(self, item: Item) -> Live:
        raise NotImplementedError

    # -- create / update / delete -----------------------------------------------------------
    @calls("compute.{collection}.insert", "compute.{operations}.get")
    def _insert(self, resource: Resource, body: Item) -> Pending:
        where = self._where(resource.desired)
        operation = call(API, f"insert {self.kind} {resource.name}", self.client.insert, **where,
                         **{f"{self.argument}_resource": body})
        return self._operation(operation, where)

    def update(self, resource: Resource, changed: list[str]) -> Pending:
        raise ValueError(f"{self.kind} has no in-place update")  # the plan replaces these

    @calls("compute.{collection}.delete", "compute.{operations}.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        where = self._where(fields)
        return self._operation(call(API, f"delete {kind} {name}", self.client.delete, **where,
                                    **{self.argument: name}), where)

    def _operation(self, operation: ExtendedOperation, where: dict) -> Pending:
        name = operation.name
        if self.regional:
            get = lambda: self.region_operations.get(**where, operation=name)  # noqa: E731
        else:
            get = lambda: self.global_operations.get(**where, operation=name)  # noqa: E731
        return Pending(f"compute operation {name}", lambda: _status(call(API, f"get operation {name}", get)))


class Networks(_ComputeKind[compute_v1.Network]):
    kind, client_class, argument, collection = "network", compute_v1.NetworksClient, "network", "networks"

    def live(self, item: compute_v1.Network) -> Live:
        return Live({"auto_create_subnetworks": item.auto_create_subnetworks, "mtu": item.mtu,
                     "network_profile": from_projects(item.network_profile) if item.network_profile else None,
                     "routing_mode": item.routing_config.routing_mode or None},
                    self.target.owns_description(item.description))

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        body = compute_v1.Network(name=resource.name, description=self.target.description,
                                  auto_create_subnetworks=d["auto_create_subnetworks"], mtu=d["mtu"],
                                  routing_config=compute_v1.NetworkRoutingConfig(routing_mode=d["routing_mode"]))
        if d["network_profile"]:
            body.network_profile = d["network_profile"]
        return self._insert(resource, body)

    @calls("compute.networks.patch", "compute.globalOperations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d, name = resource.desired, resource.name
        body = compute_v1.Network(mtu=d["mtu"],
                                  routing_config=compute_v1.NetworkRoutingConfig(routing_mode=d["routing_mode"]))
        where = self._where(d)
        return self._operation(call(API, f"patch network {name}", self.client.patch, **where, network=name,
                                    network_resource=body), where)


class Subnetworks(_ComputeKind[compute_v1.Subnetwork]):
    kind, client_class, argument, collection = "subnetwork", compute_v1.SubnetworksClient, "subnetwork", "subnetworks"
    regional, operations = True, "regionOperations"

    def live(self, item: compute_v1.Subnetwork) -> Live:
        return Live({"network": last_segment(item.network), "region": last_segment(item.region),
                     "ip_cidr_range": item.ip_cidr_range}, self.target.owns_description(item.description))

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        return self._insert(resource, compute_v1.Subnetwork(
            name=resource.name, description=self.target.description, network=self._network_url(d["network"]),
            ip_cidr_range=d["ip_cidr_range"]))


class Firewalls(_ComputeKind[compute_v1.Firewall]):
    kind, client_class, argument, collection = "firewall", compute_v1.FirewallsClient, "firewall", "firewalls"

    def live(self, item: compute_v1.Firewall) -> Live:
        allowed = [[rule.I_p_protocol, *rule.ports] for rule in item.allowed]
        return Live({"network": last_segment(item.network), "direction": item.direction,
                     "source_ranges": list(item.source_ranges), "allowed": allowed},
                    self.target.owns_description(item.description))

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        return self._insert(resource, compute_v1.Firewall(
            name=resource.name, description=self.target.description, network=self._network_url(d["network"]),
            direction=d["direction"], source_ranges=d["source_ranges"], allowed=_allowed(d["allowed"])))

    @calls("compute.firewalls.patch", "compute.globalOperations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d, name = resource.desired, resource.name
        # `name` is required in a patch body too (compute.v1 discovery: Firewall.name annotations.required).
        body = compute_v1.Firewall(name=name, source_ranges=d["source_ranges"], allowed=_allowed(d["allowed"]))
        where = self._where(d)
        return self._operation(call(API, f"patch firewall {name}", self.client.patch, **where, firewall=name,
                                    firewall_resource=body), where)


class Addresses(_ComputeKind[compute_v1.Address]):
    kind, client_class, argument, collection = "address", compute_v1.GlobalAddressesClient, "address", "globalAddresses"

    def live(self, item: compute_v1.Address) -> Live:
        return Live({"network": last_segment(item.network), "purpose": item.purpose,
                     "address_type": item.address_type, "prefix_length": item.prefix_length,
                     "address": item.address}, self.target.owns_description(item.description))

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        # The range's base is the spec's: the LNet firewall admits this range, so Google may not pick another.
        return self._insert(resource, compute_v1.Address(
            name=resource.name, description=self.target.description, network=self._network_url(d["network"]),
            purpose=d["purpose"], address_type=d["address_type"], prefix_length=d["prefix_length"],
            address=d["address"]))


class ResourcePolicies(_ComputeKind[compute_v1.ResourcePolicy]):
    """A GPU pool's workload policy (A4X's NVLink domain), which its node pool names in placementPolicy.policyName."""

    kind, client_class, argument = "resource_policy", compute_v1.ResourcePoliciesClient, "resource_policy"
    collection, regional, operations = "resourcePolicies", True, "regionOperations"

    def live(self, item: compute_v1.ResourcePolicy) -> Live:
        return Live({"region": last_segment(item.region), "workload_type": item.workload_policy.type_ or None,
                     "accelerator_topology": item.workload_policy.accelerator_topology or None},
                    self.target.owns_description(item.description))

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        return self._insert(resource, compute_v1.ResourcePolicy(
            name=resource.name, description=self.target.description,
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_=d["workload_type"], accelerator_topology=d["accelerator_topology"])))


HANDLERS = (Networks, Subnetworks, Firewalls, Addresses, ResourcePolicies)


def _status(operation: compute_v1.Operation) -> tuple[bool, str | None]:
    if operation.status != compute_v1.Operation.Status.DONE:
        return False, None
    if operation.error and operation.error.errors:
        said = "; ".join(f"{e.code}: {e.message}" for e in operation.error.errors)
        quota = any(e.code == "QUOTA_EXCEEDED" for e in operation.error.errors)
        return True, f"{said} ({QUOTA_HINT})" if quota else said
    return True, None


def _allowed(rules: list[list[str]]) -> list[compute_v1.Allowed]:
    return [compute_v1.Allowed(I_p_protocol=rule[0], ports=rule[1:]) for rule in rules]


@calls("compute.reservations.get")
def reservation(connection: Connection, project: str, zone: str, name: str) -> compute_v1.Reservation | None:
    """A zone's reservation, None when there is none of that name."""
    client = connection.gapic(API, compute_v1.ReservationsClient)
    return get_or_none(API, f"get reservation {name}", client.get, project=project, zone=zone, reservation=name)
