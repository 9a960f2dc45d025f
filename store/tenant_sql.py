"""SQL for one tenant: a DuckDB connection that holds only that tenant's rows.

Isolation does not rest on inspecting the SQL. A tenant's connection is
built so that nothing else is reachable from it:

* every table is an Arrow dataset over the Delta table's files, filtered
  ``tenant = '<tenant>'`` in Python *before* DuckDB sees it, and registered
  under the table's view name (``events``, ``llm_requests``, ...,
  ``datasets__NAME``); no unfiltered relation exists in the connection;
* the joined views of ``store/views.sql`` (``llm_calls``, ``tool_steps``,
  ``rollouts``) are built on top of those filtered tables;
* DuckDB's own file access is off (``enable_external_access = false``: no
  ``read_csv``, ``read_parquet``, ``COPY``, ``ATTACH``, no spilling to a
  temp directory), no extension is loaded or installable, Python replacement
  scans are off, memory and threads are capped and the configuration is
  locked before the first user statement.

Tables without a ``tenant`` column (``quarantine``, ``dataset_versions``,
``dataset_lineage``, ``checkpoints``, ``runs``) are not exposed at all.

On top, ``check_tenant_select`` parses the statement with DuckDB's parser
(``json_serialize_sql``) and refuses, with a message saying what is allowed,
anything that is not exactly one SELECT over the tenant's views and CTEs:
other statement kinds, schema- or catalog-qualified names (``information_schema``
and the ``duckdb_*``/``pg_catalog`` views included), table functions other
than the pure generators ``range``/``generate_series``/``unnest``, settings
functions, any function not on the allow list (``store.tenant_functions``),
and time travel. Queries run under a wall-clock limit (DuckDB's ``interrupt``
from a timer thread) and return at most ``limit`` rows after skipping
``offset``. That limit and DuckDB's memory limit are soft (neither reaches
inside a long scalar function): the query API runs sandboxes in worker
processes with hard limits (``store.tenant_worker``).

>>> snap = take_snapshot(Lake("./lake"))  # doctest: +SKIP
>>> with open_tenant_sandbox(snap, "acme") as box:  # doctest: +SKIP
...     page = box.query("SELECT status, count(*) FROM rollouts GROUP BY ALL", limit=100)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from schemas.tables import INGESTED_TABLES
from store.lake import Lake, split_rewritten
from store.sql import JOINED_VIEWS, QueryError, WriteRefused, joined_view_statements
from store.tenant_functions import ALLOWED_FUNCTIONS, PARSER_FUNCTIONS

log = logging.getLogger(__name__)

TENANT_COLUMN = "tenant"
TENANT_TABLES: tuple[str, ...] = tuple(
    name for name, schema in INGESTED_TABLES.items() if TENANT_COLUMN in schema.names
)
"""Ingested tables a tenant can query (those carrying a tenant column)."""

PURE_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
"""Table functions that read nothing: the only ones a tenant query may call."""

CALLABLE_FUNCTIONS = ALLOWED_FUNCTIONS | PARSER_FUNCTIONS
"""Scalar, aggregate and window functions a tenant query may call (``store.tenant_functions``)."""

TABLE_REF_KINDS = frozenset(
    {"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST", "EMPTY", "SHOW_REF"}
)
"""Kinds of FROM items a tenant query may contain (anything else is refused)."""


SANDBOX_CONFIG = {
    "enable_external_access": "false",  # no file, network, ATTACH or extension access from SQL
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "python_enable_replacements": "false",  # SQL must not see Python variables by name
    "temp_directory": "",  # nothing spills to disk: a query past the memory limit fails instead
}
"""DuckDB settings of every tenant connection (locked with ``lock_configuration`` once the views exist)."""


class QueryRefused(QueryError):
    """A statement the tenant sandbox does not run (not a single SELECT over the tenant's views)."""


class QueryTimeout(QueryError):
    """The query ran past the sandbox's time limit and was interrupted."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one tenant query may use."""

    timeout_s: float = 10.0
    """Wall-clock limit of one query (parse, run and fetch)."""
    max_sql_chars: int = 20_000
    """Longest accepted SQL text."""
    memory_limit: str = "1GB"
    """DuckDB memory limit of the query's connection (nothing spills to disk)."""
    threads: int = 2
    """DuckDB worker threads of the query's connection."""
    max_result_bytes: int = 16 << 20
    """Largest page (Arrow bytes); a page past it is cut short (``more`` set); a single row past it is refused."""


@dataclass(frozen=True)
class LakeSnapshot:
    """Arrow datasets of the tenant-scoped tables, as of ``taken_at`` (``time.monotonic``)."""

    tables: Mapping[str, ds.Dataset | pa.Table]
    """View name -> unfiltered dataset (an empty typed table for one not written yet)."""
    versions: Mapping[str, int | None]
    taken_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class QueryPage:
    """One page of a query result."""

    table: pa.Table
    offset: int
    more: bool
    """True when rows follow this page (ask again with ``offset + table.num_rows``)."""


def delta_dataset(lake: Lake, table: str, *, version: int | None = None) -> ds.Dataset:
    """The Arrow dataset of a Delta table (at ``version``); ``ValueError`` without a tenant column.

    Use it to expose more tables to a tenant (``open_tenant_sandbox(extra=)``).
    """
    dataset = lake.dataset(table, version=version)
    if TENANT_COLUMN not in dataset.schema.names:
        raise ValueError(f"table {table!r} has no {TENANT_COLUMN!r} column: it cannot be scoped to a tenant")
    return dataset


def take_snapshot(lake: Lake) -> LakeSnapshot:
    """Open every tenant-scoped ingested table at its current version."""
    tables: dict[str, ds.Dataset | pa.Table] = {}
    versions: dict[str, int | None] = {}
    for name in TENANT_TABLES:
        if lake.exists(name):
            delta = lake.table(name)
            tables[name], versions[name] = lake.dataset(delta), delta.version()
        else:
            tables[name], versions[name] = INGESTED_TABLES[name].empty_table(), None
    return LakeSnapshot(tables, versions)


def empty_snapshot() -> LakeSnapshot:
    """Every tenant-scoped table empty (a lake with nothing ingested yet)."""
    return LakeSnapshot({name: INGESTED_TABLES[name].empty_table() for name in TENANT_TABLES},
                        dict.fromkeys(TENANT_TABLES))


class SnapshotCache:
    """The lake's snapshot, re-taken when older than ``ttl_s`` (thread-safe).

    Opening the Delta logs costs tens of milliseconds per table; queries within
    ``ttl_s`` of each other share one snapshot and so may miss the newest
    commits by that long.
    """

    def __init__(self, lake: Lake, *, ttl_s: float = 2.0) -> None:
        self.lake = lake
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._snapshot: LakeSnapshot | None = None

    def get(self) -> LakeSnapshot:
        with self._lock:
            snap = self._snapshot
            if snap is None or time.monotonic() - snap.taken_at >= self.ttl_s:
                snap = self._snapshot = take_snapshot(self.lake)
            return snap


def open_tenant_sandbox(
    snapshot: LakeSnapshot,
    tenant: str,
    *,
    limits: SandboxLimits = SandboxLimits(),
    extra: Mapping[str, ds.Dataset] | None = None,
) -> TenantSandbox:
    """A locked connection over ``tenant``'s rows of the snapshot (plus ``extra`` datasets by view name).

    Every relation is filtered on the tenant column before registration; an
    ``extra`` dataset without one raises ``ValueError``.
    """
    if not tenant:
        raise ValueError("tenant must be a non-empty string")
    tables = {**snapshot.tables, **(extra or {})}
    config = {**SANDBOX_CONFIG, "memory_limit": limits.memory_limit, "threads": str(limits.threads)}
    con = duckdb.connect(":memory:", config=config)
    try:
        con.execute("SET enable_progress_bar = false")
        for name, table in tables.items():
            _register_tenant_relation(con, name, table, tenant)
        relations = set(tables) | _create_joined_views(con)
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return TenantSandbox(con, tenant, frozenset(relations), limits)


def _register_tenant_relation(con: duckdb.DuckDBPyConnection, name: str, table: ds.Dataset | pa.Table,
                              tenant: str) -> None:
    """Register ``name`` as the tenant's rows of ``table``: one filtered relation, or a view over two parts
    when delta-rs rewrote some of its files with ``string_view`` (``store.lake.split_rewritten``)."""
    if TENANT_COLUMN not in table.schema.names:
        raise ValueError(f"relation {name!r} has no {TENANT_COLUMN!r} column: it cannot be scoped to a tenant")
    keep = pc.field(TENANT_COLUMN).cast(pa.string()) == pa.scalar(tenant, pa.string())
    plain, rewritten = split_rewritten(table) if isinstance(table, ds.FileSystemDataset) else (table, None)
    if rewritten is None:
        con.register(name, (plain if plain is not None else table).filter(keep))
        return
    parts = [rewritten.scanner(filter=keep)] if plain is None else [plain.filter(keep), rewritten.scanner(filter=keep)]
    for index, part in enumerate(parts):
        con.register(f"{name}{_PART_SUFFIX}{index}", part)
    con.execute(f'CREATE VIEW "{name}" AS '
                + " UNION ALL ".join(f'SELECT * FROM "{name}{_PART_SUFFIX}{i}"' for i in range(len(parts))))


_PART_SUFFIX = "__part"


def _create_joined_views(con: duckdb.DuckDBPyConnection) -> set[str]:
    created: set[str] = set()
    for name, statement in zip(JOINED_VIEWS, joined_view_statements()):
        try:
            con.execute(statement)
            created.add(name)
        except duckdb.Error as e:  # a table written with an older schema: keep the other views
            log.warning("tenant_view_skipped view=%s error=%r", name, str(e).splitlines()[0])
    return created


class TenantSandbox:
    """One tenant's connection: ``query`` runs tenant SQL (checked), ``execute`` runs the server's own SQL.

    Not thread-safe: open one per request (it is cheap once the snapshot exists).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, tenant: str, relations: frozenset[str],
                 limits: SandboxLimits) -> None:
        self._con = con
        self.tenant = tenant
        self.relations = relations
        self.limits = limits

    def __enter__(self) -> TenantSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._con.close()

    def query(self, sql: str, *, limit: int, offset: int = 0) -> QueryPage:
        """Run tenant SQL: ``check_tenant_select`` first, then at most ``limit`` rows after ``offset``.

        Raises ``QueryRefused``, ``QueryTimeout`` or ``QueryError`` (DuckDB's message and a hint).
        """
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must be >= 0")
        with self._deadline():
            check_tenant_select(self._con, sql, relations=self.relations, max_chars=self.limits.max_sql_chars)
            reader = self._con.execute(sql).to_arrow_reader(max(1, min(limit + 1, 10_000)))
            table, more = _page(reader, offset, limit)
        table, cut = _fit(table, self.limits.max_result_bytes)
        return QueryPage(table, offset, more or cut)

    def execute(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        """Run the server's own parameterised SQL on the tenant's relations, under the time limit."""
        with self._deadline():
            return self._con.execute(sql, params or []).to_arrow_table()

    def describe(self) -> dict[str, list[tuple[str, str]]]:
        """View name -> [(column, DuckDB type)] of every relation the tenant can query."""
        rows = self._con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE NOT internal "
            "ORDER BY table_name, column_index"
        ).fetchall()
        found: dict[str, list[tuple[str, str]]] = {name: [] for name in sorted(self.relations)}
        for table, column, kind in rows:
            if table in found:
                found[table].append((column, kind))
        return found

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """Interrupt the connection once ``timeout_s`` has passed, and keep interrupting until the block ends
        (an interrupt that lands between two statements is otherwise lost)."""
        done, fired = threading.Event(), threading.Event()

        def watch() -> None:
            if done.wait(self.limits.timeout_s):
                return
            fired.set()
            while not done.is_set():
                self._con.interrupt()
                done.wait(0.05)

        watchdog = threading.Thread(target=watch, name="tenant-sql-deadline", daemon=True)
        watchdog.start()
        try:
            yield
        except duckdb.OutOfMemoryException:
            raise QueryError(
                f"query needs more memory than one query may use ({self.limits.memory_limit})",
                hint="aggregate or filter instead of sorting or joining whole tables; select fewer columns",
            ) from None
        except duckdb.Error as e:
            if fired.is_set():
                raise QueryTimeout(
                    f"query stopped after {self.limits.timeout_s:g} s (the limit)",
                    hint="filter earlier (WHERE on task_id, rollout_id or ts), aggregate, or select fewer columns",
                ) from None
            raise QueryError(str(e).strip(), hint=_hint(e, self.relations)) from None
        finally:
            done.set()
            watchdog.join()


def _page(reader: pa.RecordBatchReader, offset: int, limit: int) -> tuple[pa.Table, bool]:
    """Skip ``offset`` rows, keep ``limit``, and report whether any row follows."""
    kept: list[pa.RecordBatch] = []
    skip, need = offset, limit + 1
    for batch in reader:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        batch, skip = batch.slice(skip), 0
        kept.append(batch.slice(0, need))
        need -= min(need, batch.num_rows)
        if need == 0:
            break
    table = pa.Table.from_batches(kept, schema=reader.schema)
    return table.slice(0, limit), table.num_rows > limit


def _fit(table: pa.Table, max_bytes: int) -> tuple[pa.Table, bool]:
    """The longest head of ``table`` within ``max_bytes``; True when rows were cut.

    ``QueryError`` when the first row alone is over ``max_bytes``: no page could hold it.
    """
    if table.nbytes <= max_bytes:
        return table, False
    first = table.slice(0, 1).nbytes
    if first > max_bytes:
        raise QueryError(f"one row of the result is {first:,} bytes; a page holds at most {max_bytes:,} bytes",
                         hint="select fewer or shorter columns, e.g. left(text, 10000) or list_slice(ids, 1, 1000)")
    low, high = 1, table.num_rows - 1  # the answer lies in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if table.slice(0, mid).nbytes <= max_bytes else (low, mid - 1)
    return table.slice(0, low), True


def _hint(e: duckdb.Error, relations: frozenset[str]) -> str:
    if isinstance(e, duckdb.CatalogException):
        return _views_hint(relations)
    if isinstance(e, duckdb.BinderException):
        return "check column names: DESCRIBE <view> lists a view's columns"
    if isinstance(e, duckdb.ParserException):
        return "check the SQL syntax near the marked position"
    return ""


# --- the statement check ------------------------------------------------------------------------------------------


def check_tenant_select(
    con: duckdb.DuckDBPyConnection, sql: str, *, relations: frozenset[str], max_chars: int = 20_000
) -> None:
    """Refuse (``QueryRefused``) anything but one SELECT reading ``relations``, CTEs and pure generators.

    The statement is parsed by DuckDB (``json_serialize_sql``) and the parse
    tree walked: every FROM item must be one of ``TABLE_REF_KINDS``; every
    table name unqualified and in ``relations`` or a CTE in scope; every table
    function in ``PURE_TABLE_FUNCTIONS``; every other function in ``CALLABLE_FUNCTIONS``.
    """
    if not isinstance(sql, str):
        raise QueryRefused(f"the query must be text, not {type(sql).__name__}", hint="send the SQL as a string")
    if not sql.strip():
        raise QueryRefused("empty query", hint="send one SELECT statement, e.g. SELECT * FROM rollouts LIMIT 10")
    if len(sql) > max_chars:
        raise QueryRefused(f"query is {len(sql):,} characters; the limit is {max_chars:,}",
                           hint="shorten it: filter with WHERE instead of long IN lists")
    _check_statement_kind(con, sql)
    serialized = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    try:
        tree = json.loads(serialized)
    except RecursionError:
        raise QueryRefused("query is nested too deeply", hint="flatten the subqueries (use CTEs)") from None
    if tree.get("error") or len(tree.get("statements", [])) != 1:
        raise QueryRefused("only a single SELECT statement can run here",
                           hint=tree.get("error_message") or "send one SELECT statement")
    try:
        _Walker(relations).visit(tree["statements"][0], frozenset())
    except RecursionError:
        raise QueryRefused("query is nested too deeply", hint="flatten the subqueries (use CTEs)") from None


def _check_statement_kind(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryRefused(str(e).strip(), hint="check the SQL syntax near the marked position") from None
    if len(statements) != 1:
        raise QueryRefused(f"got {len(statements)} statements", hint="send one statement (no ';' between statements)")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise WriteRefused(f"{kind.name} statements are not allowed: this API runs read-only SELECT queries",
                           hint="send one SELECT over your views")


class _Walker:
    """Walks DuckDB's JSON parse tree, tracking which CTE names are in scope."""

    def __init__(self, relations: frozenset[str]) -> None:
        self.relations = frozenset(r.lower() for r in relations)

    def visit(self, node: Any, ctes: frozenset[str]) -> None:
        if isinstance(node, list):
            for item in node:
                self.visit(item, ctes)
            return
        if not isinstance(node, dict):
            return
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict) and cte_map.get("map"):
            ctes = self._visit_ctes(cte_map["map"], ctes)
        if "sample" in node and "alias" in node and "type" in node:
            self._check_table_ref(node, ctes)
        if node.get("class") in ("FUNCTION", "WINDOW"):
            self._check_function(node)
        for key, value in node.items():
            if key == "cte_map":
                continue
            if key == "function" and node.get("type") == "TABLE_FUNCTION" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k != "class"}  # checked as a table function, not a scalar
            self.visit(value, ctes)

    def _visit_ctes(self, entries: list[dict[str, Any]], ctes: frozenset[str]) -> frozenset[str]:
        """Each CTE body sees the CTEs before it and itself (recursive CTEs); the query sees all."""
        for entry in entries:
            ctes = ctes | {str(entry["key"]).lower()}
            self.visit(entry.get("value"), ctes)
        return ctes

    def _check_table_ref(self, ref: dict[str, Any], ctes: frozenset[str]) -> None:
        kind = ref["type"]
        if kind not in TABLE_REF_KINDS:
            raise QueryRefused(f"{kind.lower()} in FROM is not supported here", hint="use plain SELECT ... FROM views")
        if kind == "BASE_TABLE":
            name = ref.get("table_name", "")
            if ref.get("schema_name") or ref.get("catalog_name"):
                raise QueryRefused(f"qualified name {_qualified(ref)!r} refused: only your views are visible",
                                   hint=_views_hint(self.relations))
            if ref.get("at_clause"):
                raise QueryRefused("time travel (AT ...) is not available here", hint="query the current views")
            if name.lower() not in self.relations and name.lower() not in ctes:
                raise QueryRefused(f"unknown relation {name!r}", hint=_views_hint(self.relations))
        elif kind == "TABLE_FUNCTION":
            function = ref.get("function") or {}
            name = str(function.get("function_name", "")).lower()
            if name not in PURE_TABLE_FUNCTIONS:
                raise QueryRefused(f"table function {name}() refused: files and catalogs are not readable here",
                                   hint="read your views; allowed table functions: "
                                   + ", ".join(sorted(PURE_TABLE_FUNCTIONS)))
        elif kind == "SHOW_REF" and ref.get("query") is None:
            raise QueryRefused("SHOW of the catalog is not available", hint=_views_hint(self.relations))

    def _check_function(self, function: dict[str, Any]) -> None:
        name = str(function.get("function_name", "")).lower()
        if name not in CALLABLE_FUNCTIONS:  # by name: a schema or catalog prefix does not change which function runs
            raise QueryRefused(f"function {name}() is not available here",
                               hint="use functions on your data only (string, list, date, math and aggregate "
                                    "functions); functions that read settings or build unbounded values are refused")


def _qualified(ref: dict[str, Any]) -> str:
    return ".".join(p for p in (ref.get("catalog_name"), ref.get("schema_name"), ref.get("table_name")) if p)


def _views_hint(relations: frozenset[str]) -> str:
    return "your views: " + ", ".join(sorted(relations))


__all__ = [
    "LakeSnapshot",
    "QueryPage",
    "QueryRefused",
    "QueryTimeout",
    "SandboxLimits",
    "SnapshotCache",
    "TENANT_TABLES",
    "TenantSandbox",
    "check_tenant_select",
    "delta_dataset",
    "empty_snapshot",
    "open_tenant_sandbox",
    "take_snapshot",
]
