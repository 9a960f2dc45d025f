"""Is the log still the one the lake's markers describe? Checked by reading records, not end offsets.

A Kafka log can go backwards under an ingester: the embedded broker's memory
storage starts again at offset 0 after a restart, a topic can be deleted and
recreated, a consumer can be pointed at another cluster. Markers in the lake
then point past data the ingester never read, and seeking to them would skip
it without a word. End offsets cannot tell (tansu reports the last batch's
base offset + 1, measured: 1 with 100 records, 9 with 10), so the guard reads
records:

* on every (re)assignment, the record at each partition's marker must exist and
  be one the lake holds (the caller's ``held``: an event in ``events``, its
  duplicate, or a quarantined message at that offset);
* before every commit, the record at the last committed offset must still be
  the very record the ingester read there (a digest of its bytes), so a log
  that restarted or was recreated under a running ingester is caught before
  anything read from the new log lands in the lake.

``LogWentBackwards`` names the topic, partitions, markers and what the log
holds, and the recovery command. A record not found is only called missing
once the broker has answered a ListOffsets request for its partition; a broker
that does not answer makes the check ``LogUnverifiable`` (wait and retry),
never a false alarm.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, OffsetOutOfRangeError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""How long to wait for a record before concluding the log does not hold it (tansu answers in ~0.1 s)."""

Held = Callable[[int, int, bytes | None], bool]
"""(partition, offset, message value) -> whether the lake holds that message."""


class LogWentBackwards(RuntimeError):
    """The log no longer holds what the lake's markers say was read: restarted, truncated or recreated."""

    def __init__(self, topic: str, group: str, problems: Mapping[int, str]) -> None:
        self.topic, self.group, self.problems = topic, group, dict(problems)
        where = "; ".join(f"partition {p}: {why}" for p, why in sorted(problems.items()))
        super().__init__(
            f"topic {topic!r} no longer matches the lake's markers of group {group!r}: {where}. "
            "Nothing past the markers was written. If the log was reset or the topic recreated, run "
            "`trajlake ingest --recover` with the same --lake, --topic and --group: it re-reads these partitions "
            "from their earliest offset and writes only events the lake does not hold yet"
        )


class LogUnverifiable(ConnectionError):
    """The broker did not answer, so the log could not be checked; nothing is committed until it can be."""


@dataclass(frozen=True)
class Fingerprint:
    """The record the ingester read at ``offset``, by a digest of its bytes."""

    offset: int
    digest: bytes

    @classmethod
    def of(cls, offset: int, value: bytes | None) -> Fingerprint:
        return cls(offset, hashlib.blake2b(value or b"", digest_size=16).digest())


class LogProbe:
    """A second consumer, without a group, that reads the record at given offsets."""

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.topic, self.timeout_s = topic, timeout_s
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False, auto_offset_reset="none",
            fetch_max_wait_ms=100, max_partition_fetch_bytes=1024 * 1024,
        )

    def read(self, offsets: Mapping[int, int]) -> dict[int, tuple[int, bytes | None] | None]:
        """Partition -> (offset, value) of the first record at or after the wanted offset; None: the log has none.

        Raises ``LogUnverifiable`` when a record was not found and the broker does not answer for its partition.
        """
        if not offsets:
            return {}
        tps = {p: TopicPartition(self.topic, p) for p in offsets}
        found: dict[int, tuple[int, bytes | None] | None] = {}
        self._assign({p: o for p, o in offsets.items()}, tps)
        deadline = time.monotonic() + self.timeout_s
        while len(found) < len(offsets) and time.monotonic() < deadline:
            answered = len(found)
            try:
                polled = self._consumer.poll(timeout_ms=200)
            except OffsetOutOfRangeError as exc:
                polled = {}
                for tp in _partitions_of(exc):
                    found.setdefault(tp.partition, None)
            for tp, records in polled.items():
                if records and tp.partition not in found:
                    found[tp.partition] = (records[0].offset, records[0].value)
            if answered < len(found) < len(offsets):
                # drop the partitions answered (pausing them instead can stall the others' buffered fetches)
                self._assign({p: o for p, o in offsets.items() if p not in found}, tps)
        self._consumer.assign([])
        if len(found) < len(offsets):
            self._broker_answers([tps[p] for p in offsets if p not in found])
        return {p: found.get(p) for p in offsets}

    def _assign(self, offsets: Mapping[int, int], tps: Mapping[int, TopicPartition]) -> None:
        self._consumer.assign([tps[p] for p in offsets])
        for p, offset in offsets.items():
            self._consumer.seek(tps[p], offset)

    def _broker_answers(self, tps: list[TopicPartition]) -> None:
        try:
            ends = self._consumer.end_offsets(tps, timeout_ms=int(self.timeout_s * 1000))
        except KafkaError as exc:
            raise LogUnverifiable(f"the broker did not answer for {self.topic} partitions "
                                  f"{sorted(tp.partition for tp in tps)}: {exc}") from exc
        log.debug("log probe found no record partitions=%s end_offsets=%s", [tp.partition for tp in tps],
                  {tp.partition: o for tp, o in ends.items()})

    def close(self) -> None:
        try:
            self._consumer.close(autocommit=False)
        except KafkaError as exc:  # closing a probe of a broker that went away
            log.debug("log probe close error=%s", exc)


