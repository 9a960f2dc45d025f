"""Pre-joined tables: ``llm_calls``, ``tool_steps`` and ``rollouts`` computed once by ``trajlake compact``, read
by the views.

Writing (``refresh``, run by ``store.compact.compact`` after it optimizes): ``compacted_llm_calls``,
``compacted_tool_steps`` and ``compacted_rollouts`` hold what views.sql's views of those names compute, and
``compaction_marks`` what they cover: per typed table its Delta version and, per Kafka partition, the highest
offset folded in. Rows of a partition reach the lake in offset order (the ingester commits them so, its offsets
as Delta markers), so the rows past the marks are exactly the ones not folded in: the *tail*. Everything is
keyed by rollout: a rollout the tail touches (any row of it in any typed table) is recomputed whole from the
typed tables by views.sql's own statements, run in schema ``_fresh`` over typed tables filtered to those
rollouts (the filter sits below every join and aggregate). The first run (or the first after ``reset``) empties
the marks, then writes the tables in buckets of rollout-id ranges of ~``BUCKET_CALLS`` calls, so memory stays at
one bucket (measured on the 1M-call bench lake, 6 buckets, load 12-20 on 2 cores: 9.2 min wall, 105 CPU s,
2.4 GB peak RSS for the three tables; ``hash(rollout_id)`` buckets: 17 min, 169 CPU s; one unbucketed pass over
two of them took 17 min and 15 GB); later runs find the touched rollouts in the tail's files and replace their
rows in one commit per table (``overwrite`` with a predicate of id ranges and a ``rollout_id IN`` list), which
rewrites only the files that hold them (measured on that lake: README, "SQL at scale"). The marks are written
last: a run that stops before them leaves tables newer than the marks, and readers then recompute more rollouts,
with the same rows. ``reset`` (``store.rebuild`` calls it) empties the marks; ``rewind`` (``ingest --recover``) sets
the re-read partitions' offsets to -1, and marks never pass the ingester's exactly-once markers (a recreated topic's
offsets start again below the old log's); forget (and retention through it) fences, then deletes from the tables
like from every table with ``tenant`` and ``rollout_id``. A refresh commits everything on top of the versions it
pinned before reading, so any of these (or another refresh) landing meanwhile makes it start again.

Reading (``prejoined_views``, called by ``store.sql.connect``): the marks are read first, then the typed and
pre-joined tables are attached (pinned), so the tables are never older than the marks. When no typed table a view
reads has a log entry past its marked version (one file stat per table), the view is the table alone. Otherwise the
tail's rollout ids are read from the rows past the marked offsets in the data files the later commits added (where a
later commit rewrote one, in the files it wrote instead; by the marked offsets over the whole tables where log
entries are gone; ``refresh`` reads them the same way) and the view is the table
without those rollouts plus ``_fresh``'s view of them. Their rows are read through a condition DuckDB
checks inside the Parquet scan (``_touched_filter``: id ranges, then list membership): row groups outside the
ranges are skipped, and the other columns, token lists included, are decoded only where those rows are. A
connection that answers many questions (the default: the query API, the workbench, the benchmark) computes the
tail's views once, into tables of the connection (up to ``MAX_MATERIALIZED`` rollouts; past it, views read at each
query); one that answers one question (``store.sql.run_query``: ``trajlake sql``) leaves them views, so that the
question reads only the typed columns it needs, once (``keep=False``; measured in README, "SQL at scale"), unless the
rows can be kept on disk (``store.tail_cache``: a local lake whose typed tables did not move while the connection
pinned them): the first such question of a tail recomputes them whole into files under the lake, the next ones
attach those instead of finding the tail's rows in the typed tables (no index: the ``rollout_id`` column of every
compacted typed file).
Measured on the 1M-call bench lake with a 207-rollout tail (100 of its rows resent responses of old rollouts), load
16-18: connect 4.9 s, then 0.04-0.4 s a scalar question. An ``IN`` filter (a subquery, or a long literal list, which
DuckDB turns into a join) is checked after the scan, which then decodes whole files: 2-7 s a question read per
query, 21 s at connect read once. What is left is the compacted typed tables' layout (one row group per ~100 MB
file): an old rollout costs the id column of every file whose statistics hold it; 16k-row row groups read two such
files 6.6x faster (0.84 s against 5.59 s).
A tail past ``MAX_TOUCHED`` rollouts, or a lake never compacted, keeps views.sql's views. Any superset of the
touched rollouts gives the same rows, so ids are matched without their tenant. A reader that read the marks just
before a whole rewrite emptied them could attach a half-written table: so the marks are read again after the
tables are attached, and a reader that finds them changed keeps views.sql's views for that connection.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from urllib.parse import unquote

import duckdb

from schemas.errors import Conflict
from schemas.table_names import (  # the names alone: a one-shot query over kept rows loads no Arrow (0.1-0.3 s)
    COMPACTED_LLM_CALLS_TABLE,
    COMPACTED_ROLLOUTS_TABLE,
    COMPACTED_TOOL_STEPS_TABLE,
    COMPACTION_MARKS_TABLE,
    LLM_CALLS_VIEW,
    LLM_REQUESTS_TABLE,
    LLM_RESPONSES_TABLE,
    REWARDS_TABLE,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
    ROLLOUTS_VIEW,
    TOOL_CALLS_TABLE,
    TOOL_RESULTS_TABLE,
    TOOL_STEPS_VIEW,
)
from store import tail_cache
from store.lake import Lake

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

SOURCES: tuple[str, ...] = (ROLLOUT_STARTS_TABLE, ROLLOUT_ENDS_TABLE, LLM_REQUESTS_TABLE, LLM_RESPONSES_TABLE,
                             TOOL_CALLS_TABLE, TOOL_RESULTS_TABLE, REWARDS_TABLE)
"""The typed tables the pre-joined tables are computed from (``schemas.tables.TYPED_TABLES``' tables, in its order)."""
PREJOINED: dict[str, tuple[str, tuple[str, ...]]] = {
    LLM_CALLS_VIEW: (COMPACTED_LLM_CALLS_TABLE, (LLM_REQUESTS_TABLE, LLM_RESPONSES_TABLE)),
    TOOL_STEPS_VIEW: (COMPACTED_TOOL_STEPS_TABLE, (TOOL_CALLS_TABLE, TOOL_RESULTS_TABLE)),
    ROLLOUTS_VIEW: (COMPACTED_ROLLOUTS_TABLE, SOURCES),
}
"""View -> (the table that stores it, the typed tables it reads); its schema: ``_schema``."""
PREJOINED_TABLES: tuple[str, ...] = tuple(table for table, _ in PREJOINED.values())
RECOMPUTED_VIEWS = (LLM_CALLS_VIEW, TOOL_STEPS_VIEW, ROLLOUTS_VIEW)
"""views.sql's statements run in schema ``_fresh`` (``rollouts`` reads the other two)."""
FRESH = "_fresh"
TOUCHED = "_touched"
MAX_TOUCHED = 5_000
"""Most tail rollouts a reader recomputes (per query); past it the views read the typed tables."""
MAX_MATERIALIZED = 1_500
"""Most tail rollouts whose typed rows a connection copies into memory once (token lists included: a long-context
rollout holds millions of ids); past it they are filtered views, read again by each query. Above the tail the
scheduler's 5-minute compaction leaves at 200 events/s (~720 rollouts): on the 1M-call bench lake with that tail
(and 100 late rows of old rollouts), read per query, ``count(*)`` of ``llm_calls`` took 2.3 s (load 11)."""
REFRESH_ATTEMPTS = 3
"""Runs of a refresh whose rewrite lost to a concurrent change of the pre-joined tables (a forget, another refresh)."""
PREJOINED_FILE_BYTES = 64 * 1024 * 1024
"""Largest file a write of the pre-joined tables makes (delta-rs's default: 100 MiB): a ``refresh`` that touches an
old rollout rewrites the file that holds it; above ``store.compact.SMALL_FILE_BYTES``, so that the incremental
optimize leaves full files alone."""
BUCKET_CALLS = 200_000
"""LLM calls per bucket of a whole write (one bucket's rows, token lists included, are in memory at once)."""
_ORDER = {LLM_CALLS_VIEW: "tenant, rollout_id, seq, call_id", TOOL_STEPS_VIEW: "tenant, rollout_id, seq, call_id",
          ROLLOUTS_VIEW: "tenant, rollout_id"}
"""Rows sorted by rollout inside each file: a query for one rollout skips the other row groups by statistics."""

Offsets = Mapping[tuple[str, int], int]
"""(Kafka topic, partition) -> highest offset folded in."""


@dataclass(frozen=True)
class Marks:
    """What the compacted tables cover."""

    versions: Mapping[str, int]
    """Typed table -> its Delta version when compacted (-1: not written then)."""
    offsets: Mapping[str, Offsets]
    written_at: int | None = None
    """When the refresh that wrote them ran (epoch microseconds): a whole rewrite of an unchanged lake writes the
    same marks again, and a reader that compares marks before and after attaching the tables must tell them apart."""


@dataclass(frozen=True)
class Prejoined:
    """What one ``refresh`` wrote."""

    incremental: bool
    """False when the tables were written whole (first run, or first after ``reset``)."""
    rollouts: int
    """Rollouts written (whole) or recomputed (incremental)."""
    calls: int
    """Rows of ``compacted_llm_calls`` written."""
    buckets: int
    """Buckets of a whole write (0 when incremental)."""


# ---- reading: the views over the compacted tables ----


def prejoined_views(con: duckdb.DuckDBPyConnection, lake: Lake, statements: Mapping[str, str],
                    views: Collection[str], marks: Marks | None, *, keep: bool = True,
                    heads: tail_cache.Heads | None = None) -> dict[str, str]:
    """``CREATE VIEW`` statements that read the compacted tables, for the views among ``views`` that can
    (``statements``: views.sql's, by view name; ``views``: the connection's view names, typed tables included;
    ``marks``: ``read_marks`` before the connection pinned the typed tables, which are then never older than them).
    ``keep``: the connection answers more than one question: the tail's views are computed once, at connect
    (``_materialize_fresh``); False: each question recomputes the tail's rollouts over the columns it reads, unless
    ``heads`` (``tail_heads``, read before the typed tables were pinned) still holds: then the first such connection
    keeps the recomputed rows on disk and the next ones read them (``store.tail_cache``).

    Empty when the lake was never compacted, was reset, or its tail is too long: views.sql's views then stand.
    """
    wanted = _wanted(lake, views)
    if marks is None or not wanted:
        return {}
    for name in wanted:
        table = PREJOINED[name][0]
        con.execute(f"ATTACH '{_quote(lake.uri(table))}' AS \"_{table}\" (TYPE delta, PIN_SNAPSHOT, READ_ONLY)")
    if read_marks(con, lake) != marks:  # a refresh since the marks were read: tables half written, or typed tables
        # pinned before the marks moved (a rollout the tail touched since would be recomputed from older rows)
        for name in wanted:
            con.execute(f'DETACH "_{PREJOINED[name][0]}"')
        log.info("prejoin.marks_changed: views read the typed tables")
        return {}
    sources = [s for s in SOURCES if any(s in PREJOINED[name][1] for name in wanted)]
    moved = [s for s in sources if _moved(lake, s, marks.versions.get(s, -1))]
    cache_key = None  # a one-shot connection pinned at the versions walked: the tail's rows kept on disk
    if moved and not keep and heads is not None and tail_cache.unchanged(lake, heads):
        cache_key = tail_cache.key(heads, marks, statements)
    touched = tail_cache.attach(con, lake, cache_key, wanted) if cache_key else None
    cached = touched is not None
    if not cached:
        touched = tail_rollouts(con, lake, marks, moved, limit=MAX_TOUCHED,
                                until=heads.versions if cache_key else None) if moved else []
    if touched is None:
        log.info("prejoin.tail_too_long limit=%d: views read the typed tables", MAX_TOUCHED)
        return {}
    fresh = {name: f'{FRESH}."{name}"' for name in wanted}
    if touched:
        _touched_table(con, touched)  # the compacted rows of the touched rollouts are left out by a hash lookup
        if not cached and cache_key and len(touched) <= MAX_MATERIALIZED and heads.keepable(time.time()) \
                and tail_cache.writable(lake) and _compacted_tokens(con, wanted) <= tail_cache.MAX_KEPT_TOKENS:
            cached = _write_cache(con, lake, statements, touched, wanted, cache_key, heads)
        if cached:
            _fresh_from_cache(con, wanted)
        else:
            materialize = keep and len(touched) <= MAX_MATERIALIZED
            define_fresh(con, statements, _touched_filter(touched), wanted=wanted, materialize=materialize)
            if materialize:
                fresh = _materialize_fresh(con, wanted)
    result = {}
    for name in wanted:
        compacted = f'SELECT * FROM "_{PREJOINED[name][0]}"'
        if touched:
            compacted += (f' WHERE rollout_id NOT IN (SELECT rollout_id FROM {TOUCHED}) '
                          f'UNION ALL SELECT * FROM {fresh[name]}')
        result[name] = f'CREATE VIEW "{name}" AS {compacted}'
    log.debug("prejoin.views views=%s moved=%s touched=%d", ",".join(wanted), ",".join(moved), len(touched))
    return result


def tail_heads(lake: Lake, marks: Marks | None, views: Collection[str]) -> tail_cache.Heads | None:
    """The newest versions of the typed tables that the pre-joined views among ``views`` read, walked from the marks
    (``store.tail_cache.heads``): read before a one-shot connection pins those tables, so that the tail's rows it
    recomputes can be kept on disk for the next one (``prejoined_views``' ``heads``)."""
    wanted = _wanted(lake, views) if marks is not None else []
    sources = [s for s in SOURCES if any(s in PREJOINED[name][1] for name in wanted)]
    return tail_cache.heads(lake, marks.versions, sources) if sources else None


def _wanted(lake: Lake, views: Collection[str]) -> list[str]:
    """The pre-joined views among ``views`` whose typed tables are there too and whose table exists."""
    wanted = [name for name in PREJOINED if name in views and set(PREJOINED[name][1]) <= set(views)]
    return [name for name in wanted if _is_table(lake, PREJOINED[name][0])]  # a lake compacted before one existed


def _compacted_tokens(con: duckdb.DuckDBPyConnection, wanted: Collection[str]) -> int:
    """Prompt and response tokens the touched rollouts (``_touched``) held when compacted, from the attached compacted
    table's counts (``rollouts``: a row per rollout; else ``llm_calls``: a row per call); 0 when neither is wanted
    (tool steps hold no token lists); over ``MAX_KEPT_TOKENS`` when they cannot be read."""
    for name in (ROLLOUTS_VIEW, LLM_CALLS_VIEW):
        if name in wanted:
            try:
                return con.execute(
                    f'SELECT coalesce(sum(coalesce(n_prompt_tokens, 0) + coalesce(n_response_tokens, 0)), 0) '
                    f'FROM "_{PREJOINED[name][0]}" WHERE rollout_id IN (SELECT rollout_id FROM {TOUCHED})'
                ).fetchone()[0]
            except duckdb.Error as exc:  # a compacted file unreadable: the statement reports it as a query error
                log.info("prejoin.tail_not_kept error=%r", str(exc).splitlines()[0])
                return tail_cache.MAX_KEPT_TOKENS + 1
    return 0


def _write_cache(con: duckdb.DuckDBPyConnection, lake: Lake, statements: Mapping[str, str], touched: list[str],
                 wanted: Collection[str], cache_key: str, heads: tail_cache.Heads) -> bool:
    """Recompute the touched rollouts' rows of the ``wanted`` views (their typed rows read once, every column) and
    keep them on disk under ``cache_key``, then attach them; False when they could not be written (the caller then
    recomputes them in the statement). Drops what the recompute defined in schema ``_fresh``. A typed table that
    moved meanwhile (a forget's delete: its rows must not stay on disk) makes the key stale: its files are removed
    (a forget that commits after this check removes them itself)."""
    try:
        define_fresh(con, statements, _touched_filter(touched), wanted=wanted, materialize=True)
        written = tail_cache.write(con, lake, cache_key, {name: f'SELECT * FROM {FRESH}."{name}"' for name in wanted},
                                   f"SELECT rollout_id FROM {TOUCHED}")
    except duckdb.Error as exc:  # out of memory reading the tail's rows: the statement recomputes them, streaming
        log.info("prejoin.tail_not_kept error=%r", str(exc).splitlines()[0])
        written = False
    _drop_fresh(con, kept=())
    if written and not tail_cache.unchanged(lake, heads):
        tail_cache.discard(lake, cache_key)
        written = False
    return written and tail_cache.attach(con, lake, cache_key, wanted) is not None


def _fresh_from_cache(con: duckdb.DuckDBPyConnection, wanted: Collection[str]) -> None:
    """Schema ``_fresh``'s ``wanted`` views over the rows ``tail_cache.attach`` attached."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {FRESH}")
    for name in wanted:
        con.execute(f'CREATE OR REPLACE VIEW {FRESH}."{name}" AS SELECT * FROM "_tail_{name}".rows')


def _materialize_fresh(con: duckdb.DuckDBPyConnection, wanted: Collection[str]) -> dict[str, str]:
    """The ``wanted`` views of schema ``_fresh`` computed once into tables ``_fresh."<view>_rows"`` (returned by
    view), and the typed rows and views they came from dropped: each question then reads a small table instead of
    recomputing the tail's rollouts (on the 1M-call bench lake with a 5-minute tail: ~0.1 s a question), and the
    connection holds the tail's token lists once."""
    rows = {name: f'{FRESH}."{name}_rows"' for name in wanted}
    for name, table in rows.items():
        con.execute(f'CREATE OR REPLACE TABLE {table} AS SELECT * FROM {FRESH}."{name}"')
    _drop_fresh(con, kept={f"{name}_rows" for name in wanted})
    return rows


def _drop_fresh(con: duckdb.DuckDBPyConnection, *, kept: Collection[str]) -> None:
    """Drop every view and table of schema ``_fresh`` but ``kept``."""
    for kind in ("VIEW", "BASE TABLE"):  # views first: they read the tables
        for (name,) in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND "
                                   "table_type = ?", [FRESH, kind]).fetchall():
            if name not in kept:
                con.execute(f'DROP {"VIEW" if kind == "VIEW" else "TABLE"} {FRESH}."{name}"')


