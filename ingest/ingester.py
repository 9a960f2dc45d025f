"""The exactly-once ingester: Kafka -> validate -> dedupe -> Delta, one commit per table per batch.

Per batch, in this order: ``events`` (every valid, first-seen event), the
typed tables derived from those rows, then ``quarantine`` (after its dead
letters are flushed). Each commit carries the batch's last offset per
partition as a Delta transaction marker (``store.commit``), in every table,
idle or not; on start and on every (re)assignment the loop seeks each
partition to the smallest marker + 1. A crash at any point therefore replays
at most one batch, and the markers make the replay write nothing twice.

The log is checked, not trusted (``ingest.log_check``): on assignment the
record at each marker must be one the lake holds, before each commit the last
committed record must be unchanged, and every replayed record must be one the
lake holds; otherwise ``LogWentBackwards`` stops the ingester. ``recover=True``
re-reads such partitions from their earliest offset instead, writing only
events whose (tenant, event_id) the tables do not hold yet.

Every consumed message is counted once: written, duplicate, quarantined, or
replayed (at or below a marker, verified).

>>> stop = threading.Event()  # doctest: +SKIP
>>> stats = run_ingester(IngesterConfig(lake="./lake", bootstrap_servers="127.0.0.1:9092"), stop)
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa
from pydantic import ConfigDict

from ingest.allocators import FreeMemoryTrim
from ingest.batch import Batch, DecodedBatch
from ingest.consumer import FETCH_MAX_WAIT_MS, AssignmentFlag, IngestConsumer, OutOfRange, open_consumer
from ingest.dead_letters import DeadLetters
from ingest.dedupe import DEFAULT_MAX_IDS, SeenEventIds
from ingest.held import LakeRecords, not_held
from ingest.log_check import CheckInFlight, LogGuard, LogProbe, LogUnverifiable, LogWentBackwards
from ingest.redaction import Redactor
from ingest.thread_cpu import KAFKA_THREADS, ThreadsCpu
from ingest.topics import ensure_topic
from schemas.options import CommonOptions
from schemas.tables import EVENTS, EVENTS_TABLE, QUARANTINE, QUARANTINE_TABLE, TYPED_TABLES
from schemas.versions import MAX_EVENT_BYTES
from store.commit import MarkedTable, OffsetConflict, resume_offsets
from store.event_rows import quarantine_table, typed_tables
from store.lake import Lake

log = logging.getLogger(__name__)

POLL_MS = 200
"""Longest wait inside one poll: bounds how late a stop request or batch deadline is seen."""
FIRST_FETCH_WAIT_S = 30.0
"""How long an idle stop (``stop_after_idle_s``) waits for the broker's first fetch answer after positioning."""
IDLE_LOG_CHECK_S = 5.0
"""While nothing arrives, re-read the last committed records this often: a log that restarted behind the
markers is reported within seconds, not when (if ever) it grows past them."""


