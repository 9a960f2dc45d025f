"""Compaction: rewrite a table's many small files into few, then vacuum.

The ingester commits one small file per table per batch; reads slow down as
they pile up. Compacting the whole lake ends by folding the typed tables' new
rows into the pre-joined tables the ``llm_calls`` and ``rollouts`` views read
(``store.prejoin.refresh``, after the optimize, so that its marks name the
optimized versions). ``compact`` runs Delta optimize, then a *lite* vacuum,
which deletes only files the log marks removed and older than
``vacuum_retention``.

By default the optimize is *incremental*: it bins only the files of at most
``SMALL_FILE_BYTES`` (what the ingester and ``refresh`` wrote since the last
run, and the one partly filled file the last run left) into files of at most
that size, and leaves bigger files alone, so a run after a short tail costs
about the tail, not the lake (measured on the 1M-call bench lake: README, "SQL
at scale"); the scheduler runs it every few minutes (``TRAJLAKE_COMPACT_CRON``).
``full=True`` (``trajlake compact --full``) rewrites every file, z-ordered on
``task_id``, ``rollout_id`` (the columns every trajectory query filters on;
tables without them are just binned into bigger files): its cost follows the
lake (9.4 min for the 1M-call bench lake's typed tables).

Safe while the ingester writes: optimize only removes files it rewrote, so a
concurrent append does not conflict with it (delta-rs rebases the commit), and
the app transactions (the ingester's exactly-once markers) are table state
that every commit carries forward. A lite vacuum never touches files that no
commit has removed, so a file an ingester has written but not yet committed
survives. Keep ``vacuum_retention`` longer than your longest query or
training read (the Delta default, 7 days) so readers of an older snapshot do
not lose files.

The rewritten files take the ingester's Parquet settings (zstd(1), no
statistics on free text, ``store.commit.writer_properties``) with dictionary
pages for scalar columns only (``COMPACT_WRITER_PROPERTIES``). delta-rs's
default (dictionary pages everywhere) made a 200-rollout workload lake
(events, llm_requests, llm_responses: 8.1M ids) *grow* from 18.7 to 27.0 MB
when compacted, with 2.1 CPU s; with these settings 18.9 MB, 1.4 CPU s:
dictionary indices hide from zstd the repeats it finds in raw token ids. On the SQL
benchmark's generator (4,800 rollouts, 103k calls, 122.6 MB ingested) the
compacted lake is 57.4 MB with these settings, 71.7 MB with delta-rs's
default and 55.3 MB without any dictionary; without them the scalar
questions through the views took a median 1.2x longer (1.02-1.71x, load ~20),
with them 0.90-1.20x delta-rs's default.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from deltalake.exceptions import CommitFailedError

import pyarrow as pa

from schemas.tables import CATALOGUE
from store.commit import FREE_TEXT_COLUMNS, writer_properties
from store.lake import Lake, list_tables
from store.prejoin import SOURCES, refresh

log = logging.getLogger(__name__)

Z_ORDER_COLUMNS = ("task_id", "rollout_id")
DEFAULT_VACUUM_RETENTION = timedelta(days=7)
SMALL_FILE_BYTES = 16 * 1024 * 1024
"""An incremental optimize rewrites files of at most this size, into files of at most this size (delta-rs skips
bigger ones): its rewrite per table is the tail plus at most one partly filled file of an earlier run."""
OPTIMIZE_RETRIES = 5
DICTIONARY_COLUMNS = frozenset(
    f.name for table in CATALOGUE.values() for f in table.schema if not pa.types.is_nested(f.type)) - FREE_TEXT_COLUMNS
"""Scalar columns of the catalogue: dictionary pages in compacted files (see the module doc)."""
COMPACT_WRITER_PROPERTIES = writer_properties(dictionary_columns=DICTIONARY_COLUMNS)


@dataclass(frozen=True)
class Compacted:
    """What compaction did to one table."""

    table: str
    files_removed: int
    files_added: int
    files_vacuumed: int
    z_order: tuple[str, ...]
    version_before: int
    version_after: int


def compact(
    lake: Lake,
    *,
    tables: Iterable[str] | None = None,
    vacuum_retention: timedelta | None = DEFAULT_VACUUM_RETENTION,
    full: bool = False,
) -> list[Compacted]:
    """Compact ``tables`` (default: every table of the lake, then ``store.prejoin.refresh``); ``full``: rewrite
    every file, z-ordered, instead of the small ones only; ``vacuum_retention`` None: no vacuum (``vacuum``).

    >>> compact(Lake("./lake"), tables=["events"])  # doctest: +SKIP
    """
    names = list_tables(lake) if tables is None else list(tables)
    results = [compact_table(lake, name, vacuum_retention=vacuum_retention, full=full) for name in names]
    if tables is None and any(lake.exists(name) for name in SOURCES):
        refresh(lake)
    return results


def compact_table(lake: Lake, name: str, *, vacuum_retention: timedelta | None = DEFAULT_VACUUM_RETENTION,
                  full: bool = False) -> Compacted:
    """Optimize one table (its small files; ``full``: every file, z-ordered where the columns exist), then vacuum
    (unless ``vacuum_retention`` is None)."""
    if vacuum_retention is not None and vacuum_retention < timedelta(0):
        raise ValueError(f"vacuum retention must be >= 0, got {vacuum_retention}")
    before = lake.table(name).version()
    metrics, z_order = _optimize(lake, name, full=full)
    vacuumed = [] if vacuum_retention is None else _vacuum(lake, name, vacuum_retention)
    result = Compacted(
        table=name,
        files_removed=int(metrics.get("numFilesRemoved", 0)),
        files_added=int(metrics.get("numFilesAdded", 0)),
        files_vacuumed=len(vacuumed),
        z_order=z_order,
        version_before=before,
        version_after=lake.table(name).version(),
    )
    log.info("compact.table table=%s removed=%d added=%d vacuumed=%d z_order=%s",
             name, result.files_removed, result.files_added, result.files_vacuumed, ",".join(z_order))
    return result


def vacuum(lake: Lake, *, tables: Iterable[str] | None = None,
           retention: timedelta = DEFAULT_VACUUM_RETENTION) -> dict[str, int]:
    """Lite-vacuum ``tables`` (default: every table of the lake); returns the files deleted per table. Each vacuum
    logs two commits, even one that deletes nothing: the scheduler runs it daily, apart from the frequent
    incremental compaction (``compact(vacuum_retention=None)``)."""
    names = list_tables(lake) if tables is None else list(tables)
    return {name: len(_vacuum(lake, name, retention)) for name in names}


def _vacuum(lake: Lake, name: str, retention: timedelta) -> list[str]:
    if retention < timedelta(0):
        raise ValueError(f"vacuum retention must be >= 0, got {retention}")
    return lake.table(name).vacuum(retention_hours=int(retention.total_seconds() // 3600),
                                   enforce_retention_duration=False, dry_run=False)


def _optimize(lake: Lake, name: str, *, full: bool) -> tuple[dict, tuple[str, ...]]:
    for attempt in range(1, OPTIMIZE_RETRIES + 1):
        table = lake.table(name)
        columns = {f.name for f in table.schema().fields}
        z_order = tuple(c for c in Z_ORDER_COLUMNS if c in columns) if full else ()
        try:
            if z_order:
                metrics = table.optimize.z_order(list(z_order), writer_properties=COMPACT_WRITER_PROPERTIES)
            else:
                metrics = table.optimize.compact(target_size=None if full else SMALL_FILE_BYTES,
                                                 writer_properties=COMPACT_WRITER_PROPERTIES)
            return metrics, z_order
        except CommitFailedError as exc:
            if attempt == OPTIMIZE_RETRIES:
                raise RuntimeError(
                    f"compact: table {name} kept conflicting with other writers ({exc}); run `trajlake compact` again"
                ) from exc
            log.info("compact.retry table=%s attempt=%d reason=%r", name, attempt, str(exc))
    raise AssertionError("unreachable")
