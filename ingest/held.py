"""What the lake holds of a partition's messages: the truth a replayed or probed record is checked against.

A message the ingester has passed (at or below a marker) is held when the lake
has it: a valid event whose (tenant, event_id) is in ``events`` (at that offset,
or as the first copy of a duplicate), an invalid message with a ``quarantine``
row at that offset, or an event ``trajlake forget`` deleted on purpose (its
tenant and rollout are in ``forget_audit``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from ingest.batch import decode
from ingest.dedupe import EventKey, SeenEventIds
from schemas.errors import InvalidEvent
from schemas.tables import EVENTS_TABLE, FORGET_AUDIT_TABLE, QUARANTINE_TABLE
from store.lake import Lake


POSITION = ("kafka_topic", "kafka_partition", "kafka_offset")
"""Columns whose Delta file statistics let a read by Kafka position skip files."""


class LakeRecords:
    """Answers "does the lake hold this message?" for the assigned partitions of one topic."""

    def __init__(self, lake: Lake, *, topic: str, seen: SeenEventIds, max_event_bytes: int) -> None:
        self.lake, self.topic, self.seen, self.max_event_bytes = lake, topic, seen, max_event_bytes
        self._quarantined: set[tuple[int, int]] = set()
        self._forgotten: set[tuple[str | None, str]] = set()
        self._forgotten_rollouts: set[str] = set()
        self._rewound: dict[int, datetime] = {}

    def load(self, since: Mapping[int, int], *, rewound_ms: Mapping[int, int | None]) -> None:
        """Remember the quarantined positions at or after ``since`` (partition -> offset), what was forgotten,
        and when each partition was last rewound by ``--recover`` (rows ingested before are of a log that is gone)."""
        self._rewound = {p: datetime.fromtimestamp(ms / 1000, timezone.utc) for p, ms in rewound_ms.items()
                         if ms is not None}
        self._quarantined = set()
        if since and self.lake.exists(QUARANTINE_TABLE):
            rows = self.lake.read(QUARANTINE_TABLE, columns=["kafka_partition", "kafka_offset"], prune_on=POSITION,
                                  filter=(pc.field("kafka_topic") == self.topic)
                                  & pc.field("kafka_partition").isin(list(since)))
            for p, o in zip(rows.column("kafka_partition").to_pylist(), rows.column("kafka_offset").to_pylist()):
                if o >= since[p]:
                    self._quarantined.add((p, o))
        self._forgotten = _forgotten(self.lake)
        self._forgotten_rollouts = {rollout for _, rollout in self._forgotten}

    def quarantined(self, partition: int, offset: int) -> bool:
        """Whether ``quarantine`` holds the message at this offset (positions since the resume point are cached)."""
        return (partition, offset) in self._quarantined or self._rows_at(QUARANTINE_TABLE, partition, offset,
                                                                          ["kafka_offset"]).num_rows > 0

    def has_at(self, partition: int, offset: int, value: bytes | None, key: bytes | None = None) -> bool:
        """Whether the lake holds this very message at this offset: the newest ``events`` row there carries its
        event_id; without an events row there, ``holds`` decides (a duplicate, a quarantined or forgotten one)."""
        rows = self._rows_at(EVENTS_TABLE, partition, offset, ["event_id", "ingested_at"])
        if partition in self._rewound and rows.num_rows:
            rows = rows.filter(pc.greater_equal(rows.column("ingested_at"), pa.scalar(self._rewound[partition],
                                                                                     rows.schema.field("ingested_at").type)))
        if rows.num_rows == 0:
            return self.holds(partition, offset, value, key)
        newest = rows.sort_by([("ingested_at", "descending")]).column("event_id")[0].as_py()
        try:
            return decode(value, max_bytes=self.max_event_bytes).event_id == newest
        except InvalidEvent:
            return False

    def _rows_at(self, table: str, partition: int, offset: int, columns: list[str]) -> pa.Table:
        if not self.lake.exists(table):
            return pa.table({c: [] for c in columns})
        at = (pc.field("kafka_topic") == self.topic) & (pc.field("kafka_partition") == partition) \
            & (pc.field("kafka_offset") == offset)
        return self.lake.read(table, columns=columns, filter=at, prune_on=POSITION)

    def holds(self, partition: int, offset: int, value: bytes | None, key: bytes | None = None) -> bool:
        """Whether the lake holds (or deliberately forgot) the message read at ``partition``/``offset`` (``key``: its
        Kafka key, the rollout id)."""
        try:
            event = decode(value, max_bytes=self.max_event_bytes)
        except InvalidEvent:
            return self.quarantined(partition, offset) or self._forgotten_envelope(value, key)
        key = (event.tenant, event.event_id)
        return self.seen.first_copy(key) is not None or self.forgotten(event.tenant, event.rollout_id) \
            or key in self.stored_keys([key])

    def _forgotten_envelope(self, value: bytes | None, key: bytes | None) -> bool:
        """An invalid message whose envelope names a forgotten (tenant, rollout_id), or, without a readable envelope,
        whose Kafka key names a forgotten rollout: forget deleted its quarantine row (it selects rejected messages
        by either, ``store.forget``)."""
        try:
            envelope = json.loads(value or b"")
        except (ValueError, UnicodeDecodeError):
            envelope = None
        if not isinstance(envelope, dict) or not isinstance(envelope.get("rollout_id"), str):
            return key is not None and key.decode("utf-8", "replace") in self._forgotten_rollouts
        tenant = envelope.get("tenant")
        return self.forgotten(tenant if isinstance(tenant, str) else None, envelope["rollout_id"])

    def forgotten(self, tenant: str | None, rollout_id: str) -> bool:
        return (tenant, rollout_id) in self._forgotten or (None, rollout_id) in self._forgotten

    def stored_keys(self, keys: Iterable[EventKey], table: str = EVENTS_TABLE) -> set[EventKey]:
        """Which of ``keys`` the table holds, read from the table itself (not from memory)."""
        wanted = set(keys)
        if not wanted or not self.lake.exists(table):
            return set()
        stored = self.lake.read(table, columns=["tenant", "event_id"], prune_on=["event_id"],
                                filter=pc.field("event_id").isin(sorted({e for _, e in wanted})))
        found = zip(stored.column("tenant").to_pylist(), stored.column("event_id").to_pylist())
        return {k for k in found if k in wanted}


def not_held(rows: pa.Table, held: set[EventKey]) -> pa.Table:
    """The rows whose (tenant, event_id) is not in ``held``."""
    if not held or rows.num_rows == 0:
        return rows
    keys = zip(rows.column("tenant").to_pylist(), rows.column("event_id").to_pylist())
    return rows.filter(pa.array([k not in held for k in keys], type=pa.bool_()))


def _forgotten(lake: Lake) -> set[tuple[str | None, str]]:
    """(tenant, rollout_id) pairs that ``trajlake forget`` deleted; tenant None when the request named none."""
    if not lake.exists(FORGET_AUDIT_TABLE):
        return set()
    audit = lake.read(FORGET_AUDIT_TABLE, columns=["tenant", "rollouts"]).to_pylist()
    return {(row["tenant"], r) for row in audit for r in row["rollouts"] or []}
