"""Managed Lustre instances (google-cloud-lustre, REST)."""

from google.cloud import lustre_v1
from google.protobuf import field_mask_pb2

from rlops.cloud.base import Connection, Pending, Target, call, get_or_none, last_segment
from rlops.resource_shapes import Live, Resource

API = "lustre"


class LustreAdapter:
    kinds = ("lustre_instance",)

    def __init__(self, target: Target, connection: Connection):
        self.target = target
        self.client = connection.gapic(API, lustre_v1.LustreClient)

    def _parent(self, zone: str) -> str:
        return f"projects/{self.target.project}/locations/{zone}"

    def _path(self, name: str, zone: str) -> str:
        return f"{self._parent(zone)}/instances/{name}"

    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        instance = get_or_none(API, f"get instance {name}", self.client.get_instance,
                               name=self._path(name, fields["zone"]))
        if instance is None:
            return None
        settling = None
        if instance.state in (lustre_v1.Instance.State.CREATING, lustre_v1.Instance.State.UPDATING):
            path = self._path(name, fields["zone"])
            settling = Pending(f"Lustre instance {name} is {instance.state.name}", lambda: (call(
                API, f"get instance {name}", self.client.get_instance, name=path).state == lustre_v1.Instance.State.ACTIVE, None))
        return Live({"zone": fields["zone"], "capacity_gib": instance.capacity_gib,
                     "per_unit_storage_throughput": instance.per_unit_storage_throughput,
                     "filesystem": instance.filesystem, "network": last_segment(instance.network),
                     "gke_support_enabled": instance.gke_support_enabled,
                     # Not a setting: where the in-cluster PersistentVolume points (ip@tcp:/filesystem).
                     "mount_point": instance.mount_point or None},
                    self.target.owns_labels(instance.labels), settling=settling)

    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        instance = lustre_v1.Instance(
            capacity_gib=d["capacity_gib"], per_unit_storage_throughput=d["per_unit_storage_throughput"],
            filesystem=d["filesystem"], network=f"projects/{self.target.project}/global/networks/{d['network']}",
            gke_support_enabled=d["gke_support_enabled"], labels=resource.labels)
        operation = call(API, f"create instance {resource.name}", self.client.create_instance,
                         parent=self._parent(d["zone"]), instance=instance, instance_id=resource.name)
        return _pending(f"create Lustre instance {resource.name}", operation)

    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d = resource.desired
        instance = lustre_v1.Instance(name=self._path(resource.name, d["zone"]), capacity_gib=d["capacity_gib"])
        operation = call(API, f"grow instance {resource.name}", self.client.update_instance, instance=instance,
                         update_mask=field_mask_pb2.FieldMask(paths=["capacity_gib"]))
        return _pending(f"grow Lustre instance {resource.name}", operation)

    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        operation = call(API, f"delete instance {name}", self.client.delete_instance, name=self._path(name, fields["zone"]))
        return _pending(f"delete Lustre instance {name}", operation)


def _pending(description: str, operation) -> Pending:
    def poll() -> tuple[bool, str | None]:
        if not call(API, f"poll {description}", operation.done):
            return False, None
        error = operation.exception()
        return True, str(error) if error else None

    return Pending(f"{description} ({operation.operation.name})", poll)