class IngesterConfig(CommonOptions):
    """Everything one ingester process needs (``trajlake ingest``'s settings are this model plus the environment)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    group: str = "trajlake-ingest"
    """Consumer group; also names the Delta transaction markers, so it is the unit of progress (TRAJLAKE_GROUP)."""
    partitions: tuple[int, ...] | None = None
    """Static assignment without a group (offsets live in Delta anyway); None = join the group."""
    dlq_topic: str | None = None
    """Dead-letter topic (TRAJLAKE_DLQ_TOPIC); None = ``<topic>.dlq``, "" = no dead-letter topic (quarantine only)."""
    batch_max_events: int = 20_000
    batch_max_bytes: int = 64 * 1024 * 1024
    batch_max_ms: int = 2_000
    """Oldest a batch gets while records keep arriving; a drained topic commits the batch in hand at once."""
    max_event_bytes: int = MAX_EVENT_BYTES
    dedupe_max_ids: int = DEFAULT_MAX_IDS
    """Event ids remembered for dedupe (TRAJLAKE_DEDUPE_MAX_IDS): ~36 B each, mapped and resident from the start
    (36 MB at the default 1,000,000); a resend later than this many events is not caught (``ingest.dedupe``)."""
    marker_refresh_offsets: int = 0
    """An idle table's marker is committed once it trails by more than this many offsets; 0 = every commit
    cycle moves every table's markers, so a restart replays at most one batch."""
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 2_000
    bootstrap_timeout_ms: int = 30_000
    """How long to look for a broker at start before ``BrokerUnreachable`` (TRAJLAKE_BOOTSTRAP_TIMEOUT_MS)."""
    stop_after_idle_s: float | None = None
    """Stop once nothing arrived for this long (demos, tests, backfills); None = run until stopped."""
    redactor: Redactor | None = None
    """``ingest.redaction`` rules, applied to every event and to quarantined raw text before they are written."""
    recover: bool = False
    """Re-read partitions whose log went backwards from their earliest offset, deduping against the tables."""

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
    """Valid messages whose (tenant, event_id) has a first copy elsewhere (logged at DEBUG with its position)."""
    quarantined: int = 0
    replayed: int = 0
    """Messages at or below a marker, each verified to be one the lake holds (a replay after a restart)."""
    key_mismatches: int = 0
    """Events stored although their Kafka key is null or not their rollout_id."""
    recovered_partitions: tuple[int, ...] = ()
    """Partitions re-read from their earliest offset by ``recover``."""
    batches: int = 0
    assignments: int = 0
    conflicts: int = 0
    commit_retries: int = 0
    """Commits retried after losing to a concurrent Delta delete (forget, retention) or compaction."""
    partitions: tuple[int, ...] = ()
    last_commit_s: float = 0.0
    """Wall time of the last batch's commit (decode + every table), for the commit latency metric."""
    rows: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds by stage: the loop's thread in ``consume`` (Kafka polls), ``log_check``, ``decode``
    (validation, dedupe, ``events`` rows) and ``typed_rows``; every thread but librdkafka's during ``commit``
    (Delta commits of every table, dead letters); librdkafka's threads over the whole run in ``kafka_threads``
    (fetching, decompressing: they run beside every stage). What is left of the process's CPU is outside these."""
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

        self.events = open_table(EVENTS_TABLE, EVENTS)
        self.typed = [open_table(name, schema) for name, schema in TYPED_TABLES.values()]
        self.quarantine = open_table(QUARANTINE_TABLE, QUARANTINE)

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
    probe: LogProbe | None = None
    dead_letters: DeadLetters | None = None
    try:
        lake = Lake(config.lake)
        tables = _Tables(lake, group=config.group, topic=config.topic)
        probe = LogProbe(config.bootstrap_servers, config.topic)
        dead_letters = _open_dead_letters(config)
        loop = _Loop(config, lake, tables, consumer, dead_letters, flag, on_progress, probe)
        try:
            loop.run(stop)
        finally:
            loop.pool.shutdown()
            loop.check.close()
            loop.stats.cpu_s["kafka_threads"] = loop.kafka_cpu()
    finally:
        consumer.close()
        if probe is not None:
            probe.close()
        if dead_letters is not None:
            dead_letters.close()
    st = loop.stats
    log.info("ingester stopped consumed=%d events=%d duplicates=%d quarantined=%d replayed=%d key_mismatches=%d "
             "batches=%d commit_retries=%d", st.consumed, st.events, st.duplicates, st.quarantined, st.replayed,
             st.key_mismatches, st.batches, st.commit_retries)
    return st


def ingest_until_idle(config: IngesterConfig, *, idle_s: float = 3.0, on_progress: OnProgress | None = None) -> IngestStats:
    """Ingest everything there is, then stop once nothing arrived for ``idle_s`` seconds."""
    return run_ingester(config.model_copy(update={"stop_after_idle_s": idle_s}), threading.Event(),
                        on_progress=on_progress)


@contextmanager
def _cpu(stats: IngestStats, stage: str) -> Iterator[None]:
    """Add this thread's CPU time spent inside the block to ``stats.cpu_s[stage]`` (not the process's: librdkafka
    fetches in its own threads meanwhile, ``ingest.thread_cpu``)."""
    started = time.thread_time()
    try:
        yield
    finally:
        stats.cpu_s[stage] = stats.cpu_s.get(stage, 0.0) + time.thread_time() - started