def _touched_table(con: duckdb.DuckDBPyConnection, touched: list[str]) -> str:
    """Temporary table ``_touched`` of ``touched``; returns the filter that keeps their rows. Measured on the
    1M-call lake with 207 ids (load ~20): a literal ``rollout_id IN (...)`` list costs seconds per million rows
    (each row compared with every id), the subquery a hash lookup. The ids are written as a literal list: bound as
    a Python list parameter, 731 ids took 0.2 CPU s and 1.4-2.3 s wall (load ~20), as a literal 0.01 / 0.06-0.15."""
    ids = ", ".join("NULL" if rollout is None else _text(rollout) for rollout in touched)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {TOUCHED} AS SELECT unnest([{ids}]::VARCHAR[]) AS rollout_id")
    return f"rollout_id IN (SELECT rollout_id FROM {TOUCHED})"


def _touched_filter(touched: list[str], *, ranges: int = 16) -> str:
    """A condition that keeps the rows of the rollouts ``touched`` (sorted, distinct ids), in a form DuckDB checks
    inside the Parquet scan, so that a typed table's other columns are decoded only where those rows are: up to
    ``ranges`` ranges of ids (two comparisons a row; a row group whose statistics fall outside them all is skipped),
    then membership in the list (a search through it, for the rows inside the ranges only). The ranges split the
    ids where neighbours share the shortest prefix (the widest gaps between time-ordered ids such as UUIDv7).

    >>> print(_touched_filter(["a1", "a2", "b7"], ranges=2))  # doctest: +NORMALIZE_WHITESPACE
    (rollout_id BETWEEN 'a1' AND 'a2' OR rollout_id BETWEEN 'b7' AND 'b7')
        AND list_contains(['a1', 'a2', 'b7']::VARCHAR[], rollout_id)
    """
    touched = [rollout for rollout in touched if rollout is not None]  # a NULL id matched no row before either
    if not touched:
        return "false"
    within = " OR ".join(f"rollout_id BETWEEN {_text(low)} AND {_text(high)}" for low, high in _ranges(touched, ranges))
    return f"({within}) AND list_contains([{', '.join(map(_text, touched))}]::VARCHAR[], rollout_id)"


