"""The dead-letter topic: rejected inputs, raw bytes unchanged, reason in headers.

Delivery is at least once: the ingester produces and flushes the dead letters
*before* the quarantine commit that carries their offsets, so a crash between
the two re-sends them on restart (duplicates possible, losses not). Readers
dedupe by the ``trajlake-source`` header (topic:partition:offset).
"""

from __future__ import annotations

from collections.abc import Sequence

from kafka import KafkaProducer

from store.event_rows import Rejected

REASON_HEADER = "trajlake-reason"
FIELD_HEADER = "trajlake-field"
SOURCE_HEADER = "trajlake-source"


class DeadLetters:
    """Sends rejected inputs to ``topic``; ``send_all`` returns once the broker has them."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.topic = topic
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers, acks="all", max_request_size=256 * 1024 * 1024,
        )

    def send_all(self, rejected: Sequence[Rejected]) -> None:
        if not rejected:
            return
        futures = [self._producer.send(self.topic, key=r.key, value=r.raw, headers=_headers(r)) for r in rejected]
        self._producer.flush()
        for f in futures:
            f.get(timeout=30)  # raises if the broker refused one: the quarantine commit then waits

    def close(self) -> None:
        self._producer.close(timeout=5)


def _headers(r: Rejected) -> list[tuple[str, bytes]]:
    where = r.coordinates
    return [
        (REASON_HEADER, r.reason.encode()),
        (FIELD_HEADER, r.field.encode()),
        (SOURCE_HEADER, f"{where.topic}:{where.partition}:{where.offset}".encode()),
    ]
