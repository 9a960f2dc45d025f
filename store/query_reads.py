"""Which views a SQL statement reads, told from its parse tree: ``run_query`` creates only those.

Attaching every table and creating every joined view costs a query ~0.1-0.3 s before it runs (an ATTACH
reads the table's Delta log; an empty ingested table is an Arrow registration that loads pyarrow.dataset);
``SELECT 1`` needs none of it. DuckDB's ``get_table_names`` binds the statement and fails without the tables
(``JOIN ... USING``), so the names come from ``json_serialize_sql``, which only parses.

A statement that reads the catalog (SHOW/DESCRIBE, ``information_schema``, ``duckdb_views()``,
``query_table('x')``...) lists the views it sees: it gets every view, as does one that is not a single
SELECT (an error then reads as it always did).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import duckdb

PARSER_CONFIG = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
"""A parse never downloads or loads an extension."""
CATALOG_PREFIXES = ("duckdb_", "pragma_", "pg_", "sqlite_", "information_schema")
"""Tables and functions whose answer depends on the views that exist."""
CATALOG_FUNCTIONS = frozenset({"query", "query_table"})
"""Table functions that read a view named by a string."""
_VIEW_HEAD = re.compile(r"^\s*(?:--[^\n]*\n\s*)*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\S+)\s+AS\s+", re.IGNORECASE)


def table_names(sql: str, *, parser: duckdb.DuckDBPyConnection | None = None) -> frozenset[str] | None:
    """The lower-case names one SELECT reads as tables (CTE names included); None when that cannot be told.
    ``parser``: a connection opened with ``PARSER_CONFIG`` to parse on (default: a new one).

    >>> sorted(table_names("WITH r AS (SELECT * FROM Rollouts) SELECT * FROM r JOIN llm_calls USING (rollout_id)"))
    ['llm_calls', 'r', 'rollouts']
    >>> table_names("SELECT 1"), table_names("SHOW TABLES"), table_names("EXPLAIN SELECT 1")
    (frozenset(), None, None)
    """
    con = parser or duckdb.connect(":memory:", config=PARSER_CONFIG)
    try:
        (text,) = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    finally:
        if parser is None:
            con.close()
    tree = json.loads(text)
    if tree.get("error") or len(tree.get("statements", ())) != 1:
        return None
    names: set[str] = set()
    pending: list[object] = [tree["statements"]]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        if not isinstance(node, dict):
            continue
        if node.get("type") == "SHOW_REF":
            return None
        if node.get("type") == "BASE_TABLE":
            name = str(node.get("table_name", "")).lower()
            if node.get("catalog_name") or node.get("schema_name") not in ("", "main") or name.startswith(CATALOG_PREFIXES):
                return None
            names.add(name)
        function = node.get("function_name")
        if isinstance(function, str) and (function.lower() in CATALOG_FUNCTIONS or function.lower().startswith(CATALOG_PREFIXES)):
            return None
        pending.extend(node.values())
    return frozenset(names)


def views_read_by(sql: str, joined: Mapping[str, str]) -> frozenset[str] | None:
    """The lower-case names ``sql`` reads, with what the joined views among them read in turn (``joined``: view name ->
    its ``CREATE VIEW`` statement); None: every view.

    >>> sorted(views_read_by("SELECT count(*) FROM v", {"v": "CREATE VIEW v AS SELECT * FROM a JOIN b USING (k)"}))
    ['a', 'b', 'v']
    """
    parser = duckdb.connect(":memory:", config=PARSER_CONFIG)  # one for the statement and the views it reads: a
    try:  # connection costs ~20 ms of CPU, and `rollouts` reads three joined views
        names = table_names(sql, parser=parser)
        if names is None:
            return None
        needed: set[str] = set()
        pending = list(names)
        while pending:
            name = pending.pop()
            if name in needed:
                continue
            needed.add(name)
            if name in joined:
                reads = _view_reads(joined[name], parser)
                if reads is None:
                    return None
                pending.extend(reads)
        return frozenset(needed)
    finally:
        parser.close()


def created_view(statement: str) -> tuple[str, str] | None:
    """(name, query) of a ``CREATE VIEW name AS query`` statement (comment lines before it allowed); None otherwise.

    >>> created_view("-- view\\nCREATE VIEW v AS SELECT 1")
    ('v', 'SELECT 1')
    """
    head = _VIEW_HEAD.match(statement)
    return None if head is None else (head.group(1), statement[head.end():])


_VIEW_READS: dict[str, frozenset[str] | None] = {}
"""``CREATE VIEW`` statement -> the names it reads: views.sql's few statements, each parsed once per process."""


def _view_reads(statement: str, parser: duckdb.DuckDBPyConnection) -> frozenset[str] | None:
    if statement not in _VIEW_READS:
        if len(_VIEW_READS) >= 64:
            _VIEW_READS.clear()
        view = created_view(statement)
        _VIEW_READS[statement] = None if view is None else table_names(view[1], parser=parser)
    return _VIEW_READS[statement]
