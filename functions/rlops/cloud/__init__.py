"""One adapter per external system (Google APIs, Pub/Sub, Ray's job API); `adapters()` gives the provisioning
ones by resource kind. Nothing is imported here eagerly: a function that needs one adapter loads only that."""


def adapters(target, connection, http_for_discovery=None) -> dict:
    from rlops.cloud.compute import ComputeAdapter
    from rlops.cloud.container import ContainerAdapter
    from rlops.cloud.lustre import LustreAdapter
    from rlops.cloud.servicenetworking import ServiceNetworkingAdapter

    by_kind = {}
    for adapter in (ComputeAdapter(target, connection), ContainerAdapter(target, connection),
                    LustreAdapter(target, connection),
                    ServiceNetworkingAdapter(target, connection, http=http_for_discovery)):
        for kind in adapter.kinds:
            by_kind[kind] = adapter
    return by_kind
