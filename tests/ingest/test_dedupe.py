"""SeenEventIds' compact layout: the same decisions as a plain ordered map, in a bounded, small footprint."""

import ctypes
import mmap
import random
import sys
import tracemalloc
from collections import OrderedDict

import pytest

from ingest.dedupe import SeenEventIds


class Reference:
    """The decisions SeenEventIds must make, as the ordered dict of tuples it replaced."""

    def __init__(self, max_ids: int) -> None:
        self.max_ids, self.first = max_ids, OrderedDict()

    def is_duplicate(self, key, partition, offset):
        first = self.first.get(key)
        if first is None:
            self.first[key] = (partition, offset)
            if len(self.first) > self.max_ids:
                self.first.popitem(last=False)
            return False
        return first != (partition, offset)


def test_decides_as_an_ordered_map_through_evictions():
    rng = random.Random(14)
    for max_ids in (1, 2, 3, 7, 64):
        seen, reference = SeenEventIds(max_ids=max_ids), Reference(max_ids)
        for _ in range(4_000):  # ids drawn from 3x the bound: lookups of kept, evicted and new ids interleave
            key = (rng.choice(["acme", "other"]), f"e{rng.randrange(3 * max_ids + 2)}")
            partition, offset = rng.randrange(2), rng.randrange(40)
            if rng.random() < 0.3:
                assert seen.first_copy(key) == reference.first.get(key)
            else:
                assert seen.is_duplicate(key, partition, offset) == reference.is_duplicate(key, partition, offset)
            assert len(seen) == len(reference.first)


def test_keeps_exactly_the_newest_ids_with_their_positions():
    seen = SeenEventIds(max_ids=1_000)
    for i in range(2_500):
        assert not seen.is_duplicate(("acme", f"event-{i}"), i % 4, 10_000 + i)
    assert len(seen) == 1_000
    assert all(seen.first_copy(("acme", f"event-{i}")) is None for i in range(1_500))
    assert all(seen.first_copy(("acme", f"event-{i}")) == (i % 4, 10_000 + i) for i in range(1_500, 2_500))


def test_tenant_and_id_cannot_blur_into_each_other():
    seen = SeenEventIds(max_ids=10)
    assert not seen.is_duplicate(("ab", "c"), 0, 1)
    assert not seen.is_duplicate(("a", "bc"), 0, 2)
    assert seen.first_copy(("a", "bc")) == (0, 2)


def test_memory_stays_under_40_bytes_per_remembered_id():
    # the ordered dict of (tenant, event_id) tuples it replaced held ~380 B per id (the id strings included)
    ids = [("acme", f"{i:08x}-0000-4000-8000-000000000000") for i in range(60_000)]
    tracemalloc.start()
    try:
        seen = SeenEventIds(max_ids=50_000)
        for offset, key in enumerate(ids):
            seen.is_duplicate(key, 0, offset)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(seen) == 50_000
    assert seen.mapped_bytes / 50_000 < 40
    assert held < 64 << 10  # nothing per id on Python's heap: the ids live in the ring's mapping


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MAP_POPULATE and mincore are Linux's")
def test_the_whole_bound_is_resident_from_the_start():
    # RSS shows the configured bound from the first minute instead of growing with the ids until it
    seen = SeenEventIds(max_ids=200_000)
    assert len(seen) == 0
    mapping = seen._ring._mapping
    page = mmap.PAGESIZE
    pages = -(-len(mapping) // page)
    resident = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapping)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        assert libc.mincore(ctypes.addressof(anchor), len(mapping), resident) == 0, ctypes.get_errno()
    finally:
        del anchor
    assert len(mapping) == seen.mapped_bytes >= 200_000 * 36
    assert sum(b & 1 for b in resident) == pages
