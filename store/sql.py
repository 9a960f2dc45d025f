"""SQL over the lake: a DuckDB connection with every table as a named view.

Tables are read with ``delta_scan`` from the pip-installed delta extension,
and object-store lakes through the pip-installed ``httpfs`` extension (both
loaded from the files the wheels ship; nothing downloads) with a secret built
from the lake's storage options (``store.storage.duckdb_secret``).

View names: every Delta table of the lake (a folder holding a ``_delta_log``
one or two levels under the root, local or object store) becomes a view named
by its path with ``/`` replaced by ``__`` and any other character outside
``[A-Za-z0-9_]`` by ``_``: ``events``, ``dataset_versions``,
``datasets/gsm8k-v2`` -> ``datasets__gsm8k_v2``. Folders starting with ``.``
or ``_`` are skipped. An ingested table that has not been
written yet is an empty view typed from its Arrow schema, so queries never
fail with "table not found" on a young lake. On top sit the joined views of
``store/views.sql``: ``llm_calls`` (request + response), ``tool_steps``
(call + result) and ``rollouts`` (one row per rollout with counts, token
totals and rewards). Their names are reserved: a Delta table that carries one
is exposed as ``<name>__table``. Once ``trajlake compact`` has run,
``llm_calls`` and ``rollouts`` read its pre-joined tables instead, plus the
rollouts that changed since (``store.prejoin``): the same rows.

``run_query`` is the read-only entry point people (and the CLI) use: one
SELECT/EXPLAIN statement, no file access outside the lake, settings locked.
``connect`` stays a plain connection factory and ``run_read_only`` runs a
query on any connection, so a service can keep a connection, add its own
views (tenant isolation) and lock it with ``sandbox=True``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import duckdb

from schemas.errors import NotFound, TrajlakeError
from schemas.table_names import ADDED_COLUMNS, INGESTED_TABLE_NAMES, LLM_CALLS_VIEW, ROLLOUTS_VIEW, TOOL_STEPS_VIEW
from store import tail_cache
from store.lake import Lake, list_tables
from store.query_reads import created_view, views_read_by
from store.storage import duckdb_secret, store_problem

if TYPE_CHECKING:  # Arrow (and the catalogue's Arrow schemas) load when a query reads a table or returns Arrow:
    import pyarrow as pa  # ``trajlake sql "SELECT 1"`` needs neither (issue 16: pyarrow is 0.2 s of start-up)

log = logging.getLogger(__name__)
T = TypeVar("T")

VIEWS_SQL = Path(__file__).with_name("views.sql")
PREJOINED_VIEW_NAMES: tuple[str, ...] = (LLM_CALLS_VIEW, TOOL_STEPS_VIEW, ROLLOUTS_VIEW)
"""The views ``store.prejoin`` can serve from compacted tables (its ``PREJOINED``); named here so that a query
that reads none of them does not load it."""

READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
EXPORT_FORMATS: tuple[str, ...] = ("csv", "json", "parquet")

CONNECTION_CONFIG = {
    "allow_unsigned_extensions": "true",  # the delta extension file shipped by the wheel
    "python_enable_replacements": "false",  # SQL must not see Python variables by name
}

ViewKind = Literal["delta", "empty", "joined"]


class QueryError(TrajlakeError):
    """A query DuckDB refused (or we did), with a hint on what to do next."""


class UnreadableFile(QueryError):
    """DuckDB could not read a file the statement needed (its "IO Error"): gone, damaged, or the store failed."""


class WriteRefused(QueryError):
    """A statement that would change something: the lake is read through views only."""


class LakeMissing(NotFound):
    """The lake root does not exist (or its object store does not answer: ``problem`` says why)."""

    def __init__(self, root: str, problem: str | None = None) -> None:
        super().__init__(problem or (
            f"no lake at {root!r}: point --lake / TRAJLAKE_LAKE at an existing lake, "
            "or ingest some events first (trajlake ingest)"
        ))
        self.root = root


@dataclass(frozen=True)
class ViewInfo:
    """One view of the connection: what it reads and how big it is."""

    name: str
    kind: ViewKind
    """``delta`` (a Delta table), ``empty`` (a known table not written yet) or ``joined``."""
    rows: int
    table: str | None = None
    """Table path under the lake root (``datasets/NAME``), None for joined views."""
    version: int | None = None
    """Current Delta version, None unless ``kind == "delta"``."""


def delta_extension_path() -> str:
    """The delta extension file shipped by duckdb-extension-delta for this duckdb."""
    import duckdb_extension_delta

    return _extension_path(duckdb_extension_delta.__file__, "delta")


def httpfs_extension_path() -> str:
    """The httpfs extension file shipped by duckdb-extension-httpfs for this duckdb."""
    import duckdb_extension_httpfs

    return _extension_path(duckdb_extension_httpfs.__file__, "httpfs")


def _extension_path(package_file: str, name: str) -> str:
    path = Path(package_file).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.exists():
        raise RuntimeError(
            f"no {name} extension for duckdb {duckdb.__version__} at {path}: "
            f"duckdb and duckdb-extension-{name} must have the same version (reinstall with `make install`)"
        )
    return str(path)


def open_duckdb(lake: Lake, *, config: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that can ``delta_scan`` the lake's tables, local or on an object store.

    Loads the delta extension (and httpfs plus the lake's secret for an
    object-store lake); ``config`` adds connection settings.
    """
    con = duckdb.connect(":memory:", config={**CONNECTION_CONFIG, **(config or {})})
    try:
        con.execute("SET enable_progress_bar = false")  # it would print into csv/json on stdout
        secret = duckdb_secret(lake.root, lake.storage_options)
        if secret is not None:
            con.load_extension(httpfs_extension_path())
            con.execute(secret)
        con.load_extension(delta_extension_path())
    except BaseException:
        con.close()
        raise
    return con


