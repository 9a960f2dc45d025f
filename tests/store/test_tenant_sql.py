"""The tenant sandbox on real Delta lakes: only the tenant's rows exist in it, nothing else is reachable.

The connection-level tests go through ``TenantSandbox.execute`` (the server's
own SQL, which skips the statement check) to show that isolation holds even
for SQL the check would have refused.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from tests.store.lake_builder import sample_rollout, write_events

from schemas.tables import INGESTED_TABLES
from store.lake import Lake
from store.sql import JOINED_VIEWS, QueryError, WriteRefused, connect
from store.tenant_functions import ALLOWED_FUNCTIONS, REFUSED_FUNCTIONS
from store.tenant_sql import (
    PURE_TABLE_FUNCTIONS,
    TENANT_TABLES,
    QueryRefused,
    QueryTimeout,
    SandboxLimits,
    SnapshotCache,
    check_tenant_select,
    delta_dataset,
    open_tenant_sandbox,
    take_snapshot,
)

FAST = SandboxLimits(timeout_s=2.0)  # short, with room for a loaded machine


@pytest.fixture
def two_tenants(lake: Lake) -> Lake:
    """acme: r1 (finished) and r2 (started); beta: r1 too (same id) and r9; o'brien: r5."""
    write_events(lake, [*sample_rollout("r1", tenant="acme"), *sample_rollout("r2", tenant="acme")[:3],
                        *sample_rollout("r1", tenant="beta"), *sample_rollout("r9", tenant="beta"),
                        *sample_rollout("r5", tenant="o'brien")])
    return lake


@pytest.fixture
def acme(two_tenants: Lake):
    with open_tenant_sandbox(take_snapshot(two_tenants), "acme", limits=FAST) as box:
        yield box


def test_every_relation_holds_exactly_the_tenants_rows(two_tenants, acme):
    plain = connect(two_tenants)
    assert acme.relations == frozenset(TENANT_TABLES) | frozenset(JOINED_VIEWS)
    for name in sorted(acme.relations):
        expected = plain.execute(f"SELECT count(*) FROM {name} WHERE tenant = 'acme'").fetchone()[0]
        assert expected > 0, name
        got = acme.query(f"SELECT tenant, count(*) AS n FROM {name} GROUP BY ALL", limit=10).table.to_pylist()
        assert got == [{"tenant": "acme", "n": expected}], name


def test_tables_without_a_tenant_column_are_not_there(two_tenants, acme):
    assert "quarantine" in INGESTED_TABLES and "quarantine" not in acme.relations
    with pytest.raises(QueryRefused, match="unknown relation 'quarantine'"):
        acme.query("SELECT * FROM quarantine", limit=1)
    with pytest.raises(QueryError):
        acme.execute("SELECT * FROM quarantine")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('{lake}/events/*.parquet')",
    "SELECT * FROM '{lake}/events/*.parquet'",
    "SELECT * FROM glob('{lake}/*')",
    "COPY (SELECT 1) TO '{lake}/../stolen.csv'",
    "ATTACH '{lake}/../other.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD '{lake}/../evil.duckdb_extension'",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "SET memory_limit = '100GB'",
])
def test_the_connection_itself_refuses_files_extensions_and_settings(two_tenants, acme, sql):
    """Even SQL that skips the statement check (``execute``) cannot leave the tenant's rows."""
    with pytest.raises(QueryError):
        acme.execute(sql.format(lake=two_tenants.root))


def test_copy_through_the_unchecked_path_writes_no_file(two_tenants, acme, tmp_path):
    target = tmp_path / "stolen.csv"
    with pytest.raises(QueryError):
        acme.execute(f"COPY (SELECT * FROM events) TO '{target}'")
    assert not target.exists()


def test_unfiltered_rows_are_unreachable_even_without_the_check(acme):
    assert acme.execute("SELECT DISTINCT tenant FROM events").to_pylist() == [{"tenant": "acme"}]
    assert acme.execute("SELECT count(*) AS n FROM rollouts WHERE tenant = 'beta'").to_pylist() == [{"n": 0}]
    assert acme.execute("SELECT count(*) AS n FROM rollouts WHERE rollout_id = 'r1'").to_pylist() == [{"n": 1}]


