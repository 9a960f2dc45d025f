"""Reading a topic back in tests: every partition assigned directly (no group join), in offset order."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition


def consume(bootstrap: str, topic: str, count: int) -> list:
    """Messages of ``topic`` until ``count`` arrived (or ~20 s passed), sorted by (partition, offset)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)])
        messages: list = []
        for _ in range(100):
            for batch in consumer.poll(timeout_ms=200).values():
                messages.extend(batch)
            if len(messages) >= count:
                break
        return sorted(messages, key=lambda m: (m.partition, m.offset))
    finally:
        consumer.close()
