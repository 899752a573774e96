"""One adapter per external system (Google APIs, Pub/Sub, Ray's job API); `adapters()` is the registry of the
provisioning ones: one handler per resource kind, each a `cloud.base.ResourceAdapter`. Nothing is imported here
eagerly: a function that needs one adapter loads only that."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlops.cloud.base import Connection, Http, ResourceAdapter, Target


def adapters(target: "Target", connection: "Connection",
             http_for_discovery: "Http | None" = None) -> "dict[str, ResourceAdapter]":
    # Cold start: the Google clients load here, when a plan or an apply builds the adapters, not in every function.
    from rlops.cloud import compute, container  # noqa: PLC0415 cold start, as said above
    from rlops.cloud.artifactregistry import RemoteRepositories  # noqa: PLC0415 cold start, as said above
    from rlops.cloud.lustre import LustreAdapter  # noqa: PLC0415 cold start, as said above
    from rlops.cloud.servicenetworking import ServiceNetworkingAdapter  # noqa: PLC0415 cold start, as said above

    handlers: list[ResourceAdapter] = [handler(target, connection)
                                       for handler in (*compute.HANDLERS, *container.HANDLERS)]
    handlers += [LustreAdapter(target, connection),
                 ServiceNetworkingAdapter(target, connection, http=http_for_discovery),
                 RemoteRepositories(target, connection, http=http_for_discovery)]
    return {kind: handler for handler in handlers for kind in handler.kinds}
