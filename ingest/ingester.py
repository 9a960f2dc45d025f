"""The exactly-once ingester: Kafka -> validate -> dedupe -> Delta, one commit per table per batch.

Per batch, in this order: ``events`` (every valid, first-seen event), the
typed tables derived from those rows, then ``quarantine`` (after its dead
letters are flushed). Each commit carries the batch's last offset per
partition as a Delta transaction marker (``store.commit``); on start and on
every (re)assignment the loop seeks each partition to the smallest marker + 1.
A crash at any point therefore replays at most one batch (plus the bounded lag
of idle tables), and the markers make the replay write nothing twice.

>>> stop = threading.Event()  # doctest: +SKIP
>>> stats = run_ingester(IngesterConfig(lake="./lake", bootstrap_servers="127.0.0.1:9092"), stop)
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import pyarrow as pa
from kafka import KafkaConsumer

from ingest.batch import Batch, DecodedBatch
from ingest.consumer import AssignmentFlag, open_consumer, report_progress, seek
from ingest.dead_letters import DeadLetters
from ingest.redaction import Redactor
from ingest.dedupe import DEFAULT_MAX_IDS, SeenEventIds
from ingest.topics import ensure_topic
from schemas.events import DEFAULT_TOPIC
from schemas.tables import EVENTS, QUARANTINE, TYPED_TABLES
from schemas.versions import MAX_EVENT_BYTES
from store.commit import MarkedTable, OffsetConflict, resume_offsets
from store.event_rows import quarantine_table, typed_tables
from store.lake import Lake

log = logging.getLogger(__name__)

POLL_MS = 200
"""Longest wait inside one poll: bounds how late a stop request or batch deadline is seen."""


@dataclass(frozen=True)
class IngesterConfig:
    """Everything one ingester process needs (built by ``trajlake ingest`` from its settings)."""

    lake: str
    bootstrap_servers: str
    topic: str = DEFAULT_TOPIC
    group: str = "trajlake-ingest"
    """Consumer group; also names the Delta transaction markers, so it is the unit of progress."""
    partitions: tuple[int, ...] | None = None
    """Static assignment without a group (offsets live in Delta anyway); None = join the group."""
    dlq_topic: str | None = None
    """Dead-letter topic; None = ``<topic>.dlq``, "" = no dead-letter topic (quarantine only)."""
    batch_max_events: int = 20_000
    batch_max_bytes: int = 64 * 1024 * 1024
    batch_max_ms: int = 2_000
    """Oldest a batch gets while records keep arriving; a drained topic commits the batch in hand at once."""
    max_event_bytes: int = MAX_EVENT_BYTES
    dedupe_max_ids: int = DEFAULT_MAX_IDS
    marker_refresh_offsets: int = 50_000
    """An idle table's marker is committed once it trails by this many offsets (bounds restart replay)."""
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 2_000
    bootstrap_timeout_ms: int = 30_000
    """How long to look for a broker at start before ``BrokerUnreachable``."""
    stop_after_idle_s: float | None = None
    """Stop once nothing arrived for this long (demos, tests, backfills); None = run until stopped."""
    redactor: Redactor | None = None
    """``ingest.redaction`` rules, applied to every event and to quarantined raw text before they are written."""

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic}.dlq" if self.dlq_topic is None else self.dlq_topic


@dataclass
class IngestStats:
    """Running totals of one ingester."""

    consumed: int = 0
    bytes: int = 0
    events: int = 0
    """Rows written to ``events`` (first copies, not already in the table)."""
    duplicates: int = 0
    quarantined: int = 0
    batches: int = 0
    assignments: int = 0
    conflicts: int = 0
    commit_retries: int = 0
    """Commits retried after losing to a concurrent Delta delete (forget, retention) or compaction."""
    partitions: tuple[int, ...] = ()
    last_commit_s: float = 0.0
    """Wall time of the last batch's commit (decode + every table), for the commit latency metric."""
    rows: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


OnProgress = Callable[[IngestStats], None]
"""Called with the running stats after every committed batch and every (re)assignment."""


