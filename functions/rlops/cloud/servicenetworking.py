"""Private service access peering (servicenetworking v1 through google-api-python-client: there is no GAPIC library)."""

from rlops.cloud.base import Connection, Http, Pending, Read, Target, call, last_segment, longrunning, read_each
from rlops.permissions import calls
from rlops.resource_shapes import Live, Resource

API = "servicenetworking"
SERVICE = "services/servicenetworking.googleapis.com"


class ServiceNetworkingAdapter:
    kinds = ("connection",)

    def __init__(self, target: Target, connection: Connection, http: Http | None = None):
        self.target = target
        self.client = connection.discovery(API, "v1", http)

    def _network(self, name: str) -> str:
        # Service networking names the consumer network by project NUMBER, not ID (seed-inventory §2, step 7a).
        return f"projects/{self.target.project_number}/global/networks/{name}"

    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        return read_each(self, API, wanted)  # the list of connections is per network: nothing to share

    @calls("servicenetworking.services.connections.list")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        request = self.client.services().connections().list(parent=SERVICE, network=self._network(name))
        found = call(API, f"list connections of {name}", request.execute).get("connections", [])
        if not found:
            return None
        ranges = list(found[0].get("reservedPeeringRanges", []))
        wanted = fields.get("reserved_peering_ranges") or []
        # Other services (Cloud SQL, Filestore) may share the peering: ours being there is enough.
        if set(wanted) <= set(ranges):
            ranges = wanted
        # A peering has no labels or description; rlops knows its own from the state record.
        return Live({"network": last_segment(found[0].get("network")), "reserved_peering_ranges": ranges}, owned=False)

    @calls("servicenetworking.services.connections.create", "servicenetworking.operations.get")
    def create(self, resource: Resource) -> Pending:
        body = {"network": self._network(resource.desired["network"]),
                "reservedPeeringRanges": resource.desired["reserved_peering_ranges"]}
        request = self.client.services().connections().create(parent=SERVICE, body=body)
        return self._wait(call(API, f"connect {resource.name}", request.execute))

    @calls("servicenetworking.services.connections.list", "servicenetworking.services.connections.patch",
           "servicenetworking.operations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        network = self._network(resource.desired["network"])
        listing = self.client.services().connections().list(parent=SERVICE, network=network)
        found = call(API, f"list connections of {resource.name}", listing.execute).get("connections", [])
        current = found[0].get("reservedPeeringRanges", []) if found else []
        body = {"network": network,
                "reservedPeeringRanges": current + [r for r in resource.desired["reserved_peering_ranges"]
                                                    if r not in current]}
        request = self.client.services().connections().patch(
            name=f"{SERVICE}/connections/-", force=True, updateMask="reservedPeeringRanges", body=body)
        return self._wait(call(API, f"update ranges of {resource.name}", request.execute))

    @calls("servicenetworking.services.connections.deleteConnection", "servicenetworking.operations.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        request = self.client.services().connections().deleteConnection(
            name=f"{SERVICE}/connections/servicenetworking-googleapis-com",
            body={"consumerNetwork": self._network(name)})
        return self._wait(call(API, f"disconnect {name}", request.execute))

    def _wait(self, operation: dict) -> Pending:
        return longrunning(API, "service networking", operation,
                           lambda name: self.client.operations().get(name=name).execute())
