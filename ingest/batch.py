"""One batch of Kafka records: bounded by count, bytes and age; decoded at commit.

``Batch.decode`` validates every record (msgspec fast path, pydantic for
whatever it refuses: ``schemas.fast``), drops duplicates (by event_id) and
returns the ``events`` rows, the rejected inputs and, per partition, the last
offset the batch covers (what the commit's transaction markers say).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from ingest.dedupe import SeenEventIds
from ingest.redaction import Redactor
from schemas.errors import InvalidEvent
from schemas.events import Event
from schemas.fast import FastEvent, decode_batch
from schemas.versions import decode_event
from store.event_rows import KafkaCoordinates, Rejected, events_table


@dataclass
class DecodedBatch:
    """What one batch becomes: rows to write and the offsets they cover."""

    events: pa.Table
    rejected: list[Rejected]
    last_offsets: dict[int, int]
    duplicates: int


@dataclass
class Batch:
    """Records polled since the last commit (kafka-python ``ConsumerRecord``s)."""

    records: list = field(default_factory=list)
    bytes: int = 0
    started: float = 0.0

    def add(self, records: Iterable) -> None:
        for record in records:
            if not self.records:
                self.started = time.monotonic()
            self.records.append(record)
            self.bytes += len(record.value or b"")

    def clear(self) -> None:
        self.records.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.records)

    def age_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000 if self.records else 0.0

    def decode(self, seen: SeenEventIds, *, max_event_bytes: int, redactor: Redactor | None = None) -> DecodedBatch:
        """Validate, dedupe and convert the records, in offset order per partition.

        The whole batch goes through the msgspec fast path first; each record it
        refuses takes ``decode_event``, which accepts it or names the problem.
        """
        events: list[Event | FastEvent] = []
        where: list[KafkaCoordinates] = []
        rejected: list[Rejected] = []
        last: dict[int, int] = {}
        duplicates = 0
        fast = decode_batch([r.value for r in self.records], max_bytes=max_event_bytes)
        for r, event in zip(self.records, fast):
            at = KafkaCoordinates(r.topic, r.partition, r.offset)
            last[r.partition] = max(r.offset, last.get(r.partition, -1))
            if event is None:
                try:
                    event = decode(r.value, max_bytes=max_event_bytes)
                except InvalidEvent as exc:
                    rejected.append(_rejected(r.value, r.key, at, exc, max_event_bytes, redactor))
                    continue
            if seen.is_duplicate(event.event_id, r.partition, r.offset):
                duplicates += 1
                continue
            events.append(event if redactor is None else redactor.redact(event))
            where.append(at)
        return DecodedBatch(events_table(events, where), rejected, last, duplicates)


def decode(raw: bytes | None, *, max_bytes: int) -> Event:
    """``schemas.versions.decode_event``, plus a readable reason for a null message value."""
    if raw is None:
        raise InvalidEvent("(event)", "empty message (null value): send one JSON event per message")
    return decode_event(raw, max_bytes=max_bytes)


def _rejected(raw: bytes | None, key: bytes | None, at: KafkaCoordinates, exc: InvalidEvent, max_bytes: int,
              redactor: Redactor | None) -> Rejected:
    """Quarantine keeps the raw input; with redaction rules, their patterns run over its text and the reason."""
    reason = str(exc)
    if redactor is not None:
        raw, reason = redactor.redact_raw(raw or b""), redactor.redact_text(reason)
    return Rejected(
        raw=raw or b"", field=exc.field, reason=reason, key=key, coordinates=at,
        event_id=_event_id(raw) if raw and len(raw) <= max_bytes else None,
    )


def _event_id(raw: bytes) -> str | None:
    """The event_id of an invalid event, when it has a readable one (for finding it later)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    event_id = doc.get("event_id") if isinstance(doc, dict) else None
    return event_id if isinstance(event_id, str) else None