class _Tables:
    """The ingested tables, open, in commit order: events, typed tables, quarantine."""

    def __init__(self, lake: Lake, *, group: str, topic: str) -> None:
        def open_table(name: str, schema: pa.Schema) -> MarkedTable:
            return MarkedTable(lake, name, schema, group=group, topic=topic)

        self.events = open_table("events", EVENTS)
        self.typed = [open_table(name, schema) for name, schema in TYPED_TABLES.values()]
        self.quarantine = open_table("quarantine", QUARANTINE)

    @property
    def all(self) -> list[MarkedTable]:
        return [self.events, *self.typed, self.quarantine]


def run_ingester(config: IngesterConfig, stop: threading.Event, *, on_progress: OnProgress | None = None) -> IngestStats:
    """Ingest until ``stop`` is set (or idle for ``stop_after_idle_s``); commits the batch in hand on stop."""
    flag = AssignmentFlag()
    consumer = open_consumer(
        config.bootstrap_servers, config.topic, group=config.group, partitions=config.partitions, flag=flag,
        session_timeout_ms=config.session_timeout_ms, heartbeat_interval_ms=config.heartbeat_interval_ms,
        bootstrap_timeout_ms=config.bootstrap_timeout_ms,
    )
    try:
        lake = Lake(config.lake)
        tables = _Tables(lake, group=config.group, topic=config.topic)
        dead_letters = _open_dead_letters(config)
    except BaseException:
        consumer.close(autocommit=False)
        raise
    loop = _Loop(config, lake, tables, consumer, dead_letters, flag, on_progress)
    try:
        loop.run(stop)
    finally:
        consumer.close(autocommit=False)
        if dead_letters is not None:
            dead_letters.close()
    log.info("ingester stopped consumed=%d events=%d duplicates=%d quarantined=%d batches=%d commit_retries=%d",
             loop.stats.consumed, loop.stats.events, loop.stats.duplicates, loop.stats.quarantined, loop.stats.batches,
             loop.stats.commit_retries)
    return loop.stats


def ingest_until_idle(config: IngesterConfig, *, idle_s: float = 3.0, on_progress: OnProgress | None = None) -> IngestStats:
    """Ingest everything there is, then stop once nothing arrived for ``idle_s`` seconds."""
    return run_ingester(replace(config, stop_after_idle_s=idle_s), threading.Event(), on_progress=on_progress)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cycle collector while a batch is decoded and written.

    A batch allocates ~10^5 containers (token lists, JSON dicts) that hold no
    cycles and die with the batch; the collector's repeated passes over them
    cost half the decode time (measured on 20k workload events: 54 -> 27 us
    per event). Reference counting still frees everything.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _open_dead_letters(config: IngesterConfig) -> DeadLetters | None:
    if not config.dead_letter_topic:
        return None
    ensure_topic(config.bootstrap_servers, config.dead_letter_topic, partitions=1)
    return DeadLetters(config.bootstrap_servers, config.dead_letter_topic)


