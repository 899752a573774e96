"""One adapter per external system (Google APIs, Pub/Sub, Ray's job API); `adapters()` is the registry of the
provisioning ones: one handler per resource kind, each a `cloud.base.ResourceAdapter`. Nothing is imported here
eagerly: a function that needs one adapter loads only that."""


def adapters(target, connection, http_for_discovery=None) -> dict:
    from rlops.cloud import compute, container
    from rlops.cloud.artifactregistry import RemoteRepositories
    from rlops.cloud.lustre import LustreAdapter
    from rlops.cloud.servicenetworking import ServiceNetworkingAdapter

    handlers = [handler(target, connection) for handler in (*compute.HANDLERS, *container.HANDLERS)]
    handlers += [LustreAdapter(target, connection),
                 ServiceNetworkingAdapter(target, connection, http=http_for_discovery),
                 RemoteRepositories(target, connection, http=http_for_discovery)]
    return {kind: handler for handler in handlers for kind in handler.kinds}