def _ranges(touched: list[str], ranges: int) -> list[tuple[str, str]]:
    """Up to ``ranges`` (low, high) ranges that hold the sorted, distinct ids ``touched``, split where neighbours
    share the shortest prefix (the widest gaps between time-ordered ids such as UUIDv7)."""

    def gap(i: int) -> tuple[int, int]:  # smaller: wider gap between touched[i - 1] and touched[i]
        low, high = touched[i - 1], touched[i]
        shared = len(os.path.commonprefix([low, high]))
        return shared, ord(low[shared]) - ord(high[shared]) if shared < len(low) else 0

    cuts = sorted(sorted(range(1, len(touched)), key=gap)[:ranges - 1])
    return [(touched[a], touched[b - 1]) for a, b in zip([0, *cuts], [*cuts, len(touched)])]


def read_marks(con: duckdb.DuckDBPyConnection, lake: Lake) -> Marks | None:
    """The lake's marks, None when there are none (never compacted, reset, or a lake from before them)."""
    if not _is_table(lake, COMPACTION_MARKS_TABLE):
        return None
    rows = con.execute(
        "SELECT source, source_version, kafka_topic, kafka_partition, kafka_offset, epoch_us(compacted_at) "
        "FROM delta_scan(?)",
        [lake.uri(COMPACTION_MARKS_TABLE)]).fetchall()
    if not rows:
        return None
    versions: dict[str, int] = {}
    offsets: dict[str, dict[tuple[str, int], int]] = {}
    for source, version, topic, partition, offset, _ in rows:
        versions[source] = version
        partitions = offsets.setdefault(source, {})
        if topic is not None:
            partitions[(topic, partition)] = offset
    return Marks(versions, offsets, max((row[5] for row in rows if row[5] is not None), default=None))


