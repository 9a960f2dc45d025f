"""The bytes a Kafka topic occupies on the broker, read back as a consumer fetches them.

A broker stores record batches as its producers sent them (compressed when
the producer compressed) and serves them back unchanged, so the bytes a
consumer receives reading a topic from the start are the topic's stored
batches plus the fetch responses' framing. librdkafka counts them per broker
(``rxbytes`` in its statistics), with the metadata answers of the read (a few
hundred bytes). Measured on tansu with
bench/sessions' events, 60 records as 30 batches: 73,891 bytes served for
70,976 key + value bytes uncompressed, 33,093 with zstd.

>>> stored = topic_bytes(broker.bootstrap_servers, "trajlake.events", records=120)  # doctest: +SKIP
>>> stored.served_bytes, stored.value_bytes  # doctest: +SKIP
(33093, 70976)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


@dataclass(frozen=True)
class TopicBytes:
    """What a read of a whole topic took."""

    records: int
    value_bytes: int
    """Keys + values of the records, uncompressed."""
    served_bytes: int
    """Bytes the broker sent the consumer (librdkafka ``rxbytes``): the stored batches as produced + framing."""


def topic_bytes(bootstrap_servers: str, topic: str, *, records: int, timeout_s: float = 30.0) -> TopicBytes:
    """Read ``records`` records of ``topic`` (every partition, from the start) and count the bytes.

    Raises ``TimeoutError`` when fewer came back within ``timeout_s``.
    """
    stats: list[str] = []
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "trajlake-topic-bytes",
                         "enable.auto.commit": False, "statistics.interval.ms": 50, "stats_cb": stats.append,
                         "log.connection.close": False})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
        read = value_bytes = 0
        deadline = time.monotonic() + timeout_s
        while read < records and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read += 1
                value_bytes += len(message.key() or b"") + len(message.value() or b"")
        if read < records:
            raise TimeoutError(f"{read} of {records} records of {topic} came back within {timeout_s} s")
        stats.clear()
        while not stats and time.monotonic() < deadline + 5:  # the statistics after the last fetch
            consumer.poll(0.05)
        if not stats:
            raise TimeoutError(f"librdkafka gave no statistics for the read of {topic}")
        served = sum(b["rxbytes"] for name, b in json.loads(stats[-1])["brokers"].items() if name != "GroupCoordinator")
        return TopicBytes(read, value_bytes, served)
    finally:
        consumer.close()
