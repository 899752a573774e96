"""One adapter per Google API; `adapters()` gives them by resource kind."""

from rlops.cloud.base import Connection, Target


def adapters(target: Target, connection: Connection, http_for_discovery=None) -> dict:
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
