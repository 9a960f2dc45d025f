"""glibc's malloc arenas, capped for processes with many threads (the ingester, the query API's workers).

glibc gives threads that contend for the heap arenas of their own (up to 8 per core), each keeping its own
free lists and reserving 64 MB of address space: an ingester with ~140 threads keeps freed memory in many
of them (``ingest.allocators``), and a query worker's address-space cap (``store.tenant_worker``) would
count reservations rather than memory. Both cap the arenas at ``ARENAS`` with ``limit_arenas``.
"""

from __future__ import annotations

import ctypes
import os

ARENAS = 2
M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter number (malloc.h)."""


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap this process's glibc malloc arenas at ``arenas`` (``mallopt(M_ARENA_MAX)``), unless
    ``MALLOC_ARENA_MAX`` is set (an operator's choice wins); False when glibc refused the setting.
    Without glibc (musl, macOS) there are no arenas to limit: True."""
    return mallopt(M_ARENA_MAX, arenas, unless_set="MALLOC_ARENA_MAX")


def mallopt(parameter: int, value: int, *, unless_set: str) -> bool:
    """glibc's ``mallopt(parameter, value)`` unless the environment variable ``unless_set`` (glibc's own spelling of
    the same setting) is set: an operator's choice wins. False when glibc refused it; True without glibc."""
    if unless_set in os.environ:
        return True
    try:
        return bool(ctypes.CDLL(None).mallopt(parameter, value))
    except (OSError, AttributeError):
        return True