@pytest.mark.parametrize("sql,error,match", [
    ("SELECT * FROM read_csv('/etc/passwd')", QueryRefused, "read_csv"),
    ("SELECT * FROM delta_scan('/lake/events')", QueryRefused, "delta_scan"),
    ("SELECT * FROM system.main.read_parquet('x')", QueryRefused, "read_parquet"),
    ("COPY events TO 'x.csv'", WriteRefused, "COPY"),
    ("ATTACH 'x.db'", WriteRefused, "ATTACH"),
    ("INSTALL httpfs", WriteRefused, "not allowed"),
    ("LOAD httpfs", WriteRefused, "not allowed"),
    ("SET threads = 64", WriteRefused, "SET"),
    ("PRAGMA version", QueryRefused, "single SELECT"),
    ("CALL pragma_version()", WriteRefused, "CALL"),
    ("SELECT 1; SELECT 2", QueryRefused, "2 statements"),
    ("SELECT * FROM information_schema.columns", QueryRefused, "qualified"),
    ("SELECT * FROM duckdb_views", QueryRefused, "unknown relation"),
    ("SELECT main.current_setting('threads')", QueryRefused, "current_setting"),
    ("SELECT getvariable('x')", QueryRefused, "getvariable"),
    ("SELECT len(range(300000000))", QueryRefused, "range"),
    ("SELECT list_resize([1], 300000000)", QueryRefused, "list_resize"),
    ("SELECT repeat('x', 500000000)", QueryRefused, "repeat"),
    ("SELECT * FROM range(3) WHERE lpad('x', 400000000, 'y') <> ''", QueryRefused, "lpad"),
    ("SELECT * FROM unnest(generate_series(1, 300000000))", QueryRefused, "generate_series"),
    ("SELECT printf('%0300000000d', 1)", QueryRefused, "printf"),
    ("SELECT equi_width_bins(0, 1, 300000000, false)", QueryRefused, "equi_width_bins"),
    ("SELECT sleep_ms(100000000)", QueryRefused, "sleep_ms"),
    ("SELECT * FROM events AT (VERSION => 1)", QueryRefused, "time travel"),
    ("SELECT * FROM (PIVOT events ON type IN ('reward') USING count(*))", QueryRefused, "pivot"),
    ("SHOW ALL TABLES", QueryRefused, "SHOW"),
    ("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a", QueryRefused, "unknown relation 'b'"),
    ("SELECT (WITH x AS (SELECT 1) SELECT 1), * FROM x", QueryRefused, "unknown relation 'x'"),
    ("   ", QueryRefused, "empty"),
    ("SELEC 1", QueryRefused, "syntax"),
])
def test_the_check_refuses_with_a_message(acme, sql, error, match):
    with pytest.raises(error, match=match) as caught:
        check_tenant_select(acme._con, sql, relations=acme.relations)
    assert caught.value.hint


@pytest.mark.parametrize("sql", [
    "SELECT * FROM rollouts",
    "FROM events SELECT type",
    "WITH mine AS (SELECT * FROM events) SELECT count(*) FROM mine JOIN rewards USING (event_id)",
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT * FROM n",
    "SELECT * FROM range(3), generate_series(1, 2)",
    "SELECT unnest([1, 2])",
    "SELECT * FROM unnest([1, 2])",
    "DESCRIBE llm_calls",
    "SUMMARIZE rollouts",
    "VALUES (1), (2)",
    "SELECT * FROM Rollouts",
])
def test_the_check_lets_ordinary_selects_through(acme, sql):
    check_tenant_select(acme._con, sql, relations=acme.relations)
    acme.query(sql, limit=5)


def test_a_query_text_must_be_a_string_under_the_length_limit(acme):
    with pytest.raises(QueryRefused, match="must be text"):
        acme.query(b"SELECT 1", limit=1)  # type: ignore[arg-type]
    with pytest.raises(QueryRefused, match="limit is 20,000"):
        acme.query("SELECT 1" + " " * 100_000, limit=1)


def test_long_queries_are_interrupted_at_the_limit_and_the_sandbox_recovers(acme):
    with pytest.raises(QueryTimeout, match="2 s"):
        acme.query("SELECT count(*) FROM range(1000000000000)", limit=1)
    with pytest.raises(QueryTimeout):
        acme.query("SELECT count(*) FROM " + ", ".join(f"events e{i}" for i in range(12)), limit=1)  # 14^12 rows
    with pytest.raises(QueryTimeout):
        acme.execute("SELECT count(*) FROM range(1000000000000)")
    assert acme.query("SELECT 42 AS x", limit=1).table.to_pylist() == [{"x": 42}]