def tail_rollouts(con: duckdb.DuckDBPyConnection, lake: Lake, marks: Marks, sources: Iterable[str], *,
                  limit: int | None = None, until: Mapping[str, int] | None = None) -> list[str] | None:
    """Sorted rollout ids of ``sources``' rows past ``marks``, read from the data files the commits after the marked
    versions (up to ``until``'s, by source, when given) added (``tail_files``; by Kafka offsets over the whole tables,
    ``touched_rollouts``, where a log entry is gone); None when there are more than ``limit``. The files' rows are
    kept by the marked offsets too (``tail_filters``), so an optimize that merged tail files with older rows, or a
    delete that rewrote a compacted file, adds no rollout that nothing new touched. Measured on the 1M-call bench
    lake with a 4-commit tail (load ~20): 8.5 s by offsets over the whole tables (every filter branch opens every
    table, even where file statistics skip each file)."""
    branches = _tail_branches(lake, marks, sources, until=until)
    if branches is None:
        return touched_rollouts(con, marks, sources, limit=limit)
    return _branch_ids(con, branches, limit=limit)


def _branch_ids(con: duckdb.DuckDBPyConnection, branches: list[tuple[str, str, str]], *,
                limit: int | None) -> list[str] | None:
    """Sorted rollout ids of the tail files' rows that ``branches`` (``_tail_branches``) keep."""
    return _distinct_ids(con, [f"SELECT rollout_id FROM {scan} WHERE {where}" for _, scan, where in branches],
                         limit=limit)


def _tail_branches(lake: Lake, marks: Marks, sources: Iterable[str], *,
                   until: Mapping[str, int] | None = None) -> list[tuple[str, str, str]] | None:
    """(source, a ``read_parquet`` of its tail files, a filter that keeps their rows past the marks), per filter of
    each source with tail files; None when a source's tail files cannot be told (``tail_files``)."""
    branches = []
    for source in sources:
        files = tail_files(lake, source, marks.versions.get(source, -1),
                           until=None if until is None else until[source])
        if files is None:
            return None
        if files:
            scan = f"read_parquet([{', '.join(_text(f) for f in files)}], union_by_name = true)"
            branches += [(source, scan, where) for where in tail_filters(marks.offsets.get(source))]
    return branches


def _distinct_ids(con: duckdb.DuckDBPyConnection, branches: list[str], *, limit: int | None) -> list[str] | None:
    if not branches:
        return []
    query = f"SELECT DISTINCT rollout_id FROM ({' UNION ALL '.join(branches)}) ORDER BY rollout_id"
    if limit is not None:
        query += f" LIMIT {int(limit) + 1}"
    ids = [row[0] for row in con.execute(query).fetchall()]
    return None if limit is not None and len(ids) > limit else ids


def tail_files(lake: Lake, table: str, version: int, *, until: int | None = None) -> list[str] | None:
    """URIs of the data files that hold ``table``'s rows committed after ``version`` (up to ``until``): the files
    those commits added with new rows (``dataChange``: an optimize's rewrites of older files are left out; a
    delete's rewritten files are in, a superset); where a later commit removed one of them (an optimize or a delete
    rewrote it, and a vacuum may delete it), the files that commit added instead (its rows moved only there). None
    when a log entry past ``version`` is gone (log cleanup) or cannot be read."""
    files: dict[str, None] = {}
    current = version + 1
    while (until is None or current <= until) and _moved(lake, table, current - 1):
        text = lake.read_file(f"{table}/_delta_log/{current:020d}.json")
        if text is None:
            return None
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        removed = [a["remove"]["path"] for a in actions if "remove" in a and a["remove"]["path"] in files]
        for path in removed:
            del files[path]
        files.update((a["add"]["path"], None) for a in actions
                     if "add" in a and (removed or a["add"].get("dataChange", True)))
        current += 1
    return [path if "://" in path else f"{lake.uri(table)}/{unquote(path)}" for path in files]


def touched_rollouts(con: duckdb.DuckDBPyConnection, marks: Marks, sources: Iterable[str], *,
                     limit: int | None = None) -> list[str] | None:
    """Sorted rollout ids of the rows of ``sources`` past ``marks``; None when there are more than ``limit``."""
    return _distinct_ids(con, [f'SELECT rollout_id FROM "{source}" WHERE {where}'
                               for source in sources for where in tail_filters(marks.offsets.get(source))],
                         limit=limit)


