"""Dedupe by (tenant, event_id): which message first carried an id.

A producer retry sends the same event twice; both copies carry the same
``event_id`` and (key = rollout_id) land on the same partition, close together.
``SeenEventIds`` remembers, per (tenant, event_id), the (partition, offset) of
its first copy. A message is a duplicate iff its id was first seen at
*another* position, so a replay after a crash (the same message at the same
offset) decides exactly as the first pass did. Ids are scoped to their tenant:
one tenant sending another's event ids first cannot make the other's events
vanish.

Memory bound: at most ``max_ids`` ids (default 1,000,000), oldest evicted first. At assignment the ids
of the newest ``max_ids`` events of the assigned partitions (by ingestion time,
then offset) are loaded from the ``events`` table. A retry that arrives more
than ``max_ids`` events after its original (on the assigned partitions), or on
another partition owned by another ingester, is not caught.

Layout: 28 B per id (a 16-byte digest of the key, partition, offset) in a ring of ``max_ids`` entries
in arrival order, and a 4-byte slot table at most half full that finds them (open addressing, linear
probing), so the oldest id is evicted in place: 36-44 B per id by how close the bound sits below a power of
two, 36.4 MB at 1,000,000 ids (the ordered dict of tuples and id strings it replaced: ~380 B per id). The whole bound is
mapped and made resident when the ring is built (one anonymous mapping, ``MAP_POPULATE``: ~15-30 ms for 36 MB),
so the process's RSS holds it from its first minute instead of growing by ~0.4 MB a minute at 200 events/s
until the bound: ``dedupe_max_ids`` (the ingester's setting) is the knob. The digest is two
64-bit SipHash values of the key (Python's string hash, keyed per process by its random hash seed), so no
chosen event ids can crowd one slot; exact up to a 128-bit collision: with 10^6 ids remembered, 10^12
lookups meet one with probability ~10^-21. CPU: ~3 us per new id on this 2-core machine (the ordered
dict: ~1.4 us), against ~100 us to decode an event.
"""

from __future__ import annotations

import mmap
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

_LOW_64 = (1 << 64) - 1
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Linux: the ring's pages are made resident by the mmap itself (elsewhere they are mapped as first written)."""