def test_memory_hungry_queries_stop_at_the_memory_limit(two_tenants):
    with open_tenant_sandbox(take_snapshot(two_tenants), "acme",
                             limits=SandboxLimits(timeout_s=30, memory_limit="64MB")) as box:
        with pytest.raises(QueryError, match="memory"):
            box.query("SELECT list(range) FROM range(50000000)", limit=1)


def test_pages_skip_offset_keep_limit_and_say_whether_more_follow(acme):
    query = "SELECT range AS n FROM range(25) ORDER BY n"
    page = acme.query(query, limit=10, offset=10)
    assert page.table["n"].to_pylist() == list(range(10, 20)) and page.more and page.offset == 10
    page = acme.query(query, limit=10, offset=20)
    assert page.table["n"].to_pylist() == list(range(20, 25)) and not page.more
    assert acme.query(query, limit=10, offset=99).table.num_rows == 0
    with pytest.raises(ValueError):
        acme.query(query, limit=-1)


def test_a_tenant_name_with_a_quote_is_just_a_value(two_tenants):
    with open_tenant_sandbox(take_snapshot(two_tenants), "o'brien") as box:
        rows = box.query("SELECT DISTINCT tenant, rollout_id FROM rollouts", limit=5).table.to_pylist()
    assert rows == [{"tenant": "o'brien", "rollout_id": "r5"}]
    with pytest.raises(ValueError):
        open_tenant_sandbox(take_snapshot(two_tenants), "")


def test_an_unknown_tenant_sees_empty_views(two_tenants):
    with open_tenant_sandbox(take_snapshot(two_tenants), "nobody") as box:
        assert box.query("SELECT count(*) AS n FROM events", limit=1).table.to_pylist() == [{"n": 0}]


def test_a_young_lake_has_every_view_empty(lake):
    with open_tenant_sandbox(take_snapshot(lake), "acme") as box:
        assert box.relations == frozenset(TENANT_TABLES) | frozenset(JOINED_VIEWS)
        assert box.query("SELECT count(*) AS n FROM rollouts", limit=1).table.to_pylist() == [{"n": 0}]


def test_extra_tables_are_filtered_too_and_must_carry_a_tenant_column(two_tenants):
    rows = pa.table({"tenant": ["acme", "beta"], "secret": ["mine", "theirs"]})
    two_tenants.append("datasets/mixed", rows)
    write_deltalake(two_tenants.uri("scores"), pa.table({"secret": ["anyone's"]}))
    extra = {"datasets__mixed": delta_dataset(two_tenants, "datasets/mixed")}
    with open_tenant_sandbox(take_snapshot(two_tenants), "acme", extra=extra) as box:
        assert box.query("SELECT secret FROM datasets__mixed", limit=5).table.to_pylist() == [{"secret": "mine"}]
    with pytest.raises(ValueError, match="no 'tenant' column"):
        delta_dataset(two_tenants, "scores")
    with pytest.raises(ValueError, match="no 'tenant' column"):
        open_tenant_sandbox(take_snapshot(two_tenants), "acme", extra={"scores": pa.table({"x": [1]})})


def test_describe_lists_columns_of_the_tenants_relations_only(acme):
    views = acme.describe()
    assert set(views) == acme.relations and all(views.values())
    assert ("rollout_id", "VARCHAR") in views["rollouts"] and ("token_ids", "INTEGER[]") in views["events"]


def test_the_snapshot_cache_reuses_a_fresh_snapshot_and_retakes_a_stale_one(two_tenants):
    cached = SnapshotCache(two_tenants, ttl_s=3600)
    assert cached.get() is cached.get()
    stale = SnapshotCache(two_tenants, ttl_s=0)
    before = stale.get()
    write_events(two_tenants, sample_rollout("r3", tenant="acme"))
    after = stale.get()
    assert after is not before and after.versions["events"] == before.versions["events"] + 1
    with open_tenant_sandbox(after, "acme") as box:
        assert box.query("SELECT count(*) AS n FROM rollouts", limit=1).table.to_pylist() == [{"n": 3}]


