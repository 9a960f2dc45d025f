"""A durable, bounded, on-disk FIFO of (key, value) records: the gateway's outage buffer.

Layout under ``root``: segment files ``<n>.seg`` (append-only, numbered in
order) holding length-prefixed records, and ``cursor`` holding the committed
read position ``<segment> <byte offset>``.

Record frame: ``u32 body length | u32 crc32(body) | u32 key length | key | value``
(big-endian). A torn tail (a crash mid-append) fails its length or crc check
and is cut off when the spool is reopened; every record before it survives.

Durability (fsync policy): every ``append`` call writes its records and
fsyncs the segment once before returning, so a batch is durable when
``append`` returns. ``commit`` rewrites the cursor via write-temp + fsync +
rename. A crash between a delivery and its ``commit`` replays that batch
again: delivery from the spool is at-least-once, and consumers dedupe by the
records' own ids (trajectory events keep their ``event_id``).

The spool is single-threaded by design: one owner (the gateway's emitter
thread) appends, reads and commits; other threads may only read the depth
counters. One process at a time: an exclusive ``flock`` on ``root/lock`` makes
a second opener fail with ``SpoolLocked`` instead of corrupting the files.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import Conflict, EXIT_BAD_SETTINGS, TrajlakeError

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">III")
_SEGMENT_SUFFIX = ".seg"


class SpoolFull(TrajlakeError, RuntimeError):
    """The spool holds ``max_bytes`` already; the records were not written."""


class SpoolLocked(Conflict):
    """Another process (or another open ``Spool``) holds this spool folder: nothing was started."""

    exit_code = EXIT_BAD_SETTINGS


@dataclass(frozen=True)
class Position:
    """A place in the spool: segment number and byte offset inside it."""

    segment: int
    offset: int


@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes
    end: Position
    """Position just after this record: commit it to consume up to here."""


def record_size(key: bytes, value: bytes) -> int:
    """Bytes a record takes in the spool (what counts against ``max_bytes``)."""
    return _HEADER.size + len(key) + len(value)


def _frame(key: bytes, value: bytes) -> bytes:
    body = struct.pack(">I", len(key)) + key + value
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


class Spool:
    """Open (or create) the spool in ``root``; at most ``max_bytes`` unconsumed.

    >>> spool = Spool(Path("/tmp/spool"), max_bytes=64 << 20)  # doctest: +SKIP
    >>> spool.append([(b"rollout-1", b'{"event_id": ...}')])
    >>> batch = spool.read(max_records=100)
    >>> deliver(batch); spool.commit(batch)
    """

    def __init__(self, root: Path, *, max_bytes: int, segment_bytes: int = 16 << 20) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_folder(self.root)
        self._cursor = self._load_cursor()
        self._sizes = self._recover_segments()
        self.depth_records = sum(1 for _ in self._scan(self._cursor, limit=None))
        self.depth_bytes = self._unconsumed_bytes()
        log.info("spool opened root=%s records=%d bytes=%d", self.root, self.depth_records, self.depth_bytes)

    # ------------------------------------------------------------ writing

    def append(self, records: list[tuple[bytes, bytes]]) -> None:
        """Append records durably (one fsync), all or none; raises ``SpoolFull``."""
        if not records:
            return
        frames = [_frame(k, v) for k, v in records]
        size = sum(len(f) for f in frames)
        if self.depth_bytes + size > self.max_bytes:
            raise SpoolFull(
                f"spool {self.root} holds {self.depth_bytes} of {self.max_bytes} bytes; "
                f"{len(records)} records ({size} bytes) do not fit"
            )
        segment = self._writable_segment()
        with open(self._path(segment), "ab") as f:
            f.write(b"".join(frames))
            f.flush()
            os.fsync(f.fileno())
        self._sizes[segment] += size
        self.depth_records += len(records)
        self.depth_bytes += size

    def _writable_segment(self) -> int:
        live = max(self._sizes, default=None)
        if live is not None and self._sizes[live] < self.segment_bytes:
            return live
        segment = max(live or 0, self._cursor.segment) + 1
        self._path(segment).touch()
        _fsync_dir(self.root)
        self._sizes[segment] = 0
        return segment

    # ------------------------------------------------------------ reading

    def read(self, *, max_records: int, max_bytes: int = 4 << 20) -> list[Record]:
        """The oldest unconsumed records, without consuming them."""
        out: list[Record] = []
        size = 0
        for record in self._scan(self._cursor, limit=max_records):
            out.append(record)
            size += len(record.key) + len(record.value)
            if size >= max_bytes:
                break
        return out

    def commit(self, batch: list[Record]) -> None:
        """Consume ``batch`` (the oldest records, as ``read`` returned them); deletes finished segments."""
        if not batch:
            return
        end = batch[-1].end
        tmp = self.root / "cursor.tmp"
        with open(tmp, "w") as f:
            f.write(f"{end.segment} {end.offset}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / "cursor")
        _fsync_dir(self.root)
        self._cursor = end
        self.depth_records -= len(batch)
        for segment in [s for s in self._sizes if s < end.segment]:
            self._path(segment).unlink(missing_ok=True)
            del self._sizes[segment]
        self.depth_bytes = self._unconsumed_bytes()

    def close(self) -> None:
        """Release the folder lock; the spool object must not be used afterwards."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------ internals

    def _path(self, segment: int) -> Path:
        return self.root / f"{segment:020d}{_SEGMENT_SUFFIX}"

    def _load_cursor(self) -> Position:
        path = self.root / "cursor"
        if not path.exists():
            return Position(0, 0)
        try:
            segment, offset = (int(x) for x in path.read_text().split())
        except ValueError as exc:
            raise RuntimeError(
                f"spool cursor {path} is corrupt ({exc}); inspect the spool folder before deleting it"
            ) from None
        return Position(segment, offset)

    def _recover_segments(self) -> dict[int, int]:
        """Sizes of live segments; drops consumed ones and cuts a torn tail off the last."""
        sizes: dict[int, int] = {}
        for path in sorted(self.root.glob(f"*{_SEGMENT_SUFFIX}")):
            segment = int(path.stem)
            if segment < self._cursor.segment:
                path.unlink()
                continue
            sizes[segment] = path.stat().st_size
        for segment in sorted(sizes):
            good = self._valid_length(segment)
            if good != sizes[segment]:
                log.warning(
                    "spool torn tail cut segment=%s kept_bytes=%d dropped_bytes=%d",
                    segment, good, sizes[segment] - good,
                )
                with open(self._path(segment), "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
                sizes[segment] = good
        return sizes

    def _valid_length(self, segment: int) -> int:
        data = self._path(segment).read_bytes()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc, _ = _HEADER.unpack_from(data, offset)
            body = data[offset + 8: offset + 8 + length]
            if len(body) != length or zlib.crc32(body) != crc:
                break
            offset += 8 + length
        return offset

    def _scan(self, start: Position, *, limit: int | None) -> Iterator[Record]:
        count = 0
        for segment in sorted(s for s in self._sizes if s >= start.segment):
            offset = start.offset if segment == start.segment else 0
            size = self._sizes[segment]
            with open(self._path(segment), "rb") as f:
                f.seek(offset)
                while offset + _HEADER.size <= size:
                    if limit is not None and count >= limit:
                        return
                    length, _, key_len = _HEADER.unpack(f.read(_HEADER.size))
                    key = f.read(key_len)
                    value = f.read(length - 4 - key_len)
                    offset += 8 + length
                    count += 1
                    yield Record(key, value, Position(segment, offset))

    def _unconsumed_bytes(self) -> int:
        total = 0
        for segment, size in self._sizes.items():
            total += size - (self._cursor.offset if segment == self._cursor.segment else 0)
        return max(total, 0)


def _lock_folder(root: Path):
    handle = open(root / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SpoolLocked(
            f"spool {root} is in use by another gateway process: give each gateway its own TRAJLAKE_SPOOL_DIR"
        ) from None
    return handle


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