class LogGuard:
    """Checks the log against the lake on assignment and against what was read before each commit."""

    def __init__(self, probe: LogProbe, *, topic: str, group: str) -> None:
        self.probe, self.topic, self.group = probe, topic, group
        self._read: dict[int, Fingerprint] = {}

    def check_markers(self, markers: Mapping[int, int | None], held: Held) -> dict[int, str]:
        """Problems per partition whose record at its marker is missing or not one the lake holds."""
        self._read = {p: f for p, f in self._read.items() if p in markers}
        wanted = {p: m for p, m in markers.items() if m is not None and m >= 0}
        problems: dict[int, str] = {}
        for p, got in self.probe.read(wanted).items():
            marker = wanted[p]
            if (why := _missing(marker, got)) is not None:
                problems[p] = why
            elif not held(p, marker, got[1]):
                problems[p] = (f"marker {marker}, but the record at offset {marker} is not one the lake holds "
                               "(topic recreated, or another cluster?)")
            else:
                self._read[p] = Fingerprint.of(marker, got[1])
        return problems

    def recheck(self, partitions: list[int]) -> dict[int, str]:
        """Problems per partition whose last committed record is no longer the one that was read."""
        wanted = {p: self._read[p] for p in partitions if p in self._read}
        problems: dict[int, str] = {}
        for p, got in self.probe.read({p: f.offset for p, f in wanted.items()}).items():
            expected = wanted[p]
            if (why := _missing(expected.offset, got)) is not None:
                problems[p] = why
            elif Fingerprint.of(got[0], got[1]) != expected:
                problems[p] = (f"marker {expected.offset}, but the record at offset {expected.offset} changed since "
                               "it was read (log restarted or topic recreated under the ingester?)")
        return problems

    def remember(self, partition: int, offset: int, value: bytes | None) -> None:
        """The last record of a committed batch: what ``recheck`` expects at that offset next time."""
        self._read[partition] = Fingerprint.of(offset, value)

    def forget(self, partition: int) -> None:
        self._read.pop(partition, None)


def _missing(marker: int, got: tuple[int, bytes | None] | None) -> str | None:
    if got is None:
        return (f"marker {marker}, but the log holds no record at offset {marker} "
                "(the log is behind the marker: broker restarted with memory storage, topic truncated or recreated?)")
    if got[0] != marker:
        return (f"marker {marker}, but the log's first record from there is at offset {got[0]} "
                "(records the lake says were read are gone)")
    return None


def _partitions_of(exc: OffsetOutOfRangeError) -> list[TopicPartition]:
    """kafka-python raises ``OffsetOutOfRangeError({tp: offset})``."""
    arg = exc.args[0] if exc.args else {}
    return list(arg) if isinstance(arg, dict) else []
