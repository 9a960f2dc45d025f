"""Is the log still the one the lake's markers describe? Checked by reading records, not end offsets.

A Kafka log can go backwards under an ingester: the embedded broker's memory
storage starts again at offset 0 after a restart, a topic can be deleted and
recreated, a consumer can be pointed at another cluster. Markers in the lake
then point past data the ingester never read, and seeking to them would skip
it without a word. End offsets cannot tell (tansu reports the last batch's
base offset + 1, measured: 1 with 100 records, 9 with 10), so the guard reads
records:

* on every (re)assignment, the record at each partition's marker must exist and
  be the one the lake holds there (the ``events`` row at that offset has its
  event_id; without one: its duplicate's first copy, or a quarantined message
  at that offset);
* before every commit, the record at the last committed offset must still be
  the very record the ingester read there (a digest of its bytes), so a log
  that restarted or was recreated under a running ingester is caught before
  anything read from the new log lands in the lake.

``LogWentBackwards`` names the topic, partitions, markers and what the log
holds, and the recovery command. A record that does not come back (tansu on
object storage can answer a fetch with nothing, or out of range, for a while)
is never taken as missing by itself: the log's earliest record decides. If it
is the one the lake holds at its offset, this is still the log that was read
and the check is ``LogUnverifiable`` (wait and retry); if not, the log went
backwards. A broker that does not answer is ``LogUnverifiable`` too.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, OffsetOutOfRangeError

from ingest.consumer import FETCH_MAX_WAIT_MS
from schemas.errors import EXIT_LOG_WENT_BACKWARDS, DataError, Unreachable

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
"""How long to wait for a record before the broker counts as not serving it. tansu on ``s3://`` storage costs
more per request the more batches a partition holds: on a loaded 2-core machine with a local moto server, one
record of a 300-batch partition came back after 2.4-5.6 s (fetch wait 2 s). Each wait for a record that is
not there (a log that went backwards to before it) costs this long."""
OFFSETS_TIMEOUT_S = 30.0
"""How long a ListOffsets may take: on that tansu, 0.4 s at 100 batches per partition, 4.5 s at 1,000."""

Checked = TypeVar("Checked")

Read = tuple[int, bytes | None, bytes | None]
"""A record the probe read: (offset, value, key)."""
Held = Callable[[int, int, bytes | None, bytes | None], bool]
"""(partition, offset, message value, message key) -> whether the lake holds that very message at that offset."""


class LogWentBackwards(DataError):
    """The log no longer holds what the lake's markers say was read: restarted, truncated or recreated."""

    exit_code = EXIT_LOG_WENT_BACKWARDS

    def __init__(self, topic: str, group: str, problems: Mapping[int, str]) -> None:
        self.topic, self.group, self.problems = topic, group, dict(problems)
        where = "; ".join(f"partition {p}: {why}" for p, why in sorted(problems.items()))
        super().__init__(
            f"topic {topic!r} no longer matches the lake's markers of group {group!r}: {where}. "
            "Nothing past the markers was written. If the log was reset or the topic recreated, run "
            "`trajlake ingest --recover` with the same --lake, --topic and --group: it re-reads these partitions "
            "from their earliest offset and writes only events the lake does not hold yet"
        )