def view_name(table: str) -> str:
    """The view name of a table path: ``datasets/gsm8k-v2`` -> ``datasets__gsm8k_v2``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", table.strip("/").replace("/", "__"))
    return f"{name}__table" if name in JOINED_VIEWS else name


def discover_tables(lake: Lake) -> dict[str, str]:
    """View name -> table path of every Delta table in the lake (``store.lake.list_tables``).

    Tables under a folder starting with ``.`` or ``_`` are left out. On a
    name clash the first path in sorted order wins.
    """
    found: dict[str, str] = {}
    for path in list_tables(lake):
        if any(part.startswith((".", "_")) for part in path.split("/")):
            continue
        name = view_name(path)
        if name in found:
            log.warning("view_name_clash view=%s kept=%s skipped=%s", name, found[name], path)
            continue
        found[name] = path
    return found


def connect(lake: Lake, *, tables: Iterable[str] | None = None, views: Collection[str] | None = None,
            sandbox: bool = False, one_query: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with a view per lake table plus the joined views.

    ``tables`` names the Delta tables to expose (default: every one found;
    an absent one is skipped, or an empty view when it is an ingested table).
    ``views`` (lower-case names, e.g. ``views_read_by``'s) keeps only the views
    it names, of any kind; the lake is not even listed when it is empty.
    ``sandbox`` turns off file access outside the lake root, Python
    replacement scans and extension loading, then locks the configuration;
    ``run_query`` always uses it. Every table is pinned at the version it had
    when the connection opened (``attach_table``): one consistent snapshot per
    connection; open a new connection to see later commits. ``one_query``: the
    connection answers one statement (``run_query``): rows that arrived since the
    last ``trajlake compact`` are recomputed by that statement over the columns it
    reads instead of once at connect for every later one (``store.prejoin``), or,
    on a local lake, read from the files where the first one-shot over that tail
    kept them (``store.tail_cache``).

    >>> con = connect(Lake("./lake"))  # doctest: +SKIP
    >>> con.sql("SELECT status, count(*) FROM rollouts GROUP BY ALL").fetchall()  # doctest: +SKIP
    """
    if views is not None and not views:
        found = {}
    else:
        found = discover_tables(lake) if tables is None else {view_name(t): t for t in tables if lake.exists(t)}
    if views is not None:
        found = {name: path for name, path in found.items() if name.lower() in views}
    con = open_duckdb(lake)
    try:
        present = set(INGESTED_TABLE_NAMES) | set(found) | set(JOINED_VIEWS) if views is None else set(views)
        prejoined = bool(present & set(PREJOINED_VIEW_NAMES))
        if prejoined:  # only then load the pre-joined tables' reader (Arrow schemas)
            from store.prejoin import prejoined_views, read_marks, tail_heads

            marks = read_marks(con, lake)  # before the typed tables are pinned: they are then never older than it
            heads = tail_heads(lake, marks, present) if one_query else None  # so are these versions
        for name, path in found.items():
            attach_table(con, lake.uri(path), name)
        if views is None or set(views) & (set(INGESTED_TABLE_NAMES) - set(found)):  # an ingested table not written
            from schemas.tables import INGESTED_TABLES  # yet is read: only then load the catalogue's Arrow schemas

            for name, schema in INGESTED_TABLES.items():
                if name not in found and (views is None or name in views):
                    con.register(name, schema.empty_table())
        statements = dict(zip(JOINED_VIEWS, joined_view_statements()))
        if prejoined:  # the compacted tables, where current
            statements.update(prejoined_views(con, lake, statements, present, marks, keep=not one_query,
                                              heads=heads))
        for name, statement in statements.items():
            if views is not None and name not in views:
                continue
            try:
                con.execute(statement)
            except duckdb.Error as e:  # e.g. a table written with an older schema: keep the other views
                log.warning("joined_view_skipped error=%r", str(e).splitlines()[0])
        if sandbox:
            lock_down(con, lake)
    except BaseException:
        con.close()
        raise
    return con


