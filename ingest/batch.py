"""One batch of Kafka records: bounded by count, bytes and age; decoded at commit.

``Batch.decode`` validates every record (msgspec fast path, pydantic for
whatever it refuses: ``schemas.fast``; a producer's ``ingest.rejected`` envelope is
quarantined with the producer's reason), drops duplicates (by tenant and
event_id) and returns the ``events`` rows, the rejected inputs and, per
partition, the last offset the batch covers (what the commit's transaction
markers say). A valid record at or below the ``events`` marker is a replay:
it must be an event the lake holds (at that offset, or as the duplicate of one
it holds); one that is not is reported in ``unheld``, never dropped quietly.
"""

from __future__ import annotations

import json
import time
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import pyarrow as pa

from ingest.dedupe import SeenEventIds
from ingest.redaction import Redactor
from ingest.rejected import producer_rejection
from schemas.errors import InvalidEvent
from schemas.events import Event
from schemas.fast import FastEvent, decode_batch
from schemas.fast_tokens import decode_batch_columnar
from schemas.versions import decode_event, unencodable_path
from store.event_rows import TOKEN_FIELDS, KafkaCoordinates, Rejected, events_table

log = logging.getLogger(__name__)


class Unheld(NamedTuple):
    """A replayed event (at or below the ``events`` marker) whose id ``SeenEventIds`` does not know."""

    partition: int
    offset: int
    tenant: str
    event_id: str
    rollout_id: str


@dataclass
class DecodedBatch:
    """What one batch becomes: rows to write and the offsets they cover."""

    events: pa.Table
    rejected: list[Rejected]
    last_offsets: dict[int, int]
    duplicates: int
    unheld: list[Unheld] = field(default_factory=list)
    """Valid events at or below the events marker that ``seen`` does not know (the lake may not hold them)."""
    key_mismatches: int = 0
    """Valid events whose Kafka key is null or not their rollout_id (stored; see schemas/EVENTS.md)."""


@dataclass
class Batch:
    """Records polled since the last commit (``ingest.consumer.Record``s)."""

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

    def last_records(self) -> dict:
        """Partition -> its record with the highest offset in this batch."""
        last: dict = {}
        for r in self.records:
            if r.partition not in last or r.offset > last[r.partition].offset:
                last[r.partition] = r
        return last

    def age_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000 if self.records else 0.0

    def decode(self, seen: SeenEventIds, *, max_event_bytes: int, redactor: Redactor | None = None,
               replayed_through: Mapping[int, int | None] | None = None) -> DecodedBatch:
        """Validate, dedupe and convert the records, in offset order per partition.

        The whole batch goes through the msgspec fast path first, token arrays
        parsed straight into flat columns (``schemas.fast_tokens``; with redaction rules,
        ``schemas.fast``); each record it refuses takes ``schemas.fast`` alone, then
        ``decode_event``, which accepts it or names the problem.
        ``replayed_through`` is the ``events`` marker per partition: records at or
        below it were decided before and are checked against ``seen``, not added to it.
        """
        events: list[Event | FastEvent] = []
        where: list = []
        """Per kept event, its record: a ``Record`` has the topic, partition and offset of a ``KafkaCoordinates``
        (one object less per event)."""
        rejected: list[Rejected] = []
        last: dict[int, int] = {}
        duplicates = key_mismatches = 0
        unheld: list[Unheld] = []
        marks = replayed_through or {}
        values = [r.value for r in self.records]
        columnar = decode_batch_columnar(values, max_bytes=max_event_bytes) if redactor is None else None
        first = columnar.events if columnar is not None else decode_batch(values, max_bytes=max_event_bytes)
        sources: list[int | tuple[list[int] | None, list[float] | None]] = []
        """Per kept event, where its tokens are: its row in ``columnar.tokens``, or its own lists."""
        stamps: list[int | datetime] = []
        """Per kept event, where its ``ts`` is: its row in ``columnar.ts``, or its own."""
        for row, (r, event) in enumerate(zip(self.records, first)):
            if r.offset > last.get(r.partition, -1):
                last[r.partition] = r.offset
            in_columns = event is not None and columnar is not None
            if event is None:
                try:
                    event = decode(r.value, max_bytes=max_event_bytes, fast_tried=columnar is None)
                except InvalidEvent as exc:
                    exc = producer_rejection(r.value) or exc
                    at = KafkaCoordinates(r.topic, r.partition, r.offset)
                    rejected.append(_rejected(r.value, r.key, at, exc, max_event_bytes, redactor))
                    continue
            key = (event.tenant, event.event_id)
            mark = marks.get(r.partition)
            replay = mark is not None and r.offset <= mark
            if replay:
                first = seen.first_copy(key)
                if first is None:
                    unheld.append(Unheld(r.partition, r.offset, event.tenant, event.event_id, event.rollout_id))
                    continue
                if first != (r.partition, r.offset):
                    duplicates += 1
                    continue
            elif seen.is_duplicate(key, r.partition, r.offset):
                duplicates += 1
                log.debug("duplicate event_id=%s tenant=%s at=%d:%d first_copy=%s", event.event_id, event.tenant,
                          r.partition, r.offset, seen.first_copy(key))
                continue
            if not replay and (r.key is None or r.key != event.rollout_id.encode()):
                key_mismatches += 1
            events.append(event if redactor is None else redactor.redact(event))
            where.append(r)
            sources.append(row if in_columns else _token_lists(event))
            stamps.append(row if in_columns else event.ts)
        if columnar is None:
            rows = events_table(events, where)
        else:
            rows = events_table(events, where, tokens=columnar.tokens.pick(sources), ts=columnar.timestamps(stamps))
        return DecodedBatch(rows, rejected, last, duplicates, unheld, key_mismatches)


def decode(raw: bytes | None, *, max_bytes: int, fast_tried: bool = True) -> Event | FastEvent:
    """One event the batch path refused: ``schemas.fast`` (unless ``fast_tried``), then
    ``schemas.versions.decode_event``, plus a readable reason for a null message value."""
    if raw is None:
        raise InvalidEvent("(event)", "empty message (null value): send one JSON event per message")
    if not fast_tried:
        [event] = decode_batch([raw], max_bytes=max_bytes)
        if event is not None:
            return event
    return decode_event(raw, max_bytes=max_bytes)


def _token_lists(event: Event | FastEvent) -> tuple[list[int] | None, list[float] | None]:
    ids, logprobs = TOKEN_FIELDS.get(event.type, (None, None))
    return (getattr(event.payload, ids) if ids else None), (getattr(event.payload, logprobs) if logprobs else None)


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
    return event_id if isinstance(event_id, str) and unencodable_path(event_id) is None else None
