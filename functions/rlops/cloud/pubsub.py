"""Pub/Sub (google-cloud-pubsub): the train topic a message starts a run from, and the events topic rlops reports on.

PUBSUB_EMULATOR_HOST points the client at Google's emulator (the local provider starts one).
"""

import json

TRAIN_TOPIC = "rlops-train"
EVENTS_TOPIC = "rlops-events"
TRAIN_PUSH_SUBSCRIPTION = "rlops-train-push"
EVENTS_LOG_SUBSCRIPTION = "rlops-events-log"  # a pull subscription: `rlops events` and the tests read it


def _publisher():
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient()


def publish(project: str, topic: str, payload: dict, **attributes: str) -> str:
    """Publish `payload` as JSON; the message id, once the server has it."""
    data = json.dumps(payload, sort_keys=True).encode()
    return _publisher().publish(f"projects/{project}/topics/{topic}", data, **attributes).result(timeout=30)


def create_local(emulator_host: str, project: str, push_to: str) -> None:
    """In the emulator: both topics, the train topic pushed to `push_to`, and a pull subscription on events."""
    import os

    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    os.environ["PUBSUB_EMULATOR_HOST"] = emulator_host
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
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