def tail_filters(marks: Offsets | None) -> list[str]:
    """Disjoint filters (conjunctions of comparisons, which DuckDB checks against file statistics) whose
    union keeps a typed table's rows past ``marks``: per marked partition its offsets past the mark; every
    partition and topic without a mark, whole.

    >>> tail_filters({("t", 0): 41})  # doctest: +NORMALIZE_WHITESPACE
    ["kafka_topic = 't' AND kafka_partition = 0 AND kafka_offset > 41",
     "kafka_topic = 't' AND kafka_partition < 0", "kafka_topic = 't' AND kafka_partition > 0",
     "kafka_topic < 't'", "kafka_topic > 't'"]
    >>> tail_filters(None)
    ['true']
    """
    if not marks:
        return ["true"]
    partitions: dict[str, list[int]] = {}
    for topic, partition in sorted(marks):
        partitions.setdefault(topic, []).append(int(partition))
    filters = [f"kafka_topic = {_text(t)} AND kafka_partition = {p} AND kafka_offset > {int(marks[(t, p)])}"
               for t, ps in partitions.items() for p in ps]
    for topic, ps in partitions.items():
        filters += [f"kafka_topic = {_text(topic)} AND {between}" for between in _outside("kafka_partition", ps)]
    filters += _outside("kafka_topic", [_text(t) for t in partitions])
    return filters


def _outside(column: str, known: list) -> list[str]:
    """Comparisons that keep every value of ``column`` not in ``known`` (sorted, distinct SQL literals)."""
    ranges = [f"{column} < {known[0]}", f"{column} > {known[-1]}"]
    for low, high in zip(known, known[1:]):
        if not (isinstance(low, int) and high == low + 1):
            ranges.append(f"{column} > {low} AND {column} < {high}")
    return ranges


def define_fresh(con: duckdb.DuckDBPyConnection, statements: Mapping[str, str], where: str, *,
                 wanted: Collection[str] = tuple(PREJOINED), materialize: bool = False) -> None:
    """Schema ``_fresh``: the typed tables the ``wanted`` views read, filtered by ``where`` (a condition on their
    rows), and views.sql's ``llm_calls`` (and ``tool_steps`` and ``rollouts`` when ``rollouts`` is wanted) over
    them: the filter sits below every join and aggregate. ``materialize``: the filtered typed tables are read once,
    into tables of the connection, instead of at every query."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {FRESH}")
    kind = "TABLE" if materialize else "VIEW"
    for source in SOURCES:
        if any(source in PREJOINED[name][1] for name in wanted):
            con.execute(f'CREATE OR REPLACE {kind} {FRESH}."{source}" AS SELECT * FROM main."{source}" WHERE {where}')
    for name in RECOMPUTED_VIEWS if ROLLOUTS_VIEW in wanted else [v for v in RECOMPUTED_VIEWS if v in wanted]:
        statement, n = re.subn(rf'CREATE VIEW "?{name}"? AS', f'CREATE OR REPLACE VIEW {FRESH}."{name}" AS',
                               statements[name], count=1)
        if n != 1:
            raise RuntimeError(f"views.sql: no `CREATE VIEW {name} AS` statement to run in schema {FRESH}")
        con.execute(statement)


def _moved(lake: Lake, table: str, version: int) -> bool:
    """Whether ``table`` has a commit past ``version`` (-1: whether it exists now): one file stat, and when entry
    ``version + 1`` is absent, its last checkpoint's version (forget deletes the log entries up to the version
    before it, log cleanup the old ones: the table may have moved on without that entry). An unreadable checkpoint
    counts as moved (the tail is then found by the marked offsets)."""
    return _exists(lake, f"{table}/_delta_log/{version + 1:020d}.json") or lake.checkpointed_past(table, version)


def _is_table(lake: Lake, table: str) -> bool:
    return _exists(lake, f"{table}/_delta_log")


def _exists(lake: Lake, path: str) -> bool:
    if lake.is_local:
        return os.path.exists(os.path.join(lake.root.removeprefix("file://"), path))
    from pyarrow import fs as pafs

    from store.storage import arrow_filesystem

    filesystem, root = arrow_filesystem(lake.root, lake.storage_options)
    return filesystem.get_file_info(f"{root.rstrip('/')}/{path}").type != pafs.FileType.NotFound


# ---- writing: refresh after compaction ----


def refresh(lake: Lake) -> Prejoined:
    """Bring the pre-joined tables up to the lake's current typed tables (only touched rollouts after the first run).

    After the first run its cost follows the tail, not the lake: the touched rollouts and the offsets to mark are
    read from the tail's files (``tail_rollouts``), the touched rollouts' rows through the filter the Parquet scan
    checks (``_touched_filter``), and only the pre-joined files that hold them are rewritten.

    Every commit is made against the tables as they were before the typed tables were read (``_commit``), so a
    concurrent change makes it conflict and the refresh start again, up to ``REFRESH_ATTEMPTS`` times: a ``trajlake
    forget`` (it deletes from the typed tables first, then fences each pre-joined table with a metadata commit, even
    where no row of it held the rollout), another refresh, a ``reset`` of the marks (``ingest --recover``,
    ``rebuild``). A forget that makes a pinned read fail (its vacuum deleted the files) counts the same, and so
    does a delete in a typed table since the read (a whole write into tables a forget did not see yet). A forgotten
    rollout is never written back, and marks are never written over a reset.

    >>> refresh(Lake("./lake"))  # doctest: +SKIP
    Prejoined(incremental=True, rollouts=40, calls=812, buckets=0)
    """
    for attempt in range(1, REFRESH_ATTEMPTS + 1):
        try:
            return _refresh_once(lake)
        except _Raced as exc:
            if attempt == REFRESH_ATTEMPTS:
                raise Conflict(f"the pre-joined tables kept changing under `trajlake compact`'s refresh ({exc})",
                               hint="run `trajlake compact` again once the concurrent forget or compaction ended") \
                    from exc
            log.info("prejoin.refresh retry attempt=%d reason=%r", attempt, str(exc))
    raise AssertionError("unreachable")


def _refresh_once(lake: Lake) -> Prejoined:
    from store.sql import JOINED_VIEWS, connect, joined_view_statements

    marks_table = lake.table(COMPACTION_MARKS_TABLE) if _is_table(lake, COMPACTION_MARKS_TABLE) else None
    marked = {} if marks_table is None else {
        row["source"]: row["source_version"] for row in lake.read(marks_table, columns=["source", "source_version"])
        .to_pylist()}
    if _unchanged(lake, marked):
        log.info("prejoin.refresh unchanged: no typed table moved past its marked version")
        return Prejoined(True, 0, 0, 0)
    pinned = {table: lake.table(table) for table in PREJOINED_TABLES if _is_table(lake, table)}
    if marks_table is not None:
        pinned[COMPACTION_MARKS_TABLE] = marks_table
    # before the snapshot: never newer than it
    versions = {source: _latest(lake, source, marked.get(source, -1)) for source in SOURCES}
    con = connect(lake, tables=SOURCES, views=set(SOURCES))  # one pinned snapshot of every typed table
    try:
        con.execute("SET preserve_insertion_order = false")
        statements = dict(zip(JOINED_VIEWS, joined_view_statements()))
        marks = read_marks(con, lake)
        tables = all(table in pinned for table in PREJOINED_TABLES)
        branches = _tail_branches(lake, marks, SOURCES, until=versions) if marks is not None and tables else None
        if marks is None or not tables:
            covered = _covered(con, lake, versions)
            result = _write_whole(con, lake, statements, pinned, had_marks=marks is not None)
        elif branches is None:  # a tail file's log entry is gone: the typed tables by the marked offsets
            covered = _covered(con, lake, versions)
            touched = touched_rollouts(con, marks, SOURCES, limit=MAX_TOUCHED)
            if touched is None:  # e.g. a rewound partition (every row past -1) after a forget: bucket by bucket
                result = _write_whole(con, lake, statements, pinned, had_marks=True)
            else:
                result = _write_touched(con, lake, statements, touched, pinned)
        else:
            covered = _covered_tail(con, lake, marks, versions, branches)
            result = _write_touched(con, lake, statements, _branch_ids(con, branches, limit=None) or [], pinned)
    except duckdb.IOException as exc:  # a pinned file or log entry gone: a forget's vacuum, or a bug
        if moved := _deleted_since(lake, versions, any_commit=True):
            raise _Raced(f"{moved} moved while it was read: {str(exc).splitlines()[0]}") from exc
        raise
    finally:
        con.close()
    if deleted := _deleted_since(lake, versions):
        raise _Raced(f"rows were deleted from {deleted} while the pre-joined tables were written")
    _commit(lake, COMPACTION_MARKS_TABLE, pinned, covered, mode="overwrite")
    log.info("prejoin.refresh incremental=%s rollouts=%d calls=%d buckets=%d", result.incremental, result.rollouts,
             result.calls, result.buckets)
    return result


def _unchanged(lake: Lake, marked: Mapping[str, int]) -> bool:
    """Whether the marks (``marked``: typed table -> its marked version) cover every typed table at its current
    version (one probe of the next log entry each, ``_moved``) and every pre-joined table exists: a refresh then has
    nothing to do and commits nothing (measured against moto: README, "Operations")."""
    return (all(source in marked for source in SOURCES) and all(_is_table(lake, t) for t in PREJOINED_TABLES)
            and not any(_moved(lake, source, marked[source]) for source in SOURCES))


PROBED_COMMITS = 32
"""Log entries past a marked version probed one by one for a table's current version before its log is loaded."""


