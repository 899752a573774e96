"""Managed Lustre instances (google-cloud-lustre, REST), and the copies between them and Cloud Storage."""

import uuid
from dataclasses import dataclass

from google.api_core import exceptions as gexc
from google.api_core.operation import Operation
from google.cloud import lustre_v1
from google.protobuf import field_mask_pb2

from rlops.cloud.base import Connection, Pending, Read, Target, call, get_or_none, last_segment
from rlops.permissions import calls
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

    def reads(self, wanted: list[tuple[str, str, dict]]) -> list[Read]:
        """One list of the zone's instances, shared by the project's environments."""
        zones: dict[str, list[tuple[str, dict]]] = {}
        for _, name, fields in wanted:
            zones.setdefault(fields["zone"], []).append((name, fields))
        return [Read((API, self._parent(zone)), lambda zone=zone: self._instances(zone),
                     lambda found, named=named: {f"lustre_instance/{name}": self._live(found[name], name, fields)
                                                 if name in found else None for name, fields in named})
                for zone, named in zones.items()]

    @calls("lustre.projects.locations.instances.list")
    def _instances(self, zone: str) -> dict[str, lustre_v1.Instance]:
        def listed() -> list[lustre_v1.Instance]:
            pager = self.client.list_instances(parent=self._parent(zone))
            # A partial list would plan an existing instance as new.
            pages = list(pager.pages)
            unreachable = [location for page in pages for location in page.unreachable]
            if unreachable:  # retried as any unavailable service is
                raise gexc.ServiceUnavailable(f"locations {', '.join(unreachable)} did not answer")
            return [instance for page in pages for instance in page.instances]

        return {instance.name.rsplit("/", 1)[-1]: instance
                for instance in call(API, f"list instances in {zone}", listed)}

    @calls("lustre.projects.locations.instances.get")
    def read(self, kind: str, name: str, fields: dict) -> Live | None:
        instance = get_or_none(API, f"get instance {name}", self.client.get_instance,
                               name=self._path(name, fields["zone"]))
        return None if instance is None else self._live(instance, name, fields)

    def _live(self, instance: lustre_v1.Instance, name: str, fields: dict) -> Live:
        settling = None
        if instance.state in (lustre_v1.Instance.State.CREATING, lustre_v1.Instance.State.UPDATING):
            path = self._path(name, fields["zone"])
            settling = Pending(f"Lustre instance {name} is {instance.state.name}", lambda: (
                call(API, f"get instance {name}", self.client.get_instance, name=path).state
                == lustre_v1.Instance.State.ACTIVE, None))
        return Live({"zone": fields["zone"], "capacity_gib": instance.capacity_gib,
                     "per_unit_storage_throughput": instance.per_unit_storage_throughput,
                     "filesystem": instance.filesystem, "network": last_segment(instance.network),
                     "gke_support_enabled": instance.gke_support_enabled,
                     # Not a setting: where the in-cluster PersistentVolume points (ip@tcp:/filesystem).
                     "mount_point": instance.mount_point or None},
                    self.target.owns_labels(instance.labels), settling=settling)

    @calls("lustre.projects.locations.instances.create", "lustre.projects.locations.operations.get")
    def create(self, resource: Resource) -> Pending:
        d = resource.desired
        # No gke_support_enabled: "Deprecated: No longer required for GKE instance creation" (lustre_v1 Instance).
        instance = lustre_v1.Instance(
            capacity_gib=d["capacity_gib"], per_unit_storage_throughput=d["per_unit_storage_throughput"],
            filesystem=d["filesystem"], network=f"projects/{self.target.project}/global/networks/{d['network']}",
            labels=resource.labels)
        operation = call(API, f"create instance {resource.name}", self.client.create_instance,
                         parent=self._parent(d["zone"]), instance=instance, instance_id=resource.name)
        return _pending(f"create Lustre instance {resource.name}", operation)

    @calls("lustre.projects.locations.instances.patch", "lustre.projects.locations.operations.get")
    def update(self, resource: Resource, changed: list[str]) -> Pending:
        d = resource.desired
        instance = lustre_v1.Instance(name=self._path(resource.name, d["zone"]), capacity_gib=d["capacity_gib"])
        operation = call(API, f"grow instance {resource.name}", self.client.update_instance, instance=instance,
                         update_mask=field_mask_pb2.FieldMask(paths=["capacity_gib"]))
        return _pending(f"grow Lustre instance {resource.name}", operation)

    @calls("lustre.projects.locations.instances.delete", "lustre.projects.locations.operations.get")
    def delete(self, kind: str, name: str, fields: dict) -> Pending:
        operation = call(API, f"delete instance {name}", self.client.delete_instance,
                         name=self._path(name, fields["zone"]))
        return _pending(f"delete Lustre instance {name}", operation)


