"""Hand memory the ingester freed back to the OS, so its RSS follows its live data (glibc only).

Each batch allocates and frees its messages, rows and Arrow buffers (tens of MB
at full batches) from many threads: the loop, the commit pool, librdkafka's.
glibc gives each thread that contends a malloc arena of its own (up to 8 per
core) and keeps what is freed in every arena for reuse. Measured in the soak
(``bench/ingest/run.py --soak-minutes``, 200 events/s): glibc's free-but-kept
bytes grew 2.5 -> 30-64 MB in 4 minutes while its bytes in use stayed 20-40 MB.
Two arenas and a ``malloc_trim`` after each committed batch keep that bounded.
Elsewhere (macOS, musl) both are no-ops.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from functools import cache

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""mallopt parameter (glibc malloc.h): the most arenas malloc creates."""
ARENAS = 2
"""One for the loop, one shared by the writer threads: more arenas only keep more freed memory."""


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None  # glibc, not musl


def cap_malloc_arenas(arenas: int = ARENAS) -> None:
    """Fewer malloc arenas for threads started from now on (call before they start)."""
    libc = _glibc()
    if libc is not None and not libc.mallopt(M_ARENA_MAX, arenas):
        log.debug("mallopt(M_ARENA_MAX, %d) refused", arenas)


def release_freed_memory() -> None:
    """Return free memory of every malloc arena to the OS (``malloc_trim(0)``: a few ms)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