def test_a_page_past_the_byte_limit_is_cut_short_and_a_row_past_it_refused(two_tenants):
    wide = "SELECT range AS n, '" + "x" * 1000 + "' AS s FROM range(100) ORDER BY n"
    with open_tenant_sandbox(take_snapshot(two_tenants), "acme",
                             limits=SandboxLimits(max_result_bytes=10_000)) as box:
        page = box.query(wide, limit=50)
        assert 0 < page.table.num_rows < 10 and page.more and page.table.nbytes <= 10_000
        assert box.query(wide, limit=50, offset=page.table.num_rows).table["n"][0].as_py() == page.table.num_rows
        with pytest.raises(QueryError, match="one row of the result is"):
            box.query("SELECT '" + "y" * 15_000 + "' AS s", limit=5)
        with pytest.raises(QueryError, match="one row of the result is"):
            box.query("SELECT n, '" + "y" * 15_000 + "' AS s FROM range(3) t(n)", limit=5)


def test_every_catalogue_function_is_either_allowed_or_refused_by_name():
    """A DuckDB upgrade that adds, renames or drops a function fails here: review it in store/tenant_functions.py."""
    con = duckdb.connect(config={"enable_external_access": "false", "autoload_known_extensions": "false",
                                 "autoinstall_known_extensions": "false"})
    catalogue = {name for (name,) in con.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type IN ('scalar', 'aggregate', 'macro')"
    ).fetchall()}
    assert not ALLOWED_FUNCTIONS & REFUSED_FUNCTIONS
    assert catalogue - ALLOWED_FUNCTIONS - REFUSED_FUNCTIONS == set(), "new functions: allow or refuse each"
    assert (ALLOWED_FUNCTIONS | REFUSED_FUNCTIONS) - catalogue == set(), "functions gone from DuckDB: drop them"
    tables = {name for (name,) in con.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type IN ('table', 'table_macro')"
    ).fetchall()}
    assert PURE_TABLE_FUNCTIONS <= tables


@pytest.mark.parametrize("sql", [
    "SELECT version()", "SELECT current_setting('threads')", "SELECT sleep_ms(1)", "SELECT repeat('x', 3)",
    "SELECT json_serialize_sql('SELECT 1')", "SELECT pg_get_viewdef('rollouts')", "SELECT write_log('x')",
    "SELECT nextval('s')", "SELECT some_function_duckdb_adds_later(1)",
    "SELECT sum(x) OVER () FROM (SELECT sleep_ms(1) x)",
])
def test_functions_off_the_allow_list_are_refused(acme, sql):
    with pytest.raises(QueryRefused, match=r"function .*\(\) is not available here"):
        acme.query(sql, limit=1)


def test_common_sql_passes_the_allow_list(acme):
    sql = ("SELECT rollout_id, count(*) AS n, sum(count(*)) OVER () AS s, "
           "row_number() OVER (ORDER BY rollout_id) AS rn, "
           "lower(rollout_id) LIKE 'r%' AS r, list_sum([1, 2]) AS l, coalesce(max(ts), now()) IS NOT NULL AS t "
           "FROM events GROUP BY rollout_id ORDER BY rollout_id")
    assert [r["rollout_id"] for r in acme.query(sql, limit=10).table.to_pylist()] == ["r1", "r2"]


def test_files_rewritten_with_string_view_are_filtered_and_queried_like_the_rest(two_tenants):
    """A forget's DELETE rewrites files with string_view columns: the tenant filter and pushed-down filters hold."""
    from store.forget import ForgetRequest, forget

    forget(two_tenants, ForgetRequest(tenant="beta", rollouts=("r9",)))
    queries = {
        "SELECT tenant, count(*) AS n FROM events GROUP BY ALL": {"acme": [("acme", 14)], "beta": [("beta", 11)]},
        "SELECT count(*) AS n FROM events WHERE rollout_id IN ('r1', 'r2', 'r9')": {"acme": [(14,)], "beta": [(11,)]},
        "SELECT count(*) AS n FROM llm_calls WHERE rollout_id = 'r1'": {"acme": [(2,)], "beta": [(2,)]},
        "SELECT rollout_id, status FROM rollouts ORDER BY ALL": {"acme": [("r1", "succeeded"), ("r2", "running")],
                                                                "beta": [("r1", "succeeded")]},
    }
    snapshot = take_snapshot(two_tenants)
    for tenant in ("acme", "beta"):
        with open_tenant_sandbox(snapshot, tenant) as box:
            for sql, expected in queries.items():
                rows = [tuple(r.values()) for r in box.query(sql, limit=10).table.to_pylist()]
                assert rows == expected[tenant], (tenant, sql)
