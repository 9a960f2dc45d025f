"""``store.sql_rows``: an answer fetched straight from DuckDB holds the values Arrow's ``to_pylist`` would give, and
types outside ``PLAIN_TYPES`` still come through Arrow."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from tests.store.lake_builder import sample_rollout, write_events

from store.sql import arrow_at_most, query_lake
from store.sql_rows import PLAIN_TYPES, Rows, rows_at_most

PLAIN = {
    "integers": "SELECT 1::TINYINT a, -2::SMALLINT b, 3 c, 2::BIGINT ** 40 d, 255::UTINYINT e, "
                "18446744073709551615::UBIGINT f",
    "floats": "SELECT 0.1::FLOAT a, 'nan'::DOUBLE b, -0.0::DOUBLE c, 'inf'::FLOAT d, 1e300 e",
    "text": "SELECT 'x' a, '' b, NULL::VARCHAR c, 'é\n\t' d, 'a'::BLOB e, true f, NULL g",
    "decimals": "SELECT 1.5::DECIMAL(4, 2) a, 123456789012345678.5::DECIMAL(38, 1) b",
    "times": "SELECT DATE '2026-01-01' a, TIME '01:02:03.5' b, TIMESTAMP '2026-01-01 00:00:01.25' c",
    "nested": "SELECT [1, 2] a, []::INTEGER[] b, [[0.5, NULL]] c, {'x': DATE '2026-01-01', 'y': ['a']} d, "
              "NULL::INT[] e",
    "rows": "SELECT range AS i, range::VARCHAR AS s FROM range(7)",
    "explain": "EXPLAIN SELECT 1",
}
"""Answers whose every column is a plain type."""
OTHER = {
    "time zone": "SELECT TIMESTAMPTZ '2026-01-01 00:00:01+00' a",
    "map": "SELECT MAP {'a': 1} a, 1 b",
    "interval": "SELECT INTERVAL 1 DAY a",
    "uuid": "SELECT '00000000-0000-0000-0000-000000000001'::UUID a",
    "hugeint": "SELECT 1::HUGEINT a",
    "nested time zone": "SELECT [TIMESTAMPTZ '2026-01-01 00:00:01+00'] a",
}
"""Answers with a column whose Python value DuckDB gives differently (or only with pytz): fetched through Arrow."""


def through_arrow(sql: str, max_rows: int | None) -> Rows:
    table = arrow_at_most(duckdb.connect().execute(sql), max_rows)
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in table.schema]
    return Rows(table.column_names, numeric, [tuple(row.values()) for row in table.to_pylist()])


def same(a: object, b: object) -> bool:
    """Equal values of equal types, NaN equal to NaN, inside lists and dicts too."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("sql", [*PLAIN.values(), *OTHER.values()], ids=[*PLAIN, *OTHER])
@pytest.mark.parametrize("max_rows", [None, 3, 0])
def test_rows_hold_arrows_values(sql, max_rows):
    got, want = rows_at_most(duckdb.connect().execute(sql), max_rows), through_arrow(sql, max_rows)
    assert (got.columns, got.numeric) == (want.columns, want.numeric)
    assert same(got.values, want.values)


@pytest.mark.parametrize("sql", PLAIN.values(), ids=PLAIN)
def test_plain_types_are_fetched_without_arrow(sql, monkeypatch):
    monkeypatch.setattr("store.sql_rows.arrow_at_most", None)  # any use would fail
    con = duckdb.connect().execute(sql)
    assert all(d[1].id in PLAIN_TYPES or d[1].id in ("list", "struct") for d in con.description)
    rows_at_most(con, None)


def test_a_lake_query_answers_the_same_as_rows(lake):
    write_events(lake, sample_rollout("r1"))
    sql = "SELECT rollout_id, status, n_llm_calls, started_at FROM rollouts"
    got = query_lake(lake, sql, lambda executed: rows_at_most(executed, None))
    want = query_lake(lake, sql, lambda executed: arrow_at_most(executed, None)).to_pylist()
    assert [dict(zip(got.columns, row)) for row in got.values] == want


def test_a_negative_row_count_is_refused():
    with pytest.raises(ValueError, match="max_rows must be >= 0"):
        rows_at_most(duckdb.connect().execute("SELECT 1"), -1)
