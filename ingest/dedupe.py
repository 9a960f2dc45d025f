"""Dedupe by (tenant, event_id): which message first carried an id.

A producer retry sends the same event twice; both copies carry the same
``event_id`` and (key = rollout_id) land on the same partition, close together.
``SeenEventIds`` remembers, per (tenant, event_id), the (partition, offset) of
its first copy. A message is a duplicate iff its id was first seen at
*another* position, so a replay after a crash (the same message at the same
offset) decides exactly as the first pass did. Ids are scoped to their tenant:
one tenant sending another's event ids first cannot make the other's events
vanish.

Memory bound: at most ``max_ids`` ids (default 1,000,000, about 380 MB of
Python objects with 36-character ids: ~380 B per id, measured), oldest evicted first. At assignment the ids
of the newest ``max_ids`` events of the assigned partitions (by ingestion time,
then offset) are loaded from the ``events`` table. A retry that arrives more
than ``max_ids`` events after its original (on the assigned partitions), or on
another partition owned by another ingester, is not caught.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import EVENTS_TABLE
from store.lake import Lake

DEFAULT_MAX_IDS = 1_000_000

EventKey = tuple[str, str]
"""(tenant, event_id): what makes an event the same event."""
Position = tuple[int, int]
"""(partition, offset) of a message."""


class SeenEventIds:
    """Bounded map (tenant, event_id) -> (partition, offset) of its first copy."""

    def __init__(self, *, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.max_ids = max_ids
        self._first: OrderedDict[EventKey, Position] = OrderedDict()

    def __len__(self) -> int:
        return len(self._first)

    def first_copy(self, key: EventKey) -> Position | None:
        """Where the first copy of ``key`` sits, if it is remembered."""
        return self._first.get(key)

    def is_duplicate(self, key: EventKey, partition: int, offset: int) -> bool:
        """True when an earlier copy of ``key`` sits at another position; records first copies."""
        first = self._first.get(key)
        if first is None:
            self._remember(key, (partition, offset))
            return False
        return first != (partition, offset)

    def _remember(self, key: EventKey, where: Position) -> None:
        self._first[key] = where
        if len(self._first) > self.max_ids:
            self._first.popitem(last=False)

    def load(self, lake: Lake, *, topic: str, partitions: Iterable[int]) -> int:
        """Forget everything, then remember the newest stored events of these partitions."""
        self._first.clear()
        parts = list(partitions)
        if not parts or not lake.exists(EVENTS_TABLE):
            return 0
        stored = lake.read(
            EVENTS_TABLE, columns=["tenant", "event_id", "kafka_partition", "kafka_offset", "ingested_at"],
            filter=(pc.field("kafka_topic") == topic) & pc.field("kafka_partition").isin(parts),
        )
        newest = _newest(stored, self.max_ids)
        columns = (newest.column(c).to_pylist() for c in ("tenant", "event_id", "kafka_partition", "kafka_offset"))
        for tenant, event_id, p, o in zip(*columns):
            self._first.setdefault((tenant, event_id), (p, o))
        return len(self._first)


def _newest(stored: pa.Table, limit: int) -> pa.Table:
    """The last ``limit`` rows by ingestion time then offset, oldest first (so eviction order matches).

    Ingestion time first: after ``trajlake ingest --recover`` a partition's offsets start again, and the
    rows of the new log are the newest whatever their offsets.
    """
    order = pc.sort_indices(stored, sort_keys=[("ingested_at", "ascending"), ("kafka_offset", "ascending"),
                                               ("kafka_partition", "ascending")])
    return stored.take(order).slice(max(0, stored.num_rows - limit))
