"""Dedupe by event_id: which message first carried an id.

A producer retry sends the same event twice; both copies carry the same
``event_id`` and (key = rollout_id) land on the same partition, close together.
``SeenEventIds`` remembers, per id, the (partition, offset) of its first copy.
A message is a duplicate iff its id was first seen at *another* position, so a
replay after a crash (the same message at the same offset) decides exactly as
the first pass did.

Memory bound: at most ``max_ids`` ids (default 1,000,000, about 200 MB of
Python objects with 40-byte ids), oldest evicted first. At assignment the ids
of the newest ``max_ids`` events of the assigned partitions are loaded from the
``events`` table. A retry that arrives more than ``max_ids`` events after its
original (on the assigned partitions), or on another partition owned by
another ingester, is not caught.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from store.lake import Lake

DEFAULT_MAX_IDS = 1_000_000


class SeenEventIds:
    """Bounded map event_id -> (partition, offset) of its first copy."""

    def __init__(self, *, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.max_ids = max_ids
        self._first: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._first)

    def is_duplicate(self, event_id: str, partition: int, offset: int) -> bool:
        """True when an earlier copy of ``event_id`` sits at another position; records first copies."""
        first = self._first.get(event_id)
        if first is None:
            self._remember(event_id, (partition, offset))
            return False
        return first != (partition, offset)

    def _remember(self, event_id: str, where: tuple[int, int]) -> None:
        self._first[event_id] = where
        if len(self._first) > self.max_ids:
            self._first.popitem(last=False)

    def load(self, lake: Lake, *, topic: str, partitions: Iterable[int]) -> int:
        """Forget everything, then remember the newest stored events of these partitions."""
        self._first.clear()
        parts = list(partitions)
        if not parts or not lake.exists("events"):
            return 0
        stored = lake.read(
            "events", columns=["event_id", "kafka_partition", "kafka_offset"],
            filter=(pc.field("kafka_topic") == topic) & pc.field("kafka_partition").isin(parts),
        )
        newest = _newest(stored, self.max_ids)
        for event_id, p, o in zip(*(newest.column(c).to_pylist() for c in newest.column_names)):
            self._first.setdefault(event_id, (p, o))
        return len(self._first)


def _newest(stored: pa.Table, limit: int) -> pa.Table:
    """The last ``limit`` rows by offset, oldest first (so eviction order matches)."""
    order = pc.sort_indices(stored, sort_keys=[("kafka_offset", "ascending"), ("kafka_partition", "ascending")])
    return stored.take(order).slice(max(0, stored.num_rows - limit))