def _pending(description: str, operation: Operation) -> Pending:
    def poll() -> tuple[bool, str | None]:
        if not call(API, f"poll {description}", operation.done):
            return False, None
        error = operation.exception()
        return True, str(error) if error else None

    return Pending(f"{description} ({operation.operation.name})", poll)


@dataclass(frozen=True)
class TransferState:
    """Where an exportData or importData operation is: done, its error, and its counters so far."""

    done: bool
    error: str | None
    objects_found: int
    objects_copied: int
    objects_failed: int
    bytes_found: int
    bytes_copied: int

    def said(self) -> str:
        return (f"{self.objects_copied}/{self.objects_found} objects, {self.bytes_copied}/{self.bytes_found} bytes"
                + (f", {self.objects_failed} failed" if self.objects_failed else ""))


class Transfers:
    """Copies between an instance's file system and Cloud Storage (`exportData`, `importData`): long-running
    operations, started by one call and followed by name, from a later tick if need be."""

    def __init__(self, project: str, zone: str, instance: str, connection: Connection):
        self.client = connection.gapic(API, lustre_v1.LustreClient)
        self.instance = f"projects/{project}/locations/{zone}/instances/{instance}"

    @calls("lustre.projects.locations.instances.exportData")
    def export(self, lustre_path: str, gcs_uri: str) -> str:
        """Start copying the directory `lustre_path` (from the file system's root) under `gcs_uri`; the operation's
        name."""
        request = lustre_v1.ExportDataRequest(name=self.instance, lustre_path=lustre_v1.LustrePath(path=lustre_path),
                                              gcs_path=lustre_v1.GcsPath(uri=gcs_uri), request_id=str(uuid.uuid4()))
        return call(API, f"export {lustre_path} to {gcs_uri}", self.client.export_data, request=request).operation.name

    @calls("lustre.projects.locations.instances.importData")
    def import_(self, gcs_uri: str, lustre_path: str) -> str:
        request = lustre_v1.ImportDataRequest(name=self.instance, gcs_path=lustre_v1.GcsPath(uri=gcs_uri),
                                              lustre_path=lustre_v1.LustrePath(path=lustre_path),
                                              request_id=str(uuid.uuid4()))
        return call(API, f"import {gcs_uri} to {lustre_path}", self.client.import_data, request=request).operation.name

    @calls("lustre.projects.locations.operations.get")
    def state(self, operation: str) -> TransferState:
        found = call(API, f"poll {operation}", self.client.get_operation, request={"name": operation})
        counters = lustre_v1.TransferCounters()
        for kind in (lustre_v1.ExportDataMetadata, lustre_v1.ImportDataMetadata):
            if found.metadata.Is(kind.meta.pb.DESCRIPTOR):
                metadata = kind.deserialize(found.metadata.value)
                counters = metadata.operation_metadata.counters
        error = found.error.message or f"code {found.error.code}" if found.HasField("error") else None
        return TransferState(found.done, error, counters.found_objects_count, counters.objects_copied_count,
                             counters.objects_failed_count, counters.bytes_found_count, counters.bytes_copied_count)