def _latest(lake: Lake, table: str, since: int) -> int:
    """``table``'s current version (-1: none), probed from the log entries after version ``since`` (a file stat
    each: a 5-minute tail is a few commits) instead of loading the log (on an object store ~100 GETs of the entries
    since its checkpoint); loaded when the table did not exist at ``since``, moved more than ``PROBED_COMMITS`` since
    or lost the entry after it (a forget drops the entries before its checkpoint)."""
    if since < 0:
        return _version(lake, table)
    current = since
    while current - since < PROBED_COMMITS and _exists(lake, f"{table}/_delta_log/{current + 1:020d}.json"):
        current += 1
    if current - since < PROBED_COMMITS and (current > since or not _moved(lake, table, since)):
        return current
    return _version(lake, table)


def _deleted_since(lake: Lake, versions: Mapping[str, int], *, any_commit: bool = False) -> str | None:
    """The first typed table with a delete (or, ``any_commit``, any commit) after its version in ``versions``: the
    log entries from ``version + 1`` on, read one by one until one is absent (no table load: measured against moto,
    7 tables one commit past, 14.0 s and 2,877 requests by ``DeltaTable.history``; README, "Operations"). A table
    that moved while its next entry is gone (a forget drops the entries before its checkpoint) counts as deleted, and
    so does one whose next entry is there but cannot be read (an object store's error): what it holds is not known."""
    for source, version in versions.items():
        current = version + 1
        while (entry := lake.read_file(f"{source}/_delta_log/{current:020d}.json")) is not None:
            if any_commit or _operation(entry) == "DELETE":
                return source
            current += 1
        if not _absent(lake, f"{source}/_delta_log/{current:020d}.json"):
            return source
        if current == version + 1 and _moved(lake, source, version):
            return source
    return None


def _absent(lake: Lake, path: str) -> bool:
    """Whether nothing is at ``path`` (False when that cannot be told either)."""
    try:
        return not _exists(lake, path)
    except OSError:
        return False


def _operation(entry: bytes) -> str | None:
    """The ``operation`` of a log entry's ``commitInfo`` action (None when it has none)."""
    for line in entry.splitlines():
        if b'"commitInfo"' in line:
            return json.loads(line)["commitInfo"].get("operation")
    return None


def reset(lake: Lake) -> None:
    """Forget what the pre-joined tables cover: readers use views.sql's views, the next ``refresh`` writes whole."""
    if _is_table(lake, COMPACTION_MARKS_TABLE):
        _overwrite(lake, COMPACTION_MARKS_TABLE, _schema(COMPACTION_MARKS_TABLE).empty_table())


def rewind(lake: Lake, topic: str, partitions: Collection[int]) -> None:
    """``trajlake ingest --recover`` re-reads ``partitions`` of ``topic`` from a log whose offsets start again below
    the marks: their marked offsets become -1, so every row of them in a file added after the marked versions (the
    new log's, and the old log's not yet folded in) is the tail's until the next refresh, which marks them no
    further than the ingester's exactly-once markers (``_capped``): the new log's position. A refresh running
    meanwhile conflicts with the rewind's metadata commit and starts again, so its marks (the old log's) never land
    after the rewind."""

    def rewound() -> None:
        handle = lake.table(COMPACTION_MARKS_TABLE)
        rows = lake.read(handle).to_pylist()
        for row in rows:
            if row["kafka_topic"] == topic and row["kafka_partition"] in partitions:
                row["kafka_offset"] = -1
        _append(lake, handle, _marks_table(rows), mode="overwrite")
        # a metadata commit, as ``fence``'s: a refresh that read the marks before conflicts and starts again, even
        # where the overwrite above changed nothing it checks (a whole write empties the marks until its end)
        handle.alter.set_table_properties({"trajlake.rewound": f"{topic}:{sorted(partitions)}"},
                                          raise_if_not_exists=False)

    if _is_table(lake, COMPACTION_MARKS_TABLE):  # a compaction writing its marks meanwhile: read them again
        _until_committed(rewound, what="the compaction marks kept changing while partitions were rewound",
                         hint="run `trajlake ingest --recover` again once the compaction ended")


