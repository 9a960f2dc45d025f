"""``run_query`` creates only the views a statement reads (``store.query_reads``): same answers, same errors."""

from __future__ import annotations

import pytest
from tests.store.lake_builder import sample_rollout, write_events

import store.sql
from store.lake import Lake
from store.query_reads import table_names, views_read_by
from store.sql import JOINED_VIEWS, QueryError, connect, joined_view_statements, list_views, run_query, run_read_only

JOINED = dict(zip(JOINED_VIEWS, joined_view_statements()))


@pytest.mark.parametrize("sql, names", [
    ("SELECT 1", set()),
    ("SELECT count(*) FROM Rollouts r JOIN llm_calls USING (tenant, rollout_id)", {"rollouts", "llm_calls"}),
    ("WITH x AS (SELECT * FROM events) SELECT * FROM x", {"events", "x"}),
    ("SELECT (SELECT max(seq) FROM main.events) FROM range(3)", {"events"}),
    ("SELECT * FROM 'datasets/x/part.parquet'", {"datasets/x/part.parquet"}),
])
def test_the_names_a_select_reads(sql, names):
    assert table_names(sql) == names


@pytest.mark.parametrize("sql", [
    "SHOW TABLES", "DESCRIBE rollouts", "SELECT * FROM information_schema.tables", "SELECT * FROM duckdb_views()",
    "SELECT * FROM sqlite_master", "SELECT * FROM query_table('events')", "SELECT * FROM \"lake:events\".main.events",
    "EXPLAIN SELECT 1", "SELECT 1; SELECT 2", "SELEC 1", "DELETE FROM events",
])
def test_a_statement_that_reads_the_catalog_or_is_no_single_select_gets_every_view(sql):
    assert views_read_by(sql, JOINED) is None


def test_a_joined_view_brings_what_it_reads():
    needed = views_read_by("SELECT count(*) FROM rollouts", JOINED)
    assert {"rollouts", "llm_calls", "tool_steps", "llm_requests", "llm_responses", "tool_calls", "tool_results"} <= needed
    assert "llm_call_prompts" not in needed


def test_select_1_lists_nothing_and_creates_no_view(lake, monkeypatch):
    write_events(lake, sample_rollout())
    monkeypatch.setattr(store.sql, "discover_tables", lambda lake: pytest.fail("listed the lake"))
    con = connect(lake, views=views_read_by("SELECT 1", JOINED), sandbox=True)
    try:
        assert list_views(con) == []
    finally:
        con.close()
    assert run_query(lake, "SELECT 1 AS one").to_pylist() == [{"one": 1}]


QUERIES = [
    "SELECT 1",
    "SELECT count(*) AS n FROM llm_calls",
    "SELECT status, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL",
    "SELECT count(*) AS n FROM ROLLOUTS JOIN llm_calls USING (tenant, rollout_id)",
    "WITH p AS (SELECT * FROM llm_call_prompts) SELECT count(*) AS n FROM p",
    "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1",
    "SELECT table_name FROM information_schema.tables ORDER BY 1",
    "SHOW TABLES",
    "SELECT count(*) AS n FROM query_table('tool_steps')",
    "SELECT count(*) AS n FROM rewards",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_answers_are_those_of_a_connection_with_every_view(lake, sql):
    write_events(lake, sample_rollout("r1") + sample_rollout("r2"), tables={"events", "llm_requests", "llm_responses",
                                                                             "rollout_starts"})
    assert run_query(lake, sql).to_pylist() == every_view(lake, sql)


@pytest.mark.parametrize("sql", ["SELECT * FROM rollout", "SELECT nosuch(1)", "SELECT nosuch FROM rollouts"])
def test_errors_are_those_of_a_connection_with_every_view(lake, sql):
    write_events(lake, sample_rollout())
    with pytest.raises(QueryError) as narrowed:
        run_query(lake, sql)
    with pytest.raises(QueryError) as full:
        every_view(lake, sql)
    assert (str(narrowed.value), narrowed.value.hint) == (str(full.value), full.value.hint)


def every_view(lake: Lake, sql: str) -> list[dict]:
    con = connect(lake, sandbox=True)
    try:
        return run_read_only(con, sql).to_pylist()
    finally:
        con.close()