class LogUnverifiable(Unreachable):
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
    """A second consumer, without a group, that reads the record at given offsets.

    kafka-python, unlike the ingester's consumer: a confluent-kafka (librdkafka 2.16.0) probe crashed the
    process (SIGSEGV in librdkafka's ``rd_kafka_metadata_update_op``, its metadata thread; upstream
    confluentinc/librdkafka#5280) in 5 of 8 runs of the broker-restart test
    (``test_broker_restarted_under_a_running_ingester_is_refused_then_recovered``); with this probe on
    kafka-python, 0 of 6. It reads one record per partition per commit, so its client's speed matters little.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.topic, self.timeout_s = topic, timeout_s
        self.interrupted = threading.Event()
        """Set (from another thread) to cut the reads in progress short: they then end in ``LogUnverifiable``."""
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False, auto_offset_reset="none",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS, max_partition_fetch_bytes=1024 * 1024,
        )

    def read(self, offsets: Mapping[int, int | None]) -> dict[int, Read | None]:
        """Partition -> (offset, value, key) of the first record at or after the wanted offset (None: the earliest);
        None when none came back within the timeout.

        Raises ``LogUnverifiable`` when a record was not found and the broker does not answer for its partition.
        """
        if not offsets:
            return {}
        tps = {p: TopicPartition(self.topic, p) for p in offsets}
        found: dict[int, Read | None] = {}
        self._assign({p: o for p, o in offsets.items()}, tps)
        deadline = time.monotonic() + self.timeout_s
        while len(found) < len(offsets) and time.monotonic() < deadline and not self.interrupted.is_set():
            answered = len(found)
            try:
                polled = self._consumer.poll(timeout_ms=200)
            except OffsetOutOfRangeError as exc:
                polled = {}
                for tp in _partitions_of(exc):
                    found.setdefault(tp.partition, None)
            for tp, records in polled.items():
                if records and tp.partition not in found:
                    found[tp.partition] = (records[0].offset, records[0].value, records[0].key)
            if answered < len(found) < len(offsets):
                # drop the partitions answered (pausing them instead can stall the others' buffered fetches)
                self._assign({p: o for p, o in offsets.items() if p not in found}, tps)
        self._consumer.assign([])
        if len(found) < len(offsets) and self.interrupted.is_set():
            raise LogUnverifiable(f"the check of {self.topic} partitions {sorted(set(offsets) - set(found))} was "
                                  "interrupted (the assignment changed)")
        if len(found) < len(offsets):
            self._broker_answers([tps[p] for p in offsets if p not in found])
        return {p: found.get(p) for p in offsets}

    def _assign(self, offsets: Mapping[int, int | None], tps: Mapping[int, TopicPartition]) -> None:
        self._consumer.assign([tps[p] for p in offsets])
        for p, offset in offsets.items():
            if offset is None:
                self._consumer.seek_to_beginning(tps[p])
            else:
                self._consumer.seek(tps[p], offset)

    def _broker_answers(self, tps: list[TopicPartition]) -> dict[int, int]:
        try:
            ends = self._consumer.end_offsets(tps, timeout_ms=int(OFFSETS_TIMEOUT_S * 1000))
        except KafkaError as exc:
            raise LogUnverifiable(f"the broker did not answer for {self.topic} partitions "
                                  f"{sorted(tp.partition for tp in tps)}: {exc}") from exc
        log.debug("log probe found no record partitions=%s end_offsets=%s", [tp.partition for tp in tps],
                  {tp.partition: o for tp, o in ends.items()})
        return {tp.partition: o for tp, o in ends.items()}

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        """What the broker reports as each partition's end (wrong on tansu unless 0: use only to tell empty)."""
        return self._broker_answers([TopicPartition(self.topic, p) for p in partitions])

    def close(self) -> None:
        try:
            self._consumer.close(autocommit=False)
        except KafkaError as exc:  # closing a probe of a broker that went away
            log.debug("log probe close error=%s", exc)