class _IdRing:
    """Up to ``size`` digests with their positions, in arrival order, and the table that finds them.

    ``slots[s]`` is 0 (empty) or 1 + the ring index of an entry whose home slot is ``low & mask``; the
    entries of a probe run sit between their home and the next empty slot. All arrays are views of one
    anonymous mapping, populated (resident) at construction and unmapped when the ring is dropped.
    """

    def __init__(self, size: int) -> None:
        self.size, self.count, self.next = size, 0, 0
        self.mask = (1 << max(3, (2 * size - 1).bit_length())) - 1  # >= 2 * size slots: at most half full
        self.mapped_bytes = 4 * (self.mask + 1) + 28 * size
        self._mapping = mmap.mmap(-1, self.mapped_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        memory, start = memoryview(self._mapping), 0

        def view(fmt: str, width: int, n: int) -> memoryview:
            nonlocal start
            start += width * n
            return memory[start - width * n:start].cast(fmt)

        # 8-byte arrays first: every view starts at a multiple of its item size (slots: a power of two >= 8)
        self.slots = view("I", 4, self.mask + 1)
        self.high, self.low, self.offsets = view("Q", 8, size), view("Q", 8, size), view("q", 8, size)
        self.partitions = view("i", 4, size)

    def find(self, high: int, low: int) -> int:
        """The ring index of this digest, or -1."""
        slots, mask, highs, lows = self.slots, self.mask, self.high, self.low
        s = low & mask
        while (entry := slots[s]) != 0:
            if lows[entry - 1] == low and highs[entry - 1] == high:
                return entry - 1
            s = (s + 1) & mask
        return -1

    def add(self, high: int, low: int, partition: int, offset: int) -> None:
        """Remember a digest ``find`` does not know; the oldest entry makes room when the ring is full."""
        i = self.next
        if self.count == self.size:
            self._unlink(i)
        else:
            self.count += 1
        self.high[i], self.low[i], self.partitions[i], self.offsets[i] = high, low, partition, offset
        slots, mask = self.slots, self.mask
        s = low & mask
        while slots[s] != 0:
            s = (s + 1) & mask
        slots[s] = i + 1
        self.next = (i + 1) % self.size

    def _unlink(self, i: int) -> None:
        """Empty ring entry ``i``'s slot, moving the rest of its probe run back (no tombstones)."""
        slots, mask, lows = self.slots, self.mask, self.low
        hole = lows[i] & mask
        while slots[hole] != i + 1:
            hole = (hole + 1) & mask
        s = hole
        while (entry := slots[s := (s + 1) & mask]) != 0:
            home = lows[entry - 1] & mask
            stays = hole < home <= s if hole <= s else (home > hole or home <= s)
            if not stays:  # its home is at or before the hole: move it there
                slots[hole], hole = entry, s
        slots[hole] = 0


class SeenEventIds:
    """Bounded map (tenant, event_id) -> (partition, offset) of its first copy."""

    def __init__(self, *, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.max_ids = max_ids
        self._ring = _IdRing(max_ids)

    def __len__(self) -> int:
        return self._ring.count

    @property
    def mapped_bytes(self) -> int:
        """Bytes the ring maps (resident from the start, whatever the ids remembered)."""
        return self._ring.mapped_bytes

    @staticmethod
    def _digest(key: EventKey) -> tuple[int, int]:
        tenant, event_id = key
        text = f"{len(tenant)}:{tenant}{event_id}"
        return hash(text + "\x1f") & _LOW_64, hash(text) & _LOW_64

    def first_copy(self, key: EventKey) -> Position | None:
        """Where the first copy of ``key`` sits, if it is remembered."""
        ring = self._ring
        i = ring.find(*self._digest(key))
        return None if i < 0 else (ring.partitions[i], ring.offsets[i])

    def is_duplicate(self, key: EventKey, partition: int, offset: int) -> bool:
        """True when an earlier copy of ``key`` sits at another position; records first copies."""
        ring = self._ring
        high, low = self._digest(key)
        i = ring.find(high, low)
        if i < 0:
            ring.add(high, low, partition, offset)
            return False
        return ring.partitions[i] != partition or ring.offsets[i] != offset

    def load(self, lake: Lake, *, topic: str, partitions: Iterable[int]) -> int:
        """Forget everything, then remember the newest stored events of these partitions."""
        ring = _IdRing(self.max_ids)
        parts = list(partitions)
        if not parts or not lake.exists(EVENTS_TABLE):
            self._ring = ring
            return 0
        stored = lake.read(
            EVENTS_TABLE, columns=["tenant", "event_id", "kafka_partition", "kafka_offset", "ingested_at"],
            filter=(pc.field("kafka_topic") == topic) & pc.field("kafka_partition").isin(parts),
        )
        newest = _newest(stored, self.max_ids)
        columns = (newest.column(c).to_pylist() for c in ("tenant", "event_id", "kafka_partition", "kafka_offset"))
        for tenant, event_id, p, o in zip(*columns):
            high, low = self._digest((tenant, event_id))
            if ring.find(high, low) < 0:
                ring.add(high, low, p, o)
        self._ring = ring
        return ring.count


def _newest(stored: pa.Table, limit: int) -> pa.Table:
    """The last ``limit`` rows by ingestion time then offset, oldest first (so eviction order matches).

    Ingestion time first: after ``trajlake ingest --recover`` a partition's offsets start again, and the
    rows of the new log are the newest whatever their offsets.
    """
    order = pc.sort_indices(stored, sort_keys=[("ingested_at", "ascending"), ("kafka_offset", "ascending"),
                                               ("kafka_partition", "ascending")])
    return stored.take(order).slice(max(0, stored.num_rows - limit))
