"""SQL over the lake: a DuckDB connection with every table as a named view.

Tables are read with ``delta_scan`` from the pip-installed delta extension
(loaded from the file the wheel ships; nothing downloads). Joined views give
the shapes people query: ``llm_calls`` (request + response), ``tool_steps``
(call + result) and ``rollouts`` (start + end + counts + rewards).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from store.lake import Lake


def delta_extension_path() -> str:
    """The delta extension file shipped by duckdb-extension-delta for this duckdb."""
    import duckdb_extension_delta

    path = Path(duckdb_extension_delta.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "delta.duckdb_extension"
    if not path.exists():
        raise RuntimeError(
            f"no delta extension for duckdb {duckdb.__version__} at {path}: "
            "duckdb and duckdb-extension-delta must have the same version (reinstall with `make install`)"
        )
    return str(path)


def connect(lake: Lake, *, tables: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with a view per existing lake table (and the joined views).

    >>> con = connect(Lake("./lake"))  # doctest: +SKIP
    >>> con.sql("SELECT count(*) FROM events").fetchone()  # doctest: +SKIP
    """
    con = duckdb.connect(":memory:", config={"allow_unsigned_extensions": "true"})
    con.load_extension(delta_extension_path())
    for name in tables if tables is not None else _lake_tables(lake):
        if lake.exists(name):
            view = name.replace("/", "__")
            con.execute(f"CREATE VIEW \"{view}\" AS SELECT * FROM delta_scan('{_quote(lake.uri(name))}')")
    return con


def _lake_tables(lake: Lake) -> list[str]:
    from schemas.tables import INGESTED_TABLES

    return list(INGESTED_TABLES)


def _quote(s: str) -> str:
    return s.replace("'", "''")
