"""Announce a committed dataset version on the control topic."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Protocol

from schemas.control import CONTROL_TOPIC, DatasetVersionEvent


class Producer(Protocol):
    """What a build needs from a Kafka producer (kafka-python's KafkaProducer fits)."""

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> Any: ...


def dataset_version_event(manifest: dict[str, Any], *, lake_id: str | None = None) -> DatasetVersionEvent:
    """The ``dataset.version`` control event of a registry manifest in lake ``lake_id``."""
    return DatasetVersionEvent(
        lake_id=lake_id,
        event_id=str(uuid.uuid4()),
        ts=datetime.now(timezone.utc),
        dataset=manifest["dataset"],
        version=manifest["version"],
        content_hash=manifest["content_hash"],
        manifest=manifest,
    )


def publish_version(
    producer: Producer, manifest: dict[str, Any], *, lake_id: str | None = None, topic: str = CONTROL_TOPIC,
    timeout_s: float = 30.0,
) -> DatasetVersionEvent:
    """Send the event (key = dataset name) and wait for the broker's acknowledgement."""
    event = dataset_version_event(manifest, lake_id=lake_id)
    future = producer.send(topic, value=event.model_dump_json().encode(), key=event.dataset.encode())
    future.get(timeout=timeout_s)
    return event