class _Loop:
    """poll -> batch -> commit, re-seeking from the Delta log whenever the assignment changes."""

    def __init__(self, config: IngesterConfig, lake: Lake, tables: _Tables, consumer: KafkaConsumer,
                 dead_letters: DeadLetters | None, flag: AssignmentFlag, on_progress: OnProgress | None) -> None:
        self.config, self.lake, self.tables, self.consumer = config, lake, tables, consumer
        self.dead_letters, self.flag, self.on_progress = dead_letters, flag, on_progress
        self.seen = SeenEventIds(max_ids=config.dedupe_max_ids)
        self.batch = Batch()
        self.stats = IngestStats()
        self.last_activity = time.monotonic()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self._idle_too_long():
            if self.flag.take():
                self._resume()
            polled = self.consumer.poll(timeout_ms=POLL_MS, max_records=self.config.batch_max_events)
            if self.flag.take():  # records fetched across a rebalance may belong to the old assignment
                self._resume()
                continue
            for records in polled.values():
                self.batch.add(records)
                self.last_activity = time.monotonic()
            if polled:
                log.debug("polled batch_in_hand=%d batch_bytes=%d", len(self.batch), self.batch.bytes)
            if self._batch_due(caught_up=not polled):
                self._commit_batch()
        self._commit_batch()

    def _idle_too_long(self) -> bool:
        """Nothing arrived for ``stop_after_idle_s``; a group join in progress does not count as idle."""
        idle = self.config.stop_after_idle_s
        if idle is None or self.batch or time.monotonic() - self.last_activity < idle:
            return False
        joining = not self.stats.partitions and self.stats.elapsed_s < 2 * self.config.session_timeout_ms / 1000
        return not joining

    def _batch_due(self, *, caught_up: bool) -> bool:
        """Full (events, bytes), old enough, or the partitions are drained (a poll waited ``POLL_MS`` for nothing):
        then waiting longer only delays the rows, so the batch in hand is committed."""
        c = self.config
        return bool(self.batch) and (
            caught_up or len(self.batch) >= c.batch_max_events or self.batch.bytes >= c.batch_max_bytes
            or self.batch.age_ms() >= c.batch_max_ms
        )

    def _resume(self) -> None:
        """Drop the batch in hand, re-read the markers of the assigned partitions and seek past them."""
        self.batch.clear()
        parts = sorted(tp.partition for tp in self.consumer.assignment() if tp.topic == self.config.topic)
        resume = resume_offsets(self.tables.all, parts)
        seek(self.consumer, self.config.topic, resume)
        ids = self.seen.load(self.lake, topic=self.config.topic, partitions=parts)
        self.stats.assignments += 1
        self.stats.partitions = tuple(parts)
        self.last_activity = time.monotonic()
        log.info("assigned partitions=%s resume=%s dedupe_ids=%d", parts, resume, ids)
        self._report()

    def _commit_batch(self) -> None:
        if not self.batch:
            return
        started = time.perf_counter()
        try:
            with _cyclic_gc_paused():
                decoded = self.batch.decode(self.seen, max_event_bytes=self.config.max_event_bytes,
                                            redactor=self.config.redactor)
                self._write(decoded)
        except OffsetConflict as exc:
            self.stats.conflicts += 1
            log.warning("offset conflict, re-seeking error=%s", exc)
            self.flag.raise_()
            self.batch.clear()
            return
        self.stats.consumed += len(self.batch)
        self.stats.bytes += self.batch.bytes
        self.stats.duplicates += decoded.duplicates
        self.stats.batches += 1
        self.stats.last_commit_s = time.perf_counter() - started
        self.stats.commit_retries = sum(t.retries for t in self.tables.all)
        self.batch.clear()
        report_progress(self.consumer, self.config.topic, decoded.last_offsets)
        self._report()

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.stats)

    def _write(self, decoded: DecodedBatch) -> None:
        last, refresh = decoded.last_offsets, self.config.marker_refresh_offsets
        self._count("events", self.tables.events.commit(decoded.events, last, refresh_offsets=refresh))
        derived = typed_tables(decoded.events)
        for table in self.tables.typed:
            rows = derived.get(table.name, table.schema.empty_table())
            self._count(table.name, table.commit(rows, last, refresh_offsets=refresh))
        rejected = quarantine_table(decoded.rejected)
        fresh = self.tables.quarantine.unwritten(rejected)
        if self.dead_letters is not None and fresh.num_rows:
            positions = set(zip(fresh.column("kafka_partition").to_pylist(), fresh.column("kafka_offset").to_pylist()))
            self.dead_letters.send_all(
                [r for r in decoded.rejected if (r.coordinates.partition, r.coordinates.offset) in positions]
            )
        self._count("quarantine", self.tables.quarantine.commit(rejected, last, refresh_offsets=refresh))

    def _count(self, table: str, written: int) -> None:
        self.stats.rows[table] = self.stats.rows.get(table, 0) + written
        if table == "events":
            self.stats.events += written
        elif table == "quarantine":
            self.stats.quarantined += written
