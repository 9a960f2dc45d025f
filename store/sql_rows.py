"""A query's answer as Python rows, fetched from DuckDB without Arrow when its column types allow.

``trajlake sql`` prints small answers as a table of Python values. Arrow (pyarrow with numpy, ~0.2 s of a
command's start-up) is needed only for the types whose Python values DuckDB gives differently from Arrow's
``to_pylist`` (a time zone needs pytz in DuckDB; maps, intervals, UUIDs, unsigned 128-bit integers...):
``rows_at_most`` fetches an answer whose columns are all ``PLAIN_TYPES`` straight from DuckDB, and any other
through Arrow, so a value prints the same either way (tests/store/test_sql_rows.py compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from store.sql import arrow_at_most, check_max_rows

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

NUMBER_TYPES = frozenset({"tinyint", "smallint", "integer", "bigint", "utinyint", "usmallint", "uinteger", "ubigint",
                          "float", "double"})
"""DuckDB types that are Arrow integers or floats: a table right-aligns them."""
PLAIN_TYPES = NUMBER_TYPES | {"boolean", "varchar", "blob", "decimal", "date", "time", "timestamp"}
"""DuckDB types (``DuckDBPyType.id``) whose Python values from DuckDB equal Arrow's, also inside lists and structs
of them (``timestamp`` is microseconds without a time zone)."""


@dataclass(frozen=True)
class Rows:
    """An answer: column names, whether each is a number, and the rows' values."""

    columns: list[str]
    numeric: list[bool]
    values: list[tuple[Any, ...]]

    def head(self, n: int) -> Rows:
        return Rows(self.columns, self.numeric, self.values[:n])


def rows_at_most(executed: duckdb.DuckDBPyConnection, max_rows: int | None) -> Rows:
    """The first ``max_rows`` rows (None: all) of an executed statement (``store.sql.query_lake``'s ``fetch``)."""
    check_max_rows(max_rows)
    columns = [d[0] for d in executed.description]
    types = [d[1] for d in executed.description]
    if all(_plain(t) for t in types):
        values = executed.fetchall() if max_rows is None else executed.fetchmany(max_rows)
        return Rows(columns, [t.id in NUMBER_TYPES for t in types], values)
    return rows_from_arrow(arrow_at_most(executed, max_rows))


def _plain(duck_type: Any) -> bool:
    if duck_type.id in ("list", "struct"):
        return all(_plain(child) for _, child in duck_type.children)
    return duck_type.id in PLAIN_TYPES


def rows_from_arrow(table: pa.Table) -> Rows:
    """An Arrow answer (``store.sql.run_query``'s) as ``Rows``."""
    import pyarrow as pa

    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in table.schema]
    return Rows(table.column_names, numeric, list(zip(*(column.to_pylist() for column in table.columns))))
