"""bench/ingest's soak probes: which anonymous mapping holds memory, glibc's arenas, Python's heap growth by site."""

import ctypes
import mmap
import sys
import tracemalloc

import pytest

from bench.ingest import run

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and glibc's malloc_info")


@linux
def test_a_populated_mapping_shows_with_its_resident_megabytes():
    mapping = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    anchor = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(anchor)
    del anchor
    found = [(int(start, 16), size, rss) for start, (size, rss) in run.anon_mappings_mb().items()]
    assert any(start <= address < start + size * 2**20 and rss >= 8 for start, size, rss in found)
    mapping.close()


@linux
def test_glibc_heaps_count_the_holes_left_between_live_blocks():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    blocks = [libc.malloc(3000) for _ in range(4000)]
    for block in blocks[::2]:
        libc.free(block)
    try:
        heaps = run.glibc_heaps_mb()
        assert heaps and all(set(h) == {"system", "free", "free_under_8k"} for h in heaps)
        assert sum(h["free_under_8k"] for h in heaps) >= 5  # 2,000 holes of 3 KB, each between two live blocks
    finally:
        for block in blocks[1::2]:
            libc.free(block)


def test_heap_snapshots_name_the_site_that_grew():
    class Sampler:
        started = 0.0

    heap = run.HeapSnapshots(2, Sampler())
    kept = []
    tracemalloc.start(2)
    try:
        for _ in range(3):
            kept.append([bytes(1000) for _ in range(2000)])  # ~2 MB a "minute", held
            heap._take()
    finally:
        tracemalloc.stop()
    top = heap.growth()[0]
    assert top["kb"] > 1500
    assert any(where.startswith("tests/bench/test_ingest_soak_probes.py:") for where in top["where"])


@linux
def test_threads_by_name_counts_a_named_pool():
    import threading

    release = threading.Event()
    started = [threading.Thread(target=release.wait, daemon=True) for _ in range(3)]
    libc = ctypes.CDLL(None)
    for thread in started:
        thread.start()
        libc.pthread_setname_np(ctypes.c_ulong(thread.ident), b"soak-probe")
    try:
        assert run.threads_by_name().get("soak-probe") == 3
    finally:
        release.set()
        for thread in started:
            thread.join()