def fence(lake: Lake, table: str, reason: str) -> None:
    """A metadata commit on a pre-joined ``table``: a refresh that read the typed tables before it then conflicts
    (delta-rs fails any commit whose snapshot predates a metadata change). ``trajlake forget`` fences each pre-joined
    table after deleting from the typed tables, so a rollout that only the tail held (nothing to delete here, no
    commit) is not written back by a refresh that read it before. A refresh's rewrite or another forget's fence
    committed first: fenced again."""
    _until_committed(
        lambda: lake.table(table).alter.set_table_properties({"trajlake.fenced_by": reason}, raise_if_not_exists=False),
        what=f"{table} kept changing while `trajlake forget` fenced it",
        hint="run the forget again (it is idempotent) once the compaction ended")


def _until_committed(commit: Callable[[], None], *, what: str, hint: str) -> None:
    """Run ``commit`` (which loads the table afresh) again when a concurrent commit wins, up to ``REFRESH_ATTEMPTS``
    times; then ``Conflict`` saying ``what`` with ``hint``."""
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, REFRESH_ATTEMPTS + 1):
        try:
            return commit()
        except CommitFailedError as exc:
            if attempt == REFRESH_ATTEMPTS:
                raise Conflict(f"{what} ({exc})", hint=hint) from exc