def attach_table(con: duckdb.DuckDBPyConnection, uri: str, name: str) -> None:
    """Expose the Delta table at ``uri`` as view ``name``, pinned at its current version.

    The table is attached read-only with ``PIN_SNAPSHOT`` (catalog ``lake:<name>``): its log is read
    once, when the view is created, instead of at every scan; a view that reads a table twice (the
    joined views do) sees one version. Measured on a 60-commit table under load: ``count(*)`` 0.52 s
    through ``delta_scan``, 0.21 s pinned; a filter that keeps nothing 0.20 s against 0.02 s.
    """
    catalog = f"lake:{name}"
    con.execute(f"ATTACH '{_quote(uri)}' AS \"{catalog}\" (TYPE delta, PIN_SNAPSHOT, READ_ONLY)")
    create_table_view(con, name, f'"{catalog}"')


def create_table_view(con: duckdb.DuckDBPyConnection, name: str, source: str) -> None:
    """``CREATE VIEW name AS SELECT * FROM source``; an ingested table written before a nullable column
    joined the catalogue (e.g. llm_requests.extends_call_id in tests/fixtures/lake-v1) gets it as NULL,
    so the joined views and readers see one set of columns on old and new lakes."""
    con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM {source}')
    if name not in ADDED_COLUMNS:  # DESCRIBE costs ~5 ms a table: only where a column was added since
        return
    have = {row[0] for row in con.execute(f'DESCRIBE "{name}"').fetchall()}
    if set(ADDED_COLUMNS[name]) <= have:  # a current table: neither the catalogue's Arrow schemas nor Arrow load
        return
    import pyarrow as pa

    from schemas.tables import INGESTED_TABLES

    null_types = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE",
                  pa.bool_(): "BOOLEAN"}
    missing = [f for f in INGESTED_TABLES[name] if f.name not in have and f.type in null_types]
    if missing:
        nulls = ", ".join(f'NULL::{null_types[f.type]} AS "{f.name}"' for f in missing)
        con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT *, {nulls} FROM {source}')


def joined_view_statements() -> list[str]:
    text = VIEWS_SQL.read_text(encoding="utf-8")
    return [part.strip() for part in text.split("-- view\n")[1:] if part.strip()]


def _joined_view_names() -> tuple[str, ...]:
    names = []
    for statement in joined_view_statements():
        if (view := created_view(statement)) is None:
            raise RuntimeError(f"{VIEWS_SQL}: every statement after a `-- view` line must be CREATE VIEW name AS ...; "
                               f"got {statement[:60]!r}")
        names.append(view[0])
    return tuple(names)


JOINED_VIEWS: tuple[str, ...] = _joined_view_names()
"""Views defined in ``views.sql``, in creation order (the catalogue's ``schemas.tables.VIEWS`` lists the same)."""


