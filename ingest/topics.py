"""Topic administration against any Kafka-protocol broker."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from ingest.broker_probe import probe_broker
from schemas.errors import BrokerUnreachable, InputError, TrajlakeError


class TopicNotCreated(TrajlakeError, RuntimeError):
    """The broker answered but refused to create a topic; the message carries its reason."""


def topic_partitions(bootstrap_servers: str, topic: str) -> int | None:
    """Number of partitions of ``topic``, None when it does not exist."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False, request_timeout_ms=10_000)
    try:
        parts = consumer.partitions_for_topic(topic)
        return len(parts) if parts else None
    finally:
        consumer.close()


def ensure_topic(bootstrap_servers: str, topic: str, *, partitions: int = 1, replication: int = 1) -> int:
    """Create ``topic`` if missing; returns its partition count.

    Topics are always created explicitly: an auto-created topic may get a
    different partition count (and key -> partition mapping) than intended.
    """
    if partitions < 1:
        raise InputError(f"partitions must be >= 1, got {partitions}")
    existing = topic_partitions(bootstrap_servers, topic)
    if existing is not None:
        return existing
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replication)])
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        raise TopicNotCreated(f"could not create topic {topic!r} on {bootstrap_servers}: {exc}") from exc
    finally:
        admin.close()
    return topic_partitions(bootstrap_servers, topic) or partitions


def control_producer(bootstrap_servers: str, topic: str) -> KafkaProducer:
    """A producer (acks=all) for the one-partition control ``topic``, created when missing.

    Raises ``BrokerUnreachable`` (within seconds, not after kafka-python's retries) when no broker answers
    or the topic cannot be created.
    """
    probe_broker(bootstrap_servers)
    try:
        ensure_topic(bootstrap_servers, topic, partitions=1)
        return KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", request_timeout_ms=10_000)
    except (KafkaError, RuntimeError, OSError) as exc:
        raise BrokerUnreachable(bootstrap_servers, f"cannot publish to {topic} ({exc})") from exc