def _write_whole(con: duckdb.DuckDBPyConnection, lake: Lake, statements: Mapping[str, str],
                 pinned: dict[str, DeltaTable], *, had_marks: bool) -> Prejoined:
    """Every bucket committed on top of this run's previous commit (``pinned``): a concurrent whole write or forget
    in between conflicts, instead of this run appending its later buckets to another run's tables."""
    if had_marks:  # readers must not pair the old marks with half-written tables
        _commit(lake, COMPACTION_MARKS_TABLE, pinned, _schema(COMPACTION_MARKS_TABLE).empty_table(), mode="overwrite")
    (calls,) = con.execute(f'SELECT count(*) FROM "{LLM_REQUESTS_TABLE}"').fetchone()
    bounds = _bucket_bounds(con, max(1, -(-calls // BUCKET_CALLS)))
    written = {name: 0 for name in PREJOINED}
    for bucket, where in enumerate(_bucket_filters(bounds)):
        define_fresh(con, statements, where)
        for name, (table, _) in PREJOINED.items():
            rows = con.execute(f'SELECT * FROM {FRESH}."{name}" ORDER BY {_ORDER[name]}').to_arrow_table()
            _commit(lake, table, pinned, rows.cast(_schema(table)), mode="overwrite" if bucket == 0 else "append")
            written[name] += rows.num_rows
        log.info("prejoin.bucket bucket=%d of=%d calls=%d", bucket + 1, len(bounds) + 1, written[LLM_CALLS_VIEW])
    return Prejoined(False, written[ROLLOUTS_VIEW], written[LLM_CALLS_VIEW], len(bounds) + 1)


def _bucket_bounds(con: duckdb.DuckDBPyConnection, buckets: int) -> list[str]:
    """Rollout ids that cut the calls' rollouts into ``buckets`` ranges of about as many rollouts (fewer when
    there are fewer distinct ids). Ranges, not hashes: each written file then holds one range of ids, so a later
    ``refresh`` rewrites only the files of the rollouts it touches (their statistics skip the others), and the
    typed tables' files outside a range are skipped when a bucket reads them."""
    if buckets <= 1:
        return []
    quantiles = ", ".join(str(k / buckets) for k in range(1, buckets))
    (bounds,) = con.execute(f'SELECT quantile_disc(rollout_id, [{quantiles}]) FROM '
                            f'(SELECT DISTINCT rollout_id FROM "{LLM_REQUESTS_TABLE}" WHERE rollout_id IS NOT NULL)'
                            ).fetchone()
    return sorted(set(bounds or []))


def _bucket_filters(bounds: list[str]) -> list[str]:
    """Conditions on ``rollout_id`` for the ranges ``bounds`` cut: together every row once (NULL ids in the first).

    >>> _bucket_filters(["m"])
    ["(rollout_id < 'm' OR rollout_id IS NULL)", "rollout_id >= 'm'"]
    """
    if not bounds:
        return ["true"]
    lows, highs = [None, *bounds], [*bounds, None]
    filters = []
    for low, high in zip(lows, highs):
        parts = ([] if low is None else [f"rollout_id >= {_text(low)}"]) + \
                ([] if high is None else [f"rollout_id < {_text(high)}"])
        filters.append(" AND ".join(parts) if low is not None else f"({parts[0]} OR rollout_id IS NULL)")
    return filters


def _write_touched(con: duckdb.DuckDBPyConnection, lake: Lake, statements: Mapping[str, str],
                   touched: list[str], pinned: dict[str, DeltaTable]) -> Prejoined:
    """Replace the touched rollouts' rows in each table, one commit per table: the typed rows are read once, through
    the filter the Parquet scan checks, and the predicate's id ranges let delta-rs skip, by statistics, the files that
    hold none of them (only the files that do are rewritten). Each commit is made against ``pinned``'s version of the
    table, so that a delete committed since (a forget) conflicts with it."""
    written = {name: 0 for name in PREJOINED}
    if touched:  # the typed rows read once (each view's statement reads them again: three scans, then two)
        define_fresh(con, statements, _touched_filter(touched), materialize=len(touched) <= MAX_TOUCHED)
        for name, (table, _) in PREJOINED.items():
            rows = con.execute(f'SELECT * FROM {FRESH}."{name}" ORDER BY {_ORDER[name]}').to_arrow_table()
            _commit(lake, table, pinned, rows.cast(_schema(table)), mode="overwrite", predicate=_in(touched))
            written[name] = rows.num_rows
    return Prejoined(True, len(touched), written[LLM_CALLS_VIEW], 0)


class _Raced(Exception):
    """A pre-joined table changed under a refresh's rewrite (a forget, another refresh): the refresh starts again."""


def _commit(lake: Lake, table: str, pinned: dict[str, DeltaTable], rows: pa.Table, *, mode: str,
            predicate: str | None = None) -> None:
    """Write ``rows`` to ``table`` on top of ``pinned[table]`` (a table this run has not seen yet: created, then
    pinned), which follows the commit; ``_Raced`` when the table moved since (the commit conflicts, or a forget's
    vacuum already deleted a file that version lists)."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    handle = pinned.get(table)
    try:
        _append(lake, table if handle is None else handle, rows, mode=mode, predicate=predicate)
    except (CommitFailedError, DeltaError) as exc:
        if handle is None or lake.table(table).version() == handle.version():
            raise
        raise _Raced(f"{table} moved past version {handle.version()}: {str(exc).splitlines()[0]}") from exc
    if handle is None:
        pinned[table] = lake.table(table)


def _version(lake: Lake, table: str) -> int:
    version = lake.version(table)
    return -1 if version is None else version


def _covered(con: duckdb.DuckDBPyConnection, lake: Lake, versions: Mapping[str, int]) -> pa.Table:
    """Marks for the connection's snapshot: each typed table's version and the highest offset of its partitions."""
    return _mark_rows(lake, versions, {source: {(topic, partition): offset for topic, partition, offset in con.execute(
        f'SELECT kafka_topic, kafka_partition, max(kafka_offset) FROM "{source}" GROUP BY ALL').fetchall()}
        for source in SOURCES})


def _covered_tail(con: duckdb.DuckDBPyConnection, lake: Lake, marks: Marks, versions: Mapping[str, int],
                  branches: list[tuple[str, str, str]]) -> pa.Table:
    """``_covered`` from the marks and the tail's files alone: each partition's highest offset there or marked."""
    scans = {source: scan for source, scan, _ in branches}
    highest = {source: dict(marks.offsets.get(source, {})) for source in SOURCES}
    for source, scan in scans.items():
        for topic, partition, offset in con.execute(f"SELECT kafka_topic, kafka_partition, max(kafka_offset) "
                                                    f"FROM {scan} GROUP BY ALL").fetchall():
            if topic is not None:
                highest[source][(topic, partition)] = max(offset, highest[source].get((topic, partition), offset))
    return _mark_rows(lake, versions, highest)


def _mark_rows(lake: Lake, versions: Mapping[str, int], highest: Mapping[str, dict[tuple[str, int], int]]) -> pa.Table:
    """The marks table's rows: per typed table its version, and per partition its highest offset (``_capped``); one
    row without a partition for a table that has none."""
    now = datetime.now(timezone.utc)
    rows = []
    for source in SOURCES:
        for (topic, partition), offset in sorted(_capped(lake, source, versions[source], highest[source]).items()) \
                or [((None, None), None)]:
            rows.append({"source": source, "source_version": versions[source], "kafka_topic": topic,
                         "kafka_partition": partition, "kafka_offset": offset, "compacted_at": now})
    return _marks_table(rows)


def _capped(lake: Lake, source: str, version: int, highest: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """``highest`` (partition -> highest offset seen) no further than the ingester's exactly-once markers in ``source``
    at ``version``: after ``trajlake ingest --recover`` re-read a recreated topic, the old log's rows hold offsets the
    new log has not reached, and a mark past the new log's position would keep its next rows out of the views.
    Partitions without a marker (rows written by other tools) keep their highest offset. ``_Raced`` when the log
    cannot be read through ``version`` (pinned inside a forget, which dropped the entries before its checkpoint): the
    refresh starts again from the versions after it."""
    from store.app_transactions import ingest_positions

    positions = ingest_positions(lake, source, version) if version >= 0 else {}
    if positions is None:
        raise _Raced(f"{source}'s log cannot be read through version {version} (a forget dropped its entries)")
    return {key: offset if offset is None or key not in positions else min(offset, positions[key])
            for key, offset in highest.items()}


def _schema(table: str) -> pa.Schema:
    """The Arrow schema of a pre-joined table or of the marks (loaded by writers only)."""
    from schemas import tables

    return {COMPACTED_LLM_CALLS_TABLE: tables.COMPACTED_LLM_CALLS,
            COMPACTED_TOOL_STEPS_TABLE: tables.COMPACTED_TOOL_STEPS,
            COMPACTED_ROLLOUTS_TABLE: tables.COMPACTED_ROLLOUTS,
            COMPACTION_MARKS_TABLE: tables.COMPACTION_MARKS}[table]


def _marks_table(rows: list[dict]) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=_schema(COMPACTION_MARKS_TABLE))


def _overwrite(lake: Lake, table: str, data: pa.Table) -> None:
    _append(lake, table, data, mode="overwrite")


def _append(lake: Lake, table: str | DeltaTable, data: pa.Table, *, mode: str, predicate: str | None = None) -> None:
    """Write with the compaction's Parquet settings (dictionary pages for scalar columns, none for token lists and
    free text): what its optimize would leave, written once. Measured on the 1M-call bench lake's pre-joined tables,
    bare ``read_parquet`` with 2 threads at load ~12: ``model, finish_reason`` group-by with ``avg(latency_ms)`` over
    1M calls 0.16 -> 0.07 CPU s, ``name`` group-by over 900k tool steps 0.08 -> 0.03, same bytes (+1%). Dictionary
    pages on token lists cost: ``sum(len(prompt_token_ids))`` over 53M ids 0.58 CPU s with them, 0.43 without.
    zstd(1) stays for them: LZ4_RAW decodes 15-24% faster (256M ids: 2.05 -> 1.75 CPU s) for 1.56x the bytes
    (bench/sql/README.md); the rest is DuckDB assembling every id of the list, whatever the layout."""
    from deltalake import write_deltalake

    from store.compact import COMPACT_WRITER_PROPERTIES  # store.compact imports this module

    write_deltalake(lake.write_uri(table) if isinstance(table, str) else table, data, mode=mode, predicate=predicate,
                    target_file_size=PREJOINED_FILE_BYTES,
                    schema_mode="overwrite" if mode == "overwrite" and predicate is None else None,
                    storage_options=dict(lake.storage_options), writer_properties=COMPACT_WRITER_PROPERTIES)


def _in(ids: list[str], *, ranges: int = 16) -> str:
    """A delete predicate for the rows of the rollouts ``ids`` (sorted, distinct): id ranges first, which delta-rs
    checks against each file's statistics (an ``IN`` list alone skips no file), then the list itself.

    >>> _in(["a1", "a2", "b7"], ranges=2)
    "(rollout_id >= 'a1' AND rollout_id <= 'a2' OR rollout_id >= 'b7' AND rollout_id <= 'b7') AND rollout_id IN ('a1', 'a2', 'b7')"
    """
    ids = [rollout for rollout in ids if rollout is not None]
    within = " OR ".join(f"rollout_id >= {_text(low)} AND rollout_id <= {_text(high)}"
                         for low, high in _ranges(ids, ranges))
    return f"({within}) AND rollout_id IN ({', '.join(map(_text, ids))})"


def _text(value: str) -> str:
    """A SQL string literal of ``value`` (DuckDB's and delta-rs's predicates). A NUL is written ``chr(0)``: both
    parsers end a quoted literal at it, and the event contract lets an id hold one (up to 500). One flat
    ``concat``: a chain of ``||`` nests one level per NUL, past DuckDB's expression depth limit (1000) at ~500, and
    binds in superlinear time below it (400 NULs: ~38 CPU s a literal).

    >>> _text("it's")
    "'it''s'"
    >>> _text("a\\x00b")
    "concat('a', chr(0), 'b')"
    """
    quoted = ["'" + part.replace("'", "''") + "'" for part in value.split("\x00")]
    return quoted[0] if len(quoted) == 1 else "concat(" + ", chr(0), ".join(quoted) + ")"


def _quote(s: str) -> str:
    return s.replace("'", "''")
