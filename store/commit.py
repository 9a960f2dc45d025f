"""Exactly-once appends: rows and Kafka offsets land in the same Delta commit.

Every commit to a table carries one transaction marker per Kafka partition,
``app_id = "trajlake-ingest:{group}:{topic}:{partition}"`` -> the last offset
that table is complete through (kafka-delta-ingest's design). Invariants:

* A table holds a row for offset ``o`` of partition ``p`` iff ``o <= marker(p)``
  (rows with offsets at or below the marker are skipped on write), and a
  marker never moves back (a replay that ends below it keeps it).
* A reader resumes partition ``p`` at ``min(marker over the tables) + 1``; a
  table whose marker is ahead simply skips the replayed rows.
* Before each commit the table's markers are re-read; if they moved since we
  loaded them, someone else owns the partition now: ``OffsetConflict``.
* A commit that loses to a concurrent delete (deltalake's ``CommitFailedError``:
  nothing landed), or finds log entries gone (``store.forget`` drops the log
  before its delete), is retried on a reloaded table, markers re-checked first.
* A table that gets no rows in a batch is not committed unless its marker
  trails by more than ``refresh_offsets`` (or it has none). The ingester passes
  0: every table's marker moves in every commit cycle, so a restart replays at
  most the one batch whose cycle a crash cut short, however idle a table is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    ColumnProperties, CommitProperties, DeltaTable, PostCommitHookProperties, Schema, Transaction, WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from store.app_transactions import AppTransactions
from store.event_rows import JSON_COLUMNS
from store.lake import Lake
from schemas.errors import Conflict

log = logging.getLogger(__name__)

FREE_TEXT_COLUMNS = frozenset({"payload", "text", "prompt", *JSON_COLUMNS})
"""Long JSON/text columns nobody range-filters: no Parquet min/max statistics for them."""


def writer_properties(*, dictionary_columns: Iterable[str] = ()) -> WriterProperties:
    """The ingested tables' Parquet settings (``WRITER_PROPERTIES``), with dictionary pages for
    ``dictionary_columns`` (top-level columns; compaction's choice, ``store.compact``)."""
    return WriterProperties(
        compression="ZSTD", compression_level=1, default_column_properties=ColumnProperties(dictionary_enabled=False),
        column_properties={**{name: ColumnProperties(dictionary_enabled=True) for name in sorted(dictionary_columns)},
                           **{name: ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
                              for name in sorted(FREE_TEXT_COLUMNS)}},
    )


WRITER_PROPERTIES = writer_properties()
"""Parquet settings of ingested tables. Measured on 20k workload events: zstd(1) without dictionary
pages writes the events table with 0.21 CPU s into 19.7 MB, the default (snappy + dictionary) 0.31 s
into 25.5 MB (token lists are near-random ints: dictionaries cost and do not pay). Statistics of the
free-text columns cost ~20% of the commit CPU (events + typed tables, 6.6k workload events: 28 vs 35 us
per event, same 11.3 MB) and serve no filter; key columns keep theirs (Delta data skipping)."""

COMMIT_ATTEMPTS = 8
"""Tries per commit against concurrent deletes; with the backoff below they span ~4 s."""


@dataclass(frozen=True)
class Cadence:
    """When a ``MarkedTable`` drops its snapshot and opens the table again (``_checkpoint``).

    delta-rs 1.6.6 keeps what each commit adds to a long-lived snapshot (``update_incremental``, and a commit through
    the table): ~55 KB per commit per table more than the same version loaded from a checkpoint (~2.4 KB per live
    file; upstream delta-io/delta-rs#4241). A reopen drops it: it reads the table's latest checkpoint and replays the
    log entries after it, one tokio blocking thread per entry read at once (idle threads go after 10 s)."""

    reopen_after_commits: int | None
    """Reopen after this many commits through the snapshot; None: after the table's checkpoint interval."""
    own_checkpoint: bool
    """Write a checkpoint at the reopen's version first, so that the reopen replays no entry."""


CADENCES = {
    "interval": Cadence(reopen_after_commits=None, own_checkpoint=False),
    "own-checkpoint-20": Cadence(reopen_after_commits=20, own_checkpoint=True),
    "replay-20": Cadence(reopen_after_commits=20, own_checkpoint=False),
}
"""The cadences compared by ``bench/ingest/run.py --soak-cadence`` (bench/ingest/README.md, memory). Each also
reopens right after an interval checkpoint this writer wrote (nothing to replay)."""
CADENCE = CADENCES["interval"]
"""The ingester's cadence: reopen at the table's own checkpoints (every 100 versions), no checkpoint of ours.

Decided by soaks of the cadences side by side at 200 events/s (bench/ingest/README.md, memory; load 7-25): RSS
between batches grew +3.2 MB/min (interval), +3.0 (a checkpoint of ours and a reopen every 20 commits), +3.8 (a
reopen every 20 commits replaying up to 99 entries), medians of three 10-minute runs; over 16 minutes +3.6 vs +3.4.
Our checkpoints were lower in every pair, by 0.17-1.0 MB/min and ~15-30 MB at the peak (the interval's sawtooth,
below), with no thread spikes (~70 vs ~145 while a checkpoint or reopen replays ~100 entries; tokio lets them go
after 10 s idle), for 5-6x the checkpoint bytes: each ~0.8-2 KB per live file (1.6 for ``events``), kept for
``delta.logRetentionDuration`` (30 days). At 200 events/s (~1,300-1,800 commits an hour per table) and 1,000 live
files per table, ~2.5 vs ~0.5 GB a day per table; without ``trajlake compact`` each checkpoint grows by ~1,300
files an hour (in the 16-minute soak: 28 vs 4.6 MB an hour per table). Reopening every 20 commits
without our checkpoint replays the entries since the table's last one: as many threads as the interval's replay, and
no RSS gained. Cleaning up our own checkpoints would fail concurrent readers that listed the log just before (time
travel to a version they cover): not done. The snapshot's ~55 KB per commit makes the interval's RSS a sawtooth of
~40 MB over 100 commits (9 tables, a commit-only loop), bounded."""
DELTA_CHECKPOINT_INTERVAL = 100
"""A checkpoint is written at every version divisible by this (``delta.checkpointInterval``'s default)."""
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
"""Commits leave checkpoints to ``MarkedTable._checkpoint``: delta-rs's post-commit checkpoint replays the log
(every entry since the last checkpoint at once), and the ingester's tables reach a checkpoint version in the
same commit cycle: 9 side by side took the commit loop from 37 to 175 threads, kept by tokio's pool."""
_LOG_REPLAYS = threading.Lock()
"""One log replay (checkpoint or reopen) at a time in this process, whatever number of tables commit at once."""
RETRY_BACKOFF_S = 0.05
"""First wait before a retry; doubles per attempt, capped at 1 s."""

Markers = dict[int, int | None]
"""Partition -> last offset a table is complete through (None: never written)."""


class OffsetConflict(Conflict):
    """A table's markers moved under us: another writer owns the partition now. Re-read and re-seek."""


MARKER_PREFIX = "trajlake-ingest:"


def marker_app_id(group: str, topic: str, partition: int) -> str:
    """The Delta transaction app id of one consumer group's progress on one partition."""
    return f"{MARKER_PREFIX}{group}:{topic}:{partition}"


def rewound_app_id(group: str, topic: str, partition: int) -> str:
    """The app id whose version is when (epoch ms) a partition was last rewound: rows ingested before it came
    from a log that is gone, and their offsets may be taken again by the new log."""
    return f"trajlake-rewound:{group}:{topic}:{partition}"


class CommitContention(Conflict):
    """A commit kept losing to concurrent writers (deletes, compaction) for every attempt."""

    def __init__(self, table: str, attempts: int, cause: Exception) -> None:
        last = str(cause).splitlines()[0]
        super().__init__(
            f"table {table}: {attempts} commit attempts lost to concurrent changes (last: {last}); "
            "nothing of this batch is missing or doubled: restart the ingester (it resumes from the Delta markers), "
            "and pause forget/retention/compaction runs if this repeats"
        )
        self.table = table


class MarkedTable:
    """One lake table, kept open, written only through marker-carrying commits."""

    def __init__(self, lake: Lake, name: str, schema: pa.Schema, *, group: str, topic: str) -> None:
        self.name = name
        self.schema = schema
        self.retries = 0
        """Commits retried after losing to a concurrent change (a delete, a compaction)."""
        self._lake = lake
        self._group, self._topic = group, topic
        if not lake.exists(name):
            _create(lake, name, schema)
        self._table: DeltaTable = lake.table(name)
        _add_missing_columns(self._table, schema)
        self._markers: Markers = {}
        self._commits_since_open = 0
        self._cadence = CADENCE
        self._transactions = AppTransactions(lake, name)

    def _read_markers(self, partitions: Iterable[int]) -> Markers:
        apps = {p: marker_app_id(self._group, self._topic, p) for p in partitions}
        versions = self._transactions.versions(self._table, apps.values())
        return {p: versions[app] for p, app in apps.items()}

    def _refresh(self) -> None:
        """Bring the snapshot up to date; reopen the table when log entries it would read are gone: ``store.forget``
        drops the log entries older than its delete."""
        try:
            self._table.update_incremental()
        except DeltaError as exc:
            if not _log_entry_missing(exc):
                raise
            self._table = self._reopen()

    def _checkpoint_interval(self) -> int:
        configured = self._table.metadata().configuration.get("delta.checkpointInterval")
        return int(configured) if configured else DELTA_CHECKPOINT_INTERVAL

    def _checkpoint(self) -> None:
        """What delta-rs's post-commit hook does, one table at a time: a checkpoint at every interval's version, then
        the log entries past ``delta.logRetentionDuration`` removed (unless the table turns that off). Then the table
        reopened as ``CADENCE`` says (right after an interval checkpoint, or once the snapshot took its commits)."""
        interval = self._checkpoint_interval()
        at_interval = self._table.version() % interval == 0
        budget = self._cadence.reopen_after_commits or interval
        due = self._commits_since_open >= budget
        if at_interval or (due and self._cadence.own_checkpoint):
            with _LOG_REPLAYS:
                self._table.create_checkpoint()
                if at_interval and self._table.metadata().configuration.get(
                        "delta.enableExpiredLogCleanup", "true").lower() != "false":
                    self._table.cleanup_metadata()
        if at_interval or due:
            self._table, self._commits_since_open = self._reopen(), 0

    def _reopen(self) -> DeltaTable:
        """Open the table afresh; retried while a forget swaps the checkpoint it starts from."""
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                with _LOG_REPLAYS:
                    return self._lake.table(self.name)
            except DeltaError as exc:
                if not _log_entry_missing(exc) or attempt == COMMIT_ATTEMPTS:
                    raise
                time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    @property
    def markers(self) -> Markers:
        """The markers loaded (and since committed) for the assigned partitions."""
        return dict(self._markers)

    def load(self, partitions: Iterable[int]) -> Markers:
        """Refresh from the log and remember these partitions' markers as ours."""
        self._refresh()
        self._markers = self._read_markers(partitions)
        return dict(self._markers)

    def unwritten(self, rows: pa.Table) -> pa.Table:
        """The rows this table does not hold yet (offset above its partition's marker)."""
        if rows.num_rows == 0:
            return rows
        part, off = rows.column("kafka_partition"), rows.column("kafka_offset")
        keep = None
        for p in pc.unique(part).to_pylist():
            mine = pc.equal(part, p)
            if (mark := self._markers.get(p)) is not None:
                mine = pc.and_(mine, pc.greater(off, mark))
            keep = mine if keep is None else pc.or_(keep, mine)
        if pc.all(keep).as_py():
            return rows  # the usual case (no replay): spare a copy of every column
        return rows.filter(keep)

    def commit(self, rows: pa.Table, last_offsets: Mapping[int, int], *, refresh_offsets: int) -> int:
        """Append the unwritten ``rows`` with markers ``last_offsets``; returns rows written.

        Skips the commit when nothing is unwritten and no marker is stale. A
        commit that loses to a concurrent delete (``store.forget``, retention)
        lands nothing; it is retried from a reloaded table, markers re-checked,
        up to ``COMMIT_ATTEMPTS`` times with backoff. (Should a commit land and
        still report an error, the re-check finds our own markers moved:
        ``OffsetConflict``, re-seek, and the markers skip the replay.)
        """
        if not last_offsets:
            return 0
        return self._retrying(lambda: self._commit_once(rows, last_offsets, refresh_offsets))

    def rewind(self, partitions: Iterable[int]) -> None:
        """Set these partitions' markers to -1 (nothing read) in one commit, markers re-checked first.

        Only for a log that went backwards (``trajlake ingest --recover``): the offsets the old markers
        counted are gone, and the new log is read again from its earliest offset.
        """
        parts = sorted(partitions)
        if parts:
            self._retrying(lambda: self._rewind_once(parts))

    def _rewind_once(self, partitions: list[int]) -> int:
        self._check_markers(partitions)
        now_ms = int(time.time() * 1000)
        rewound = [Transaction(app_id=rewound_app_id(self._group, self._topic, p), version=now_ms) for p in partitions]
        return self._write_markers(self.schema.empty_table(), {p: -1 for p in partitions}, also=rewound)

    def rewound_at(self, partition: int) -> int | None:
        """When (epoch ms) ``rewind`` last ran for this partition; None: never."""
        return self._table.transaction_version(rewound_app_id(self._group, self._topic, partition))

    def _retrying(self, attempt_once: Callable[[], int]) -> int:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                if attempt > 1:
                    self._table = self._reopen()
                return attempt_once()
            except DeltaError as exc:
                if not _lost_to_a_concurrent_change(exc):
                    raise
                if attempt == COMMIT_ATTEMPTS:
                    raise CommitContention(self.name, attempt, exc) from exc
                self.retries += 1
                log.info("commit.retry table=%s attempt=%d reason=%r", self.name, attempt, str(exc).split("\n")[0])
                time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    def _check_markers(self, partitions: Iterable[int]) -> Markers:
        """Refresh and re-read the markers; ``OffsetConflict`` if they moved since we loaded them."""
        self._refresh()
        fresh = self._read_markers(partitions)
        moved = {p: (self._markers.get(p), m) for p, m in fresh.items() if m != self._markers.get(p)}
        if moved:
            raise OffsetConflict(
                f"table {self.name}: markers moved under us {moved} (partition reassigned?); re-seeking"
            )
        return fresh

    def _write_markers(self, rows: pa.Table, marks: Mapping[int, int], also: Iterable[Transaction] = ()) -> int:
        txns = [Transaction(app_id=marker_app_id(self._group, self._topic, p), version=int(o))
                for p, o in sorted(marks.items())] + list(also)
        write_deltalake(
            self._table, rows.cast(self.schema), mode="append", writer_properties=WRITER_PROPERTIES,
            commit_properties=CommitProperties(app_transactions=txns), post_commithook_properties=NO_HOOKS,
        )
        self._markers.update(marks)
        self._commits_since_open += 1
        try:
            self._checkpoint()
        except (DeltaError, OSError) as exc:  # the commit landed: a failed checkpoint must not fail (and retry) it
            log.warning("event=checkpoint_failed table=%s version=%d error=%r: the commit landed; the next commit "
                        "tries the checkpoint again", self.name, self._table.version(), exc)
        log.debug("commit table=%s rows=%d version=%d", self.name, rows.num_rows, self._table.version())
        return rows.num_rows

    def _commit_once(self, rows: pa.Table, last_offsets: Mapping[int, int], refresh_offsets: int) -> int:
        fresh = self._check_markers(last_offsets)
        rows = self.unwritten(rows)
        if rows.num_rows == 0 and not self._stale(last_offsets, refresh_offsets):
            return 0
        # A replay (resumed at the smallest marker over the tables) covers offsets this table may already hold:
        # its marker never moves back, or a later replay would write those rows again.
        marks = {p: max(o, fresh[p] if fresh[p] is not None else -1) for p, o in last_offsets.items()}
        return self._write_markers(rows, marks)

    def _stale(self, last_offsets: Mapping[int, int], refresh_offsets: int) -> bool:
        marks = [self._markers.get(p) for p in last_offsets]
        return any(m is None or last_offsets[p] - m > refresh_offsets for p, m in zip(last_offsets, marks))


def _backoff(attempt: int) -> float:
    return min(RETRY_BACKOFF_S * 2 ** (attempt - 1), 1.0)


def _lost_to_a_concurrent_change(exc: DeltaError) -> bool:
    """Nothing was committed and a retry on a reloaded table may pass: a conflicting delete, or log gone."""
    return isinstance(exc, CommitFailedError) or _log_entry_missing(exc)


def _log_entry_missing(exc: DeltaError) -> bool:
    return "_delta_log" in str(exc) and "not found" in str(exc).lower()


def _create(lake: Lake, name: str, schema: pa.Schema) -> None:
    """Create an empty table; losing a creation race to another writer is fine."""
    try:
        lake.append(name, schema.empty_table(), schema=schema)
    except Exception:  # noqa: BLE001 - delta-rs reports a lost race with several error types
        if not lake.exists(name):
            raise


def _add_missing_columns(table: DeltaTable, schema: pa.Schema) -> None:
    """A table written before a nullable column joined the catalogue gets it (old rows read NULL), so
    appends of today's rows keep their strict schema check."""
    have = set(table.schema().to_arrow().names)
    missing = [f for f in schema if f.name not in have]
    if missing:
        try:
            table.alter.add_columns(Schema.from_arrow(pa.schema(missing)).fields)
        except DeltaError:  # another ingester added them first
            table.update_incremental()
            if not {f.name for f in missing} <= set(table.schema().to_arrow().names):
                raise
            return
        log.info("table.columns_added table=%s columns=%s", table.table_uri, [f.name for f in missing])


def resume_offsets(tables: Iterable[MarkedTable], partitions: Iterable[int]) -> dict[int, int | None]:
    """Where to resume each partition: min over the tables of marker + 1.

    None means "from the beginning": some table has never seen the partition.
    """
    parts = list(partitions)
    loaded = [t.load(parts) for t in tables]
    resume: dict[int, int | None] = {}
    for p in parts:
        marks = [m[p] for m in loaded]
        resume[p] = None if None in marks else min(m for m in marks if m is not None) + 1
    return resume