class LogGuard:
    """Checks the log against the lake on assignment and against what was read before each commit.

    ``lake_has(partition, offset, value, key)`` says whether the lake holds that very message at that offset
    (``ingest.held.LakeRecords.has_at``).
    """

    def __init__(self, probe: LogProbe, *, topic: str, group: str, lake_has: Held) -> None:
        self.probe, self.topic, self.group, self.lake_has = probe, topic, group, lake_has
        self._read: dict[int, Fingerprint] = {}

    def check_markers(self, markers: Mapping[int, int | None]) -> dict[int, str]:
        """Problems per partition whose record at its marker is missing or not the one the lake holds."""
        self._read = {p: f for p, f in self._read.items() if p in markers}
        wanted = {p: m for p, m in markers.items() if m is not None and m >= 0}
        got = self.probe.read(wanted)
        problems: dict[int, str] = {}
        for p, marker in wanted.items():
            record = got[p]
            if record is None:
                continue
            if record[0] != marker:
                problems[p] = _gone(marker, record[0])
            elif not self.lake_has(p, marker, record[1], record[2]):
                problems[p] = (f"marker {marker}, but the record at offset {marker} is not the one the lake holds "
                               "(topic recreated, or another cluster?)")
            else:
                self._read[p] = Fingerprint.of(marker, record[1])
        return self._unanswered(wanted, got, problems)

    def recheck(self, partitions: list[int]) -> dict[int, str]:
        """Problems per partition whose last committed record is no longer the one that was read."""
        wanted = {p: self._read[p] for p in partitions if p in self._read}
        offsets = {p: f.offset for p, f in wanted.items()}
        got = self.probe.read(offsets)
        problems: dict[int, str] = {}
        for p, expected in wanted.items():
            record = got[p]
            if record is None:
                continue
            if record[0] != expected.offset:
                problems[p] = _gone(expected.offset, record[0])
            elif Fingerprint.of(record[0], record[1]) != expected:
                problems[p] = (f"marker {expected.offset}, but the record at offset {expected.offset} changed since "
                               "it was read (log restarted or topic recreated under the ingester?)")
        return self._unanswered(offsets, got, problems)

    def _unanswered(self, offsets: Mapping[int, int], got: Mapping[int, Read | None],
                    problems: dict[int, str]) -> dict[int, str]:
        """For partitions whose record at the marker did not come back, tell a log that went backwards from a
        slow broker (tansu on object storage can answer a fetch with nothing, or out of range, for a while).

        The log's earliest record decides: if it is the one the lake holds at that offset, this is still the
        log that was read (``LogUnverifiable``: retry later); if it is another, the log went backwards. A log
        with no record at all whose end offset is 0 is empty (tansu's wrong end offsets are >= 1 otherwise).
        """
        missing = {p: o for p, o in offsets.items() if got.get(p) is None}
        if not missing:
            return problems
        earliest = self.probe.read({p: None for p in missing})
        unserved = [p for p in missing if earliest[p] is None]
        ends = self.probe.end_offsets(unserved) if unserved else {}
        slow: list[int] = []
        for p, marker in missing.items():
            first = earliest[p]
            if first is None and ends.get(p) == 0:
                problems[p] = (f"marker {marker}, but the log is empty (broker restarted with memory storage, "
                               "or topic recreated?)")
            elif first is None:
                slow.append(p)
            elif first[0] > marker:
                problems[p] = _gone(marker, first[0])
            elif self.lake_has(p, first[0], first[1], first[2]):
                slow.append(p)
            else:
                problems[p] = (f"marker {marker}, but the log holds no record at offset {marker} and its record at "
                               f"offset {first[0]} is not the one the lake holds there (broker restarted with memory "
                               "storage, topic recreated, or another cluster?)")
        if slow and not problems:
            raise LogUnverifiable(f"the broker did not serve {self.topic} partitions {slow} at their markers yet")
        return problems

    def remember(self, partition: int, offset: int, value: bytes | None) -> None:
        """The last record of a committed batch: what ``recheck`` expects at that offset next time."""
        self._read[partition] = Fingerprint.of(offset, value)

    def forget(self, partition: int) -> None:
        self._read.pop(partition, None)


class CheckInFlight(Generic[Checked]):
    """A check run on its own thread (reads of the lake, then ``LogGuard.check_markers``), so that the loop keeps
    polling its consumer meanwhile.

    A check can take a minute on a slow broker (tansu on ``s3://`` right after a restart: two record reads of
    ``PROBE_TIMEOUT_S`` and a ListOffsets of ``OFFSETS_TIMEOUT_S``). A group member that does not poll for that
    long does not rejoin a rebalance, so every other member's join waits for it, and its own next check starts
    only when the join it held up is over: two ingesters were seen taking turns this way for minutes without
    a commit (soak, F8). ``interrupt`` ends the reads in progress early, when the assignment changed under them.
    """

    def __init__(self, guard: LogGuard) -> None:
        self.guard = guard
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-check")
        self._future: Future[Checked] | None = None

    @property
    def running(self) -> bool:
        return self._future is not None and not self._future.done()

    def start(self, check: Callable[[], Checked]) -> None:
        """Run ``check`` in the background; only once the previous one has ended (one probe, one reader)."""
        if self.running:
            raise RuntimeError("a log check is already running")
        self.guard.probe.interrupted.clear()
        self._future = self._pool.submit(check)

    def result(self) -> Checked | None:
        """What ``check`` returned (raises what it raised: ``LogUnverifiable``), None while it runs or if none ran."""
        if self._future is None or not self._future.done():
            return None
        future, self._future = self._future, None
        self.guard.probe.interrupted.clear()
        return future.result()

    def interrupt(self) -> None:
        """Cut the check in progress short (its result is then to be dropped); waits for nothing."""
        if self.running:
            self.guard.probe.interrupted.set()

    def close(self) -> None:
        self.interrupt()
        self._pool.shutdown(wait=True)


def _gone(marker: int, first: int) -> str:
    return (f"marker {marker}, but the log's first record from there is at offset {first} "
            "(records the lake says were read are gone: truncated, or deleted by retention before they were read)")


def _partitions_of(exc: OffsetOutOfRangeError) -> list[TopicPartition]:
    """kafka-python raises ``OffsetOutOfRangeError({tp: offset})``."""
    arg = exc.args[0] if exc.args else {}
    return list(arg) if isinstance(arg, dict) else []