@contextmanager
def _cpu_but(stats: IngestStats, stage: str, threads: ThreadsCpu) -> Iterator[None]:
    """Add the process's CPU time spent inside the block, less that of ``threads``, to ``stats.cpu_s[stage]``: for
    work other threads do (Delta commits in the pool and delta-rs's runtime) while librdkafka's keep fetching."""
    started, theirs = time.process_time(), threads()
    try:
        yield
    finally:
        spent = time.process_time() - started - (threads() - theirs)
        stats.cpu_s[stage] = stats.cpu_s.get(stage, 0.0) + spent


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

    def __init__(self, config: IngesterConfig, lake: Lake, tables: _Tables, consumer: IngestConsumer,
                 dead_letters: DeadLetters | None, flag: AssignmentFlag, on_progress: OnProgress | None,
                 probe: LogProbe) -> None:
        self.config, self.lake, self.tables, self.consumer = config, lake, tables, consumer
        self.dead_letters, self.flag, self.on_progress = dead_letters, flag, on_progress
        self.seen = SeenEventIds(max_ids=config.dedupe_max_ids)
        self.records = LakeRecords(lake, topic=config.topic, seen=self.seen, max_event_bytes=config.max_event_bytes)
        self.guard = LogGuard(probe, topic=config.topic, group=config.group, lake_has=self.records.has_at)
        self.batch = Batch()
        self.stats = IngestStats()
        self.last_activity = self.last_log_check = self.positioned = time.monotonic()
        self.check = CheckInFlight(self.guard)
        self.resuming = False
        """The assignment changed: no records are taken until its markers are checked and sought."""
        self.checked: list[int] | None = None
        """The partitions of the marker check in flight; None: none, or one of an assignment that changed since
        (its result is dropped)."""
        self.retry_at = 0.0
        self.pool = ThreadPoolExecutor(max_workers=len(tables.all), thread_name_prefix="commit")
        self.trim_free_memory = FreeMemoryTrim()
        self.kafka_cpu = ThreadsCpu(KAFKA_THREADS)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self._idle_too_long():
            if self.flag.take():
                self._reassigned()
            if self.resuming:
                self._resume_step()
                continue
            try:
                with _cpu(self.stats, "consume"):
                    polled = self.consumer.poll(timeout_ms=POLL_MS,
                                                max_records=max(1, self.config.batch_max_events - len(self.batch)))
            except OutOfRange as exc:
                self._out_of_range(exc)
                continue
            if self.flag.take():  # records fetched across a rebalance may belong to the old assignment
                self._reassigned()
                continue
            if polled:
                self.batch.add(polled)
                self.last_activity = time.monotonic()
            if polled:
                log.debug("polled batch_in_hand=%d batch_bytes=%d", len(self.batch), self.batch.bytes)
            if self._batch_due(caught_up=not polled and self.consumer.heard_from_broker()):
                self._commit_batch()
            elif not polled and not self.batch:
                self._idle_log_check()
        if not self.resuming:
            self._commit_batch()
        self._report()  # the last report is the final count, whatever path the last batch took

    def _reassigned(self) -> None:
        """The assignment changed, or the log must be checked again: drop the batch in hand, and take no records
        until the markers of the partitions now assigned are checked (``_resume_step``). A check in flight is
        of the old assignment: it is cut short and its result dropped."""
        self.batch.clear()
        self.resuming = True
        self.checked = None
        self.retry_at = 0.0
        self.check.interrupt()

    def _resume_step(self) -> None:
        """One step of a (re)assignment, the consumer polled in between so that it stays in its group: start the
        marker check (``_check_markers``), or wait for it, or act on its result (``_resume``)."""
        if self.check.running or time.monotonic() < self.retry_at:
            self._serve_group()
            return
        checked, self.checked = self.checked, None
        try:
            done = self.check.result()
        except LogUnverifiable as exc:
            if checked is not None:
                log.warning("cannot check the log against the lake yet, retrying: %s", exc)
                self.retry_at = time.monotonic() + 1.0
            return
        if checked is None or done is None:  # none started yet, or the assignment changed while it ran
            self._check_markers()
            return
        self._resume(checked, *done)

    def _serve_group(self) -> None:
        """Poll while the partitions wait for their marker check, so the consumer answers rebalances (a member
        that does not hold up the others' joins). What comes back is dropped: the partitions are sought to their
        markers once the check is over."""
        try:
            polled = self.consumer.poll(timeout_ms=POLL_MS, max_records=self.config.batch_max_events)
        except OutOfRange:  # of a position the seek replaces
            return
        if polled:
            log.debug("dropped %d records fetched while the markers are checked", len(polled))

    def _idle_log_check(self) -> None:
        if time.monotonic() - self.last_log_check < IDLE_LOG_CHECK_S:
            return
        self.last_log_check = time.monotonic()
        try:
            problems = self.guard.recheck(sorted(self.stats.partitions))
        except LogUnverifiable as exc:
            log.debug("idle log check skipped: %s", exc)
            return
        if problems:
            raise LogWentBackwards(self.config.topic, self.config.group, problems)

    def _idle_too_long(self) -> bool:
        """Nothing arrived for ``stop_after_idle_s``; a group join or a marker check in progress does not count
        as idle."""
        idle = self.config.stop_after_idle_s
        if idle is None or self.batch or self.checked is not None or time.monotonic() - self.last_activity < idle:
            return False
        joining = not self.stats.partitions and self.stats.elapsed_s < 2 * self.config.session_timeout_ms / 1000
        unanswered = time.monotonic() - self.positioned < FIRST_FETCH_WAIT_S and not self.consumer.heard_from_broker()
        return not (joining or unanswered)

    def _batch_due(self, *, caught_up: bool) -> bool:
        """Full (events, bytes), old enough, or the partitions are drained (a poll waited ``POLL_MS`` for nothing,
        after the broker answered a fetch for each of them): then waiting longer only delays the rows, so the
        batch in hand is committed."""
        c = self.config
        return bool(self.batch) and (
            caught_up or len(self.batch) >= c.batch_max_events or self.batch.bytes >= c.batch_max_bytes
            or self.batch.age_ms() >= c.batch_max_ms
        )

    def _out_of_range(self, exc: OutOfRange) -> None:
        """The broker says a position is outside its log: check the log against what was read.

        A log that went backwards stops the ingester (``LogWentBackwards``). One that still holds every
        record read is a broker whose end offsets are wrong (tansu after a restart): the batch in hand and
        the positions stay, and the fetch is retried after a pause.
        """
        try:
            problems = self.guard.recheck(sorted(self.stats.partitions))
        except LogUnverifiable as unverifiable:
            log.warning("fetch out of range and the log cannot be checked yet: %s", unverifiable)
            problems = {}
        if problems:
            raise LogWentBackwards(self.config.topic, self.config.group, problems) from exc
        log.info("fetch out of range but the log holds every record read; retrying error=%s", exc)
        time.sleep(POLL_MS / 1000)
        self.consumer.refetch(exc.partitions)

    def _check_markers(self) -> None:
        """Start the check of the assigned partitions on the check's thread (``CheckInFlight``): their markers and
        what the lake holds at them are read there too, as the loop keeps polling. Those reads alone (every table's
        log, the dedupe ids, quarantine) took 14-48 s per assignment on a loaded object store (soak), and a member
        that does not poll that long holds up every rebalance of its group."""
        parts = self.consumer.partitions()
        self.check.start(lambda: self._read_and_check(parts))
        self.checked = parts

    def _read_and_check(self, parts: list[int]) -> tuple[dict[int, int | None], int, dict[int, str]]:
        """On the check's thread: (resume offsets, dedupe ids loaded, problems of the log at the markers)."""
        resume = resume_offsets(self.tables.all, parts)
        ids = self.seen.load(self.lake, topic=self.config.topic, partitions=parts)
        self.records.load({p: o or 0 for p, o in resume.items()},
                          rewound_ms={p: self.tables.events.rewound_at(p) for p in parts})
        return resume, ids, self.guard.check_markers(self._furthest_markers(parts))

    def _resume(self, parts: list[int], resume: dict[int, int | None], ids: int, problems: dict[int, str]) -> None:
        """The marker check is over: stop on a log that went backwards (or rewind, ``recover``), else seek."""
        self.resuming = False
        if problems and not self.config.recover:
            raise LogWentBackwards(self.config.topic, self.config.group, problems)
        if problems:
            self._rewind(sorted(problems), problems)
            resume.update({p: None for p in problems})
        self.consumer.seek(resume)
        self.stats.assignments += 1
        self.stats.partitions = tuple(parts)
        # the consumer may have a fetch in flight from before the seek (librdkafka's own, or a poll during the check),
        # which the broker holds up to its fetch wait: silence that short after positioning says nothing about the
        # topic being drained
        self.last_activity = self.positioned = time.monotonic() + FETCH_MAX_WAIT_MS / 1000
        log.info("assigned partitions=%s resume=%s dedupe_ids=%d", parts, resume, ids)
        self._report()

    def _furthest_markers(self, partitions: list[int]) -> dict[int, int | None]:
        """Per partition, the furthest offset any table says it has read through."""
        marks = [t.markers for t in self.tables.all]
        return {p: max((m[p] for m in marks if m.get(p) is not None), default=None) for p in partitions}

    def _rewind(self, partitions: list[int], problems: dict[int, str]) -> None:
        """``recover``: markers of these partitions back to -1 in every table, the log re-read from its start."""
        for p in partitions:
            log.warning("recovering partition=%d from its earliest offset: %s", p, problems[p])
            self.guard.forget(p)
        for table in self.tables.all:
            table.rewind(partitions)
        # the re-read log's offsets start below the compaction marks of the same partitions, which would keep its
        # rows out of the pre-joined views' tail: those marks go back to -1
        from store.prejoin import rewind  # DuckDB, which no other part of the ingester loads

        rewind(self.lake, self.config.topic, partitions)
        self.stats.recovered_partitions = tuple(sorted({*self.stats.recovered_partitions, *partitions}))

    def _commit_batch(self) -> None:
        if not self.batch:
            return
        started = time.perf_counter()
        last_records = self.batch.last_records()
        try:
            with _cpu(self.stats, "log_check"):
                problems = self.guard.recheck(sorted(last_records))
        except LogUnverifiable as exc:
            log.warning("batch of %d not committed, read again once the log can be checked: %s", len(self.batch), exc)
            self.flag.raise_()  # the next step drops it and checks the markers while the consumer keeps polling
            return
        self.last_log_check = time.monotonic()
        if problems:
            raise LogWentBackwards(self.config.topic, self.config.group, problems)
        try:
            with _cyclic_gc_paused():
                with _cpu(self.stats, "decode"):
                    decoded = self.batch.decode(self.seen, max_event_bytes=self.config.max_event_bytes,
                                                redactor=self.config.redactor,
                                                replayed_through=self.tables.events.markers)
                self._check_replay(decoded)
                self._write(decoded)
        except OffsetConflict as exc:
            self.stats.conflicts += 1
            log.warning("offset conflict, re-seeking error=%s", exc)
            self.flag.raise_()
            self.batch.clear()
            self._report()  # tables committed before the conflict were counted
            return
        for p, record in last_records.items():
            self.guard.remember(p, record.offset, record.value)
        self.stats.consumed += len(self.batch)
        self.stats.bytes += self.batch.bytes
        self.stats.key_mismatches += decoded.key_mismatches
        self.stats.batches += 1
        self.stats.last_commit_s = time.perf_counter() - started
        self.stats.commit_retries = sum(t.retries for t in self.tables.all)
        self.batch.clear()
        last_offsets = decoded.last_offsets
        del decoded  # the batch's rows and tables are freed before the trim, so that it hands their pages back too
        self.trim_free_memory()
        self.last_activity = time.monotonic()  # a long commit is not idleness
        self.consumer.report_progress(last_offsets)
        self._report()

    def _check_replay(self, decoded: DecodedBatch) -> None:
        """Replayed events the dedupe memory does not know must be in the lake (or forgotten on purpose)."""
        if not decoded.unheld:
            return
        stored = self.records.stored_keys((u.tenant, u.event_id) for u in decoded.unheld)
        missing = [u for u in decoded.unheld
                   if (u.tenant, u.event_id) not in stored and not self.records.forgotten(u.tenant, u.rollout_id)]
        self.stats.replayed += len(decoded.unheld) - len(missing)
        if missing:
            problems = {u.partition: f"marker {self.tables.events.markers.get(u.partition)}, but the record at offset "
                        f"{u.offset} (event {u.event_id}) is not in the lake" for u in missing}
            raise LogWentBackwards(self.config.topic, self.config.group, problems)

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.stats)

    def _write(self, decoded: DecodedBatch) -> None:
        last, refresh = decoded.last_offsets, self.config.marker_refresh_offsets
        rejected = quarantine_table(decoded.rejected)
        fresh = self.tables.quarantine.unwritten(rejected)
        self._check_quarantine_replay(rejected, fresh)
        events = self._fresh(decoded.events, EVENTS_TABLE)
        with _cpu_but(self.stats, "commit", self.kafka_cpu):
            events_commit = self.pool.submit(self.tables.events.commit, events, last, refresh_offsets=refresh)
            derived, typed_cpu = self._typed_rows_during(events_commit, decoded.events)
            written = events_commit.result()
        self.stats.cpu_s["commit"] -= typed_cpu
        self.stats.cpu_s["typed_rows"] = self.stats.cpu_s.get("typed_rows", 0.0) + typed_cpu
        self.stats.duplicates += decoded.duplicates + decoded.events.num_rows - events.num_rows
        self.stats.replayed += events.num_rows - written
        self._count(EVENTS_TABLE, written)
        if self.dead_letters is not None and fresh.num_rows:
            positions = set(zip(fresh.column("kafka_partition").to_pylist(), fresh.column("kafka_offset").to_pylist()))
            self.dead_letters.send_all(
                [r for r in decoded.rejected if (r.coordinates.partition, r.coordinates.offset) in positions]
            )
        work = [(t, self._fresh(derived.get(t.name, t.schema.empty_table()), t.name)) for t in self.tables.typed]
        work.append((self.tables.quarantine, rejected))
        with _cpu_but(self.stats, "commit", self.kafka_cpu):
            written_per_table = self._commit_side_by_side(work, last)
        for (table, _), n in zip(work, written_per_table):
            self._count(table.name, n)
        self.stats.replayed += rejected.num_rows - written_per_table[-1]  # quarantine is last

    def _typed_rows_during(self, events_commit: Future[int], events: pa.Table) -> tuple[dict[str, pa.Table], float]:
        """The typed tables' rows, derived while the ``events`` commit runs (delta-rs writes without the GIL);
        with the CPU seconds this thread spent on them. The commit is waited for, whatever happens here.

        The commits keep their order (``events``, then the typed tables): only the derivation overlaps.
        """
        started = time.thread_time()
        try:
            return typed_tables(events), time.thread_time() - started
        finally:
            wait([events_commit])

    def _commit_side_by_side(self, work: list[tuple[MarkedTable, pa.Table]], last: dict[int, int]) -> list[int]:
        """Commit tables that do not depend on each other at once (delta-rs writes without the GIL).

        The typed tables and quarantine are 8 commits per cycle, each a few round trips on an object store
        (about 1 s each on a local moto server): one after another they would set the batch latency.
        Every commit finishes before the first failure (an ``OffsetConflict``) is raised.
        """
        refresh = self.config.marker_refresh_offsets
        futures = [self.pool.submit(table.commit, rows, last, refresh_offsets=refresh) for table, rows in work]
        wait(futures)
        return [f.result() for f in futures]

    def _fresh(self, rows: pa.Table, table: str) -> pa.Table:
        """``recover``: only the rows whose (tenant, event_id) the table does not hold, read from the table."""
        if not self.config.recover or rows.num_rows == 0:
            return rows
        keys = zip(rows.column("tenant").to_pylist(), rows.column("event_id").to_pylist())
        return not_held(rows, self.records.stored_keys(keys, table))

    def _check_quarantine_replay(self, rejected: pa.Table, fresh: pa.Table) -> None:
        """Rejected messages at or below the quarantine marker must be quarantined at that very offset."""
        if fresh.num_rows == rejected.num_rows:
            return
        positions = zip(rejected.column("kafka_partition").to_pylist(), rejected.column("kafka_offset").to_pylist())
        fresh_at = set(zip(fresh.column("kafka_partition").to_pylist(), fresh.column("kafka_offset").to_pylist()))
        missing = {p: o for p, o in positions if (p, o) not in fresh_at and not self.records.quarantined(p, o)}
        if missing:
            problems = {p: f"marker {self.tables.quarantine.markers.get(p)}, but the invalid record at offset {o} "
                        "is not in the quarantine table" for p, o in missing.items()}
            raise LogWentBackwards(self.config.topic, self.config.group, problems)

    def _count(self, table: str, written: int) -> None:
        self.stats.rows[table] = self.stats.rows.get(table, 0) + written
        if table == EVENTS_TABLE:
            self.stats.events += written
        elif table == QUARANTINE_TABLE:
            self.stats.quarantined += written
