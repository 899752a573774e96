"""Compute Engine: networks, subnetworks, firewalls and global addresses (google-cloud-compute, REST)."""

from google.cloud import compute_v1

from rlops.cloud.base import Connection, Pending, Read, Target, call, from_projects, get_or_none, last_segment
from rlops.resource_shapes import Live, Resource

API = "compute"


class ComputeAdapter:
    kinds = ("network", "subnetwork", "firewall", "address")

    def __init__(self, target: Target, connection: Connection):
        self.target = target
        self.networks = connection.gapic(API, compute_v1.NetworksClient)
        self.subnetworks = connection.gapic(API, compute_v1.SubnetworksClient)
        self.firewalls = connection.gapic(API, compute_v1.FirewallsClient)
        self.addresses = connection.gapic(API, compute_v1.GlobalAddressesClient)
        # Our own operation clients: ExtendedOperation.result() ignores a custom endpoint (feasibility §2, gotcha 5).
        self.global_operations = connection.gapic(API, compute_v1.GlobalOperationsClient)
        self.region_operations = connection.gapic(API, compute_v1.RegionOperationsClient)

    def _network_url(self, name: str) -> str:
        return f"projects/{self.target.project}/global/networks/{name}"

    # -- read -------------------------------------------------------------------------------
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        project = self.target.project
        getter = {
            "network": lambda: self.networks.get(project=project, network=name),
            "subnetwork": lambda: self.subnetworks.get(project=project, region=fields["region"], subnetwork=name),
            "firewall": lambda: self.firewalls.get(project=project, firewall=name),
            "address": lambda: self.addresses.get(project=project, address=name),
        }[kind]
        found = get_or_none(API, f"get {kind} {name}", getter)
        return None if found is None else self._live(kind, found)

    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        """One list call per kind (and region) instead of a get per resource, shared by the project's environments."""
        groups: dict[tuple[str, str | None], set[str]] = {}
        for kind, name, fields in wanted:
            groups.setdefault((kind, fields.get("region") if kind == "subnetwork" else None), set()).add(name)
        return [Read((API, self.target.project, kind, region), lambda kind=kind, region=region: self._list(kind, region),
                     lambda listed, kind=kind, names=names: self._pick(kind, listed, names))
                for (kind, region), names in groups.items()]

    def _list(self, kind: str, region: str | None) -> dict:
        project = self.target.project
        lister = {
            "network": lambda: list(self.networks.list(project=project)),
            "subnetwork": lambda: list(self.subnetworks.list(project=project, region=region)),
            "firewall": lambda: list(self.firewalls.list(project=project)),
            "address": lambda: list(self.addresses.list(project=project)),
        }[kind]
        return {item.name: item for item in call(API, f"list {kind}s", lister)}

    def _pick(self, kind: str, listed: dict, names: set[str]) -> dict[str, Live | None]:
        return {f"{kind}/{name}": self._live(kind, listed[name]) if name in listed else None for name in names}

    def _live(self, kind: str, live) -> Live:
        owned = self.target.owns_description(live.description)
        if kind == "network":
            return Live({"auto_create_subnetworks": live.auto_create_subnetworks, "mtu": live.mtu,
                         "network_profile": from_projects(live.network_profile) if live.network_profile else None,
                         "routing_mode": live.routing_config.routing_mode or None}, owned)
        if kind == "subnetwork":
            return Live({"network": last_segment(live.network), "region": last_segment(live.region),
                         "ip_cidr_range": live.ip_cidr_range}, owned)
        if kind == "firewall":
            allowed = [[rule.I_p_protocol, *rule.ports] for rule in live.allowed]
            return Live({"network": last_segment(live.network), "direction": live.direction,
                         "source_ranges": list(live.source_ranges), "allowed": allowed}, owned)
        return Live({"network": last_segment(live.network), "purpose": live.purpose,
                     "address_type": live.address_type, "prefix_length": live.prefix_length,
                     "address": live.address}, owned)

    # -- create / update / delete -----------------------------------------------------------
    def create(self, resource: Resource) -> Pending:
        project, d, name = self.target.project, resource.desired, resource.name
        description = self.target.description
        if resource.kind == "network":
            body = compute_v1.Network(name=name, description=description, auto_create_subnetworks=d["auto_create_subnetworks"],
                                      mtu=d["mtu"], routing_config=compute_v1.NetworkRoutingConfig(routing_mode=d["routing_mode"]))
            if d["network_profile"]:
                body.network_profile = d["network_profile"]
            return self._global(call(API, f"insert network {name}", self.networks.insert, project=project, network_resource=body))
        if resource.kind == "subnetwork":
            body = compute_v1.Subnetwork(name=name, description=description, network=self._network_url(d["network"]),
                                         ip_cidr_range=d["ip_cidr_range"])
            return self._regional(d["region"], call(API, f"insert subnetwork {name}", self.subnetworks.insert,
                                                    project=project, region=d["region"], subnetwork_resource=body))
        if resource.kind == "firewall":
            body = compute_v1.Firewall(name=name, description=description, network=self._network_url(d["network"]),
                                       direction=d["direction"], source_ranges=d["source_ranges"], allowed=_allowed(d["allowed"]))
            return self._global(call(API, f"insert firewall {name}", self.firewalls.insert, project=project, firewall_resource=body))
        body = compute_v1.Address(name=name, description=description, network=self._network_url(d["network"]),
                                  purpose=d["purpose"], address_type=d["address_type"], prefix_length=d["prefix_length"])
        if d.get("address"):  # the range's base: the LNet firewall admits this range, so Google may not pick another
            body.address = d["address"]
        return self._global(call(API, f"insert address {name}", self.addresses.insert, project=project, address_resource=body))

    def update(self, resource: Resource, changed: list[str]) -> Pending:
        project, d, name = self.target.project, resource.desired, resource.name
        if resource.kind == "network":
            body = compute_v1.Network(mtu=d["mtu"], routing_config=compute_v1.NetworkRoutingConfig(routing_mode=d["routing_mode"]))
            return self._global(call(API, f"patch network {name}", self.networks.patch, project=project, network=name,
                                     network_resource=body))
        if resource.kind == "firewall":
            # `name` is required in a patch body too (compute.v1 discovery: Firewall.name annotations.required).
            body = compute_v1.Firewall(name=name, source_ranges=d["source_ranges"], allowed=_allowed(d["allowed"]))
            return self._global(call(API, f"patch firewall {name}", self.firewalls.patch, project=project, firewall=name,
                                     firewall_resource=body))
        raise ValueError(f"{resource.kind} has no in-place update")  # the plan replaces these

    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        project = self.target.project
        if kind == "subnetwork":
            return self._regional(fields["region"], call(API, f"delete subnetwork {name}", self.subnetworks.delete,
                                                         project=project, region=fields["region"], subnetwork=name))
        client, argument = {"network": (self.networks, "network"), "firewall": (self.firewalls, "firewall"),
                            "address": (self.addresses, "address")}[kind]
        return self._global(call(API, f"delete {kind} {name}", client.delete, project=project, **{argument: name}))

    # -- operations -------------------------------------------------------------------------
    def _global(self, operation) -> Pending:
        name = operation.name
        return Pending(f"compute operation {name}", lambda: _status(call(
            API, f"get operation {name}", self.global_operations.get, project=self.target.project, operation=name)))

    def _regional(self, region: str, operation) -> Pending:
        name = operation.name
        return Pending(f"compute operation {name}", lambda: _status(call(
            API, f"get operation {name}", self.region_operations.get, project=self.target.project, region=region,
            operation=name)))


def _status(operation: compute_v1.Operation) -> tuple[bool, str | None]:
    if operation.status != compute_v1.Operation.Status.DONE:
        return False, None
    if operation.error and operation.error.errors:
        return True, "; ".join(f"{e.code}: {e.message}" for e in operation.error.errors)
    return True, None


def _allowed(rules: list[list[str]]) -> list[compute_v1.Allowed]:
    return [compute_v1.Allowed(I_p_protocol=rule[0], ports=rule[1:]) for rule in rules]
