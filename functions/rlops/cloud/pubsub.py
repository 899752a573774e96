"""Pub/Sub (google-cloud-pubsub): the train topic a message starts a run from, and the events topic rlops reports on.

`Endpoints.pubsub` points the clients at Google's emulator (the local provider starts one) as the
library does for PUBSUB_EMULATOR_HOST (google/pubsub_v1/services/publisher/client.py): a gRPC
transport over an insecure channel to the emulator.

The client library (and gRPC under it) loads only when a message is sent or the emulator's topics are made: every
tick opens a site with a publisher (`rlops.sites`), most publish nothing, and a cold start should not pay for it.
"""

import json
from typing import TYPE_CHECKING, Any

from rlops.endpoints import Endpoints
from rlops.permissions import Need, Scope, calls

if TYPE_CHECKING:
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

TRAIN_TOPIC = "rlops-train"
EVENTS_TOPIC = "rlops-events"
TRAIN_PUSH_SUBSCRIPTION = "rlops-train-push"
EVENTS_LOG_SUBSCRIPTION = "rlops-events-log"  # a pull subscription: `rlops events` and the tests read it


def _emulated(endpoints: Endpoints,
              transport_class: "type[PublisherGrpcTransport] | type[SubscriberGrpcTransport]") -> dict[str, Any]:
    """A client's arguments for the emulator, else none."""
    if not endpoints.pubsub:
        return {}
    import grpc  # noqa: PLC0415 cold start (the module's docstring)

    return {"transport": transport_class(channel=grpc.insecure_channel(target=endpoints.pubsub))}


@calls(also=(Need("pubsub.topics.publish", Scope.EVENTS_TOPIC),))
def publish(endpoints: Endpoints, project: str, topic: str, payload: dict, **attributes: str) -> str:
    """Publish `payload` as JSON; the message id, once the server has it."""
    from google.cloud import pubsub_v1  # noqa: PLC0415 cold start (the module's docstring)
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport  # noqa: PLC0415 as above

    data = json.dumps(payload, sort_keys=True).encode()
    publisher = pubsub_v1.PublisherClient(**_emulated(endpoints, PublisherGrpcTransport))
    return publisher.publish(f"projects/{project}/topics/{topic}", data, **attributes).result(timeout=30)


def create_local(endpoints: Endpoints, project: str, push_to: str) -> None:
    """In the emulator: both topics, the train topic pushed to `push_to`, and a pull subscription on events."""
    from google.api_core import exceptions  # noqa: PLC0415 cold start (the module's docstring)
    from google.cloud import pubsub_v1  # noqa: PLC0415 as above
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport  # noqa: PLC0415 as above
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport  # noqa: PLC0415 as above

    publisher = pubsub_v1.PublisherClient(**_emulated(endpoints, PublisherGrpcTransport))
    subscriber = pubsub_v1.SubscriberClient(**_emulated(endpoints, SubscriberGrpcTransport))
    for topic in (TRAIN_TOPIC, EVENTS_TOPIC):
        try:
            publisher.create_topic(name=f"projects/{project}/topics/{topic}")
        except exceptions.AlreadyExists:
            pass
    subscriptions = {
        TRAIN_PUSH_SUBSCRIPTION: dict(topic=f"projects/{project}/topics/{TRAIN_TOPIC}",
                                      push_config={"push_endpoint": push_to}, ack_deadline_seconds=60),
        EVENTS_LOG_SUBSCRIPTION: dict(topic=f"projects/{project}/topics/{EVENTS_TOPIC}"),
    }
    for name, settings in subscriptions.items():
        path = f"projects/{project}/subscriptions/{name}"
        try:
            subscriber.create_subscription(request={"name": path, **settings})
        except exceptions.AlreadyExists:
            if "push_config" in settings:  # the train function may be on a new port after a restart
                subscriber.modify_push_config(request={"subscription": path, "push_config": settings["push_config"]})