def lock_down(con: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """No file access outside the lake, no extension loading, configuration locked."""
    root = lake.root.removeprefix("file://").rstrip("/") + "/"
    con.execute("SET allowed_directories = [?]", [root])
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def run_query(lake: Lake, sql: str, *, max_rows: int | None = None) -> pa.Table:
    """Run one read-only statement over the lake's views and return Arrow.

    A fresh sandboxed connection per call (``connect(lake, sandbox=True,
    one_query=True)`` then ``run_read_only``) with only the views the statement reads
    (``views_read_by``: ``SELECT 1`` attaches nothing); an error is worded
    by a connection with every view (its hint lists them). Raises
    ``LakeMissing`` when the lake root does not exist, and what
    ``run_read_only`` raises.

    >>> run_query(Lake("./lake"), "SELECT count(*) AS n FROM llm_calls").to_pylist()  # doctest: +SKIP
    [{'n': 12}]
    """
    check_max_rows(max_rows)
    return query_lake(lake, sql, lambda con: arrow_at_most(con, max_rows))


def query_lake(lake: Lake, sql: str, fetch: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """``run_query`` with the answer taken by ``fetch`` from the connection that executed ``sql`` (e.g.
    ``store.sql_rows.rows_at_most``: Python rows, no Arrow); raises what ``run_query`` raises."""
    check_lake(lake)
    views = views_read_by(sql, dict(zip(JOINED_VIEWS, joined_view_statements())))
    try:
        return _run_on_views(lake, sql, views, fetch)
    except QueryError:
        if views is None:
            raise
    return _run_on_views(lake, sql, None, fetch, again=False)


def _run_on_views(lake: Lake, sql: str, views: Collection[str] | None,
                  fetch: Callable[[duckdb.DuckDBPyConnection], T], *, again: bool = True) -> T:
    """The statement on a one-shot connection; when a read of a file kept by ``store.tail_cache`` failed (damaged
    past what ATTACH checks), that key is discarded and the statement runs once more (``again``)."""
    con = connect(lake, views=views, sandbox=True, one_query=True)
    try:
        return read_only(con, sql, fetch)
    except UnreadableFile as exc:
        if not again or not (damaged := tail_cache.damaged_keys(con, str(exc))):
            raise
        for cache_key in damaged:
            tail_cache.discard(lake, cache_key)
        log.info("sql.kept_tail_discarded keys=%s", ",".join(damaged))
    finally:
        con.close()
    return _run_on_views(lake, sql, views, fetch, again=False)


def run_read_only(con: duckdb.DuckDBPyConnection, sql: str, *, max_rows: int | None = None) -> pa.Table:
    """Run one SELECT/EXPLAIN statement on ``con`` (reusable, e.g. by a service) and return Arrow.

    At most ``max_rows`` rows are fetched (ask for one more than you show to
    learn whether there were more). Raises ``QueryError`` with DuckDB's
    message and a hint, ``WriteRefused`` for any other statement kind.
    """
    check_max_rows(max_rows)
    return read_only(con, sql, lambda executed: arrow_at_most(executed, max_rows))


def check_max_rows(max_rows: int | None) -> None:
    """``ValueError`` unless ``max_rows`` is None or >= 0."""
    if max_rows is not None and max_rows < 0:
        raise ValueError("max_rows must be >= 0")


def read_only(con: duckdb.DuckDBPyConnection, sql: str, fetch: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """Run one SELECT/EXPLAIN statement on ``con`` and return what ``fetch`` takes from the executed connection;
    raises as ``run_read_only`` does (DuckDB's errors while fetching included)."""
    _check_read_only(con, sql)
    try:
        return fetch(con.execute(sql))
    except duckdb.Error as e:
        error = UnreadableFile if isinstance(e, duckdb.IOException) else QueryError
        raise error(str(e).strip(), hint=_hint(con, e)) from None


def arrow_at_most(executed: duckdb.DuckDBPyConnection, max_rows: int | None) -> pa.Table:
    """The first ``max_rows`` rows (None: all) of an executed statement, as Arrow."""
    batch_rows = 100_000 if max_rows is None else max(1, min(max_rows, 100_000))
    return _read_at_most(executed.to_arrow_reader(batch_rows), max_rows)


def check_lake(lake: Lake) -> None:
    """Raise ``LakeMissing`` when a local lake root does not exist, or an object store's bucket does not answer."""
    if lake.is_local and not Path(lake.root.removeprefix("file://")).is_dir():
        raise LakeMissing(lake.root)
    if not lake.is_local and (problem := store_problem(lake.root, lake.storage_options)):
        raise LakeMissing(lake.root, problem)


def _check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    if not sql.strip():
        raise QueryError("empty query", hint="pass one SELECT statement, e.g. SELECT * FROM rollouts LIMIT 10")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(str(e).strip(), hint="check the SQL syntax near the marked position") from None
    if len(statements) != 1:
        raise QueryError(
            f"got {len(statements)} statements", hint="run one statement at a time (no ';' between statements)"
        )
    kind = statements[0].type
    if kind not in READ_STATEMENTS:
        named = sql.split(None, 1)[0].upper() if kind.name == "LOAD" else kind.name  # DuckDB types INSTALL as LOAD
        raise WriteRefused(
            f"{named} statements are not allowed: the lake is read-only here",
            hint="use SELECT (or EXPLAIN); to export results use --format csv|json|parquet --output FILE, not COPY",
        )


def _read_at_most(reader: pa.RecordBatchReader, max_rows: int | None) -> pa.Table:
    import pyarrow as pa

    batches: list[pa.RecordBatch] = []
    n = 0
    for batch in reader:
        batches.append(batch)
        n += batch.num_rows
        if max_rows is not None and n >= max_rows:
            break
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return table if max_rows is None else table.slice(0, max_rows)


def _hint(con: duckdb.DuckDBPyConnection, e: duckdb.Error) -> str:
    if isinstance(e, duckdb.CatalogException):
        return "views: " + ", ".join(list_views(con)) + " (trajlake tables shows them with row counts)"
    if isinstance(e, duckdb.BinderException):
        return "check column names: DESCRIBE <view> lists a view's columns"
    if isinstance(e, duckdb.PermissionException):
        return "queries read the lake's views only; other files and settings are off limits"
    if isinstance(e, duckdb.ParserException):
        return "check the SQL syntax near the marked position"
    return ""


def list_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the views (and registered empty tables) of a connection, sorted."""
    rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
                       "ORDER BY view_name").fetchall()
    return [r[0] for r in rows]


def describe_views(lake: Lake) -> list[ViewInfo]:
    """Every view of ``connect(lake)`` with its kind, row count and Delta version."""
    check_lake(lake)
    found = discover_tables(lake)
    con = connect(lake, sandbox=True)
    try:
        infos: list[ViewInfo] = []
        for name in list_views(con):
            (rows,) = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            if name in found:
                path = found[name]
                infos.append(ViewInfo(name, "delta", rows, table=path, version=lake.table(path).version()))
            else:
                infos.append(ViewInfo(name, "joined" if name in JOINED_VIEWS else "empty", rows))
        return infos
    finally:
        con.close()


def export(table: pa.Table, path: str | Path, *, format: str) -> None:
    """Write a query result to ``path`` as csv, json (one object per line) or parquet.

    Parquet keeps the Arrow types exactly (token ids stay list<int32>); csv
    writes lists as ``[1, 2, 3]``, json as arrays; timestamps become RFC 3339
    text in UTC (``2026-01-01T00:00:01.250000Z``) in both. Raises ``OSError``
    when the file cannot be written.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {format!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if format == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, str(path))
        return
    options = "FORMAT csv, HEADER true" if format == "csv" else "FORMAT json"
    con = duckdb.connect(":memory:", config={"python_enable_replacements": "false"})
    try:
        con.register("result", _timestamps_as_text(table))
        con.execute(f"COPY result TO '{_quote(str(path))}' ({options})")
    except duckdb.IOException as e:
        raise OSError(str(e)) from None
    finally:
        con.close()


def _timestamps_as_text(table: pa.Table) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc  # not at import: a query's start-up does not need the compute kernels

    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            column = table.column(i)
            if field.type.tz is not None:
                column = column.cast(pa.timestamp(field.type.unit, tz="UTC"))
            text = pc.strftime(column, format="%Y-%m-%dT%H:%M:%S" + ("Z" if field.type.tz else ""))
            table = table.set_column(i, pa.field(field.name, pa.string()), text)
    return table


def _quote(s: str) -> str:
    return s.replace("'", "''")
