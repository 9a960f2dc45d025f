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

import functools
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


def table_names(sql: str) -> frozenset[str] | None:
    """The lower-case names one SELECT reads as tables (CTE names included); None when that cannot be told.

    >>> sorted(table_names("WITH r AS (SELECT * FROM Rollouts) SELECT * FROM r JOIN llm_calls USING (rollout_id)"))
    ['llm_calls', 'r', 'rollouts']
    >>> table_names("SELECT 1"), table_names("SHOW TABLES"), table_names("EXPLAIN SELECT 1")
    (frozenset(), None, None)
    """
    con = duckdb.connect(":memory:", config=PARSER_CONFIG)
    try:
        (text,) = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    finally:
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
    names = table_names(sql)
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
            reads = _view_reads(joined[name])
            if reads is None:
                return None
            pending.extend(reads)
    return frozenset(needed)


def created_view(statement: str) -> tuple[str, str] | None:
    """(name, query) of a ``CREATE VIEW name AS query`` statement (comment lines before it allowed); None otherwise.

    >>> created_view("-- view\\nCREATE VIEW v AS SELECT 1")
    ('v', 'SELECT 1')
    """
    head = _VIEW_HEAD.match(statement)
    return None if head is None else (head.group(1), statement[head.end():])


@functools.lru_cache(maxsize=64)
def _view_reads(statement: str) -> frozenset[str] | None:
    view = created_view(statement)
    return None if view is None else table_names(view[1])
