"""Allocator settings of the ingester's process, applied at its start, before Arrow and delta-rs load.

Three allocators share the ingester's memory: glibc malloc (Python's large objects, librdkafka,
numpy), Arrow C++'s default pool (mimalloc: pyarrow's buffers) and delta-rs's statically linked
jemalloc (its Rust side: log replays, Parquet writes, object_store). Each keeps freed memory for
reuse, per thread or per arena, and the ingester runs ~140 threads (delta-rs's blocking pool).
``configure`` makes each hand memory back sooner:

* glibc: at most ``GLIBC_ARENAS`` arenas (``store.arenas``: ``mallopt(M_ARENA_MAX)``; default 8 per
  core, each keeping its own free lists), and blocks of ``GLIBC_MMAP_THRESHOLD`` or more in mappings of their
  own, handed back when freed (``mallopt(M_MMAP_THRESHOLD)``: glibc's default threshold rises to each such block
  freed, up to 32 MB, after which a batch's buffers are carved from the heaps and leave holes there);
* Arrow: the system pool (``ARROW_DEFAULT_MEMORY_POOL=system``: glibc, so its frees join the
  above instead of mimalloc's segments);
* delta-rs's jemalloc: dirty pages returned after 1 s instead of 10, and ``JEMALLOC_ARENAS`` arenas instead of
  4 per core (``_RJEM_MALLOC_CONF``, which jemalloc reads from the environment when it initialises); thread
  caches kept: without them (and with decay 0) the ingester spent 1.46x the CPU per event.

The last two are read once, when the library first allocates: ``configure`` must run before
``pyarrow`` or ``deltalake`` is imported, and says which settings it could not apply. A setting
already in the environment is left as it is (an operator's choice wins). Measured with
``bench/ingest/allocators.py`` (CPU per event and peak RSS, each setting alone and together) and the
soak (``bench/ingest/README.md``, memory).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

from store.arenas import ARENAS as GLIBC_ARENAS
from store.arenas import limit_arenas, mallopt

JEMALLOC_ARENAS = 2
"""delta-rs's jemalloc arenas (``narenas``; jemalloc's default is 4 per core, 8 on 2 cores). Each of the ~130 threads
(tokio's blocking pool: one per local file operation in flight) allocates from one arena, and each arena keeps its
own partly used slabs. 10-minute soaks at 200 events/s (bench/ingest/README.md, memory, 2026-12-03): RSS after
minute 1 263-267 vs 274 MB, peak 309-317 vs 326-328 (3 runs vs 2); the slope after minute 2 (+0.92, +1.08, +2.64
vs +2.23, +1.76 MB/min) did not separate: a lower level, not a removed trend. CPU per event 0.955x."""
ENVIRONMENT = {
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "_RJEM_MALLOC_CONF": f"dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:{JEMALLOC_ARENAS}",
}
"""Variables read by Arrow C++ and by delta-rs's jemalloc (prefixed ``_RJEM_``) when they first allocate."""
GLIBC_MMAP_THRESHOLD = 128 << 10
"""Blocks of at least this many bytes get a mapping of their own (glibc's initial threshold, kept fixed). With the
threshold left to rise, a 10-minute soak at 200 events/s grew glibc's thread arena +1.7-2.8 MB/min after minute 2
(10 -> 34 MB resident, its free-but-kept bytes 11 -> 66 MB: freed buffers' holes, below live blocks, that
``malloc_trim`` could not hand back); fixed, flat (-0.03, +0.2 MB/min; bench/ingest/README.md, memory)."""
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h)."""
TRIM_EVERY_S = 5.0
"""How often ``FreeMemoryTrim`` hands glibc's free pages back, at most."""
READS_ENVIRONMENT_AT_LOAD = {"ARROW_DEFAULT_MEMORY_POOL": "pyarrow", "_RJEM_MALLOC_CONF": "deltalake"}


def configure() -> list[str]:
    """Apply the settings to this process; returns those that came too late (their library is already loaded:
    left unset, so that they do not leak into child processes either)."""
    late = []
    for name, value in ENVIRONMENT.items():
        if name in os.environ:
            continue
        if READS_ENVIRONMENT_AT_LOAD[name] in sys.modules:
            late.append(name)
        else:
            os.environ[name] = value
    if not limit_arenas(GLIBC_ARENAS):
        late.append("M_ARENA_MAX")
    if not fix_mmap_threshold(GLIBC_MMAP_THRESHOLD):
        late.append("M_MMAP_THRESHOLD")
    return late


def fix_mmap_threshold(threshold: int = GLIBC_MMAP_THRESHOLD) -> bool:
    """Serve glibc blocks of ``threshold`` bytes or more from mappings of their own, whatever is freed later
    (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc from raising it), unless ``MALLOC_MMAP_THRESHOLD_`` is set
    (an operator's choice wins); False when glibc refused the setting. Without glibc: True (nothing to fix)."""
    return mallopt(M_MMAP_THRESHOLD, threshold, unless_set="MALLOC_MMAP_THRESHOLD_")


class FreeMemoryTrim:
    """Hands the free pages inside glibc's heaps back to the system (``malloc_trim(0)``), at most every ``every_s``.

    glibc returns freed memory to the system only from the top of a heap; what is freed below a live block
    stays resident. In a 10-minute soak its free-but-kept memory grew 50 -> 82 MB while its memory in use
    held at ~60 MB: most of the ingester's growth after minute 2 (``bench/ingest/README.md``, memory).
    ``malloc_trim(0)`` releases every free page of every arena. A no-op without glibc.
    """

    def __init__(self, *, every_s: float = TRIM_EVERY_S) -> None:
        self.every_s, self._last = every_s, time.monotonic()
        try:
            self._trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            self._trim = None

    def __call__(self) -> None:
        """Trim if ``every_s`` has passed since the last trim."""
        now = time.monotonic()
        if self._trim is not None and now - self._last >= self.every_s:
            self._trim(0)
            self._last = now
