"""UUIDv7 event ids (RFC 9562) and RFC 3339 timestamps.

Python 3.11's ``uuid`` has no ``uuid7``. A UUIDv7 starts with the Unix time
in milliseconds, so ids sort by creation time and Parquet/Delta files of
events stay roughly clustered by time.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone

_MAX_MS = (1 << 48) - 1
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7(*, unix_ms: int | None = None, random_bytes: bytes | None = None) -> str:
    """A UUIDv7 string. Without arguments: now, monotonic within this process.

    Pass ``unix_ms`` and 10 ``random_bytes`` for a deterministic id (the
    workload generator does, so a seed reproduces every event id).

    >>> uuid7(unix_ms=0, random_bytes=bytes(10))
    '00000000-0000-7000-8000-000000000000'
    """
    if unix_ms is None:
        if random_bytes is not None:
            raise ValueError("random_bytes needs unix_ms: a deterministic id needs both")
        unix_ms, rand_a = _next_tick()
        tail = int.from_bytes(os.urandom(8), "big")
    else:
        if random_bytes is None:
            random_bytes = os.urandom(10)
        if len(random_bytes) != 10:
            raise ValueError(f"random_bytes must be 10 bytes, got {len(random_bytes)}")
        rand_a = int.from_bytes(random_bytes[:2], "big") & 0xFFF
        tail = int.from_bytes(random_bytes[2:], "big")
    if not 0 <= unix_ms <= _MAX_MS:
        raise ValueError(f"unix_ms must lie in [0, 2**48), got {unix_ms}")
    value = (unix_ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | (tail & ((1 << 62) - 1))
    h = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, without building the object
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _next_tick() -> tuple[int, int]:
    """(ms, 12-bit counter): ids made in the same millisecond still sort in creation order."""
    global _last_ms, _counter
    with _lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms, _counter = now, int.from_bytes(os.urandom(1), "big")
        else:
            _counter += 1
            if _counter > 0xFFF:  # 4096 ids in one ms: borrow the next millisecond
                _last_ms, _counter = _last_ms + 1, 0
        return _last_ms, _counter


def rfc3339(unix_ms: int | None = None) -> str:
    """``2026-01-01T00:00:00.000Z`` for ``unix_ms`` (default: now), always UTC."""
    if unix_ms is None:
        unix_ms = time.time_ns() // 1_000_000
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
