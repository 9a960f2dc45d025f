"""POST /v1/sql and GET /v1/sql/views over HTTP: isolation, hostile SQL, limits, paging, bad bodies."""

from __future__ import annotations

import json

import pytest
from tests.api.two_tenants import ACME, BETA, GAMMA, make_client


def sql(client, query: str, headers=ACME, **extra):
    return client.post("/v1/sql", json={"sql": query, **extra}, headers=headers)


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def refused(response, code: str = "query_refused") -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def test_a_query_returns_columns_rows_and_counts(client):
    body = ok(sql(client, "SELECT rollout_id, status, n_llm_calls FROM rollouts ORDER BY rollout_id"))
    assert body["columns"] == [{"name": "rollout_id", "type": "string"}, {"name": "status", "type": "string"},
                               {"name": "n_llm_calls", "type": "int64"}]
    assert body["rows"] == [["r1", "succeeded", 2], ["r2", "running", 1]]
    assert (body["row_count"], body["truncated"], body["next_offset"], body["offset"]) == (2, False, None, 0)


@pytest.mark.parametrize("view", ["events", "llm_requests", "llm_responses", "tool_calls", "tool_results", "rewards",
                                  "rollout_starts", "rollout_ends", "llm_calls", "tool_steps", "rollouts"])
def test_every_view_holds_only_the_callers_rows(client, view):
    for headers, tenant in ((ACME, "acme"), (BETA, "beta")):
        body = ok(sql(client, f"SELECT DISTINCT tenant FROM {view}", headers))
        assert body["rows"] == [[tenant]]


@pytest.mark.parametrize("query", [
    "SELECT count(*) FROM events WHERE tenant = 'beta'",
    "SELECT count(*) FROM events WHERE tenant <> 'acme' OR tenant IS NULL",
    "SELECT count(*) FROM (SELECT * FROM events WHERE tenant = 'beta') AS sub",
    "WITH other AS (SELECT * FROM rollouts WHERE tenant = 'beta') SELECT count(*) FROM other",
    "SELECT count(*) FROM (SELECT tenant FROM events UNION ALL SELECT tenant FROM rewards) WHERE tenant = 'beta'",
    "SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM rollouts r WHERE r.tenant = 'beta')",
    "SELECT count(*) FROM rollouts WHERE rollout_id = 'r9'",
    "SELECT count(*) FROM events, LATERAL (SELECT * FROM rewards WHERE rewards.tenant = 'beta')",
    "WITH RECURSIVE walk(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM walk WHERE n < 3) "
    "SELECT count(*) FROM walk, events WHERE events.tenant = 'beta'",
])
def test_other_tenants_rows_are_unreachable_through_any_shape_of_select(client, query):
    assert ok(sql(client, query))["rows"] == [[0]]


def test_a_rollout_id_both_tenants_use_shows_each_its_own(client):
    query = "SELECT tenant, count(*) FROM events WHERE rollout_id = 'r1' GROUP BY ALL"
    assert ok(sql(client, query, ACME))["rows"] == [["acme", 11]]
    assert ok(sql(client, query, BETA))["rows"] == [["beta", 11]]
    assert ok(sql(client, query, GAMMA))["rows"] == []


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_parquet('{lake}/events/*.parquet')",
    "SELECT * FROM parquet_scan('{lake}/events/*.parquet')",
    "SELECT * FROM '{lake}/events/*.parquet'",
    "SELECT * FROM delta_scan('{lake}/events')",
    "SELECT * FROM rollouts UNION ALL SELECT * FROM read_parquet('{lake}/rollout_ends/*.parquet')",
    "SELECT (SELECT count(*) FROM read_parquet('{lake}/events/*.parquet'))",
    "WITH x AS (SELECT * FROM read_parquet('{lake}/events/*.parquet')) SELECT count(*) FROM x",
    "COPY (SELECT * FROM events) TO '/tmp/stolen.csv'",
    "COPY events FROM '/etc/passwd'",
    "EXPORT DATABASE '/tmp/stolen'",
    "ATTACH '/tmp/other.duckdb' AS other",
    "DETACH memory",
    "INSTALL httpfs",
    "LOAD delta",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "CREATE TABLE t AS SELECT 1",
    "CREATE MACRO m() AS 1",
    "INSERT INTO events SELECT * FROM events",
    "DROP VIEW rollouts",
    "SELECT 1; SELECT 2",
    "SELECT * FROM events; DROP VIEW rollouts",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM duckdb_tables",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM system.main.events",
    "SELECT * FROM memory.main.events",
    "SELECT current_setting('allowed_directories')",
    "SELECT * FROM query_table('events')",
    "SELECT * FROM query('SELECT * FROM events')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT * FROM events AT (VERSION => 0)",
    "SHOW TABLES",
    "WITH a AS (SELECT * FROM duckdb_views) SELECT 1",
    "WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a",
    "",
])
def test_hostile_sql_is_refused(client, api_lake, query):
    error = refused(sql(client, query.format(lake=api_lake.root)) if query else
                    client.post("/v1/sql", json={"sql": " "}, headers=ACME))
    assert error["message"] and error["hint"]


def test_a_query_that_runs_forever_is_stopped_at_the_limit(client):
    error = refused(sql(client, "SELECT count(*) FROM range(1000000000000)"), "query_timeout")
    assert "2 s" in error["message"]
    cross = "SELECT count(*) FROM " + ", ".join(f"events e{i}" for i in range(12))  # 15^12 rows
    refused(sql(client, cross), "query_timeout")
    assert ok(sql(client, "SELECT 1 AS one"))["rows"] == [[1]]  # the service is fine afterwards


def test_a_100_kb_query_is_refused_before_parsing(client):
    response = sql(client, "SELECT 1 " + "-- pad\n" * 15_000)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "body_too_large"


def test_a_query_over_the_sql_length_limit_is_refused(client):
    error = refused(sql(client, "SELECT " + " + ".join(["1"] * 8_000)))
    assert "limit is 20,000" in error["message"]


def test_a_deeply_nested_query_is_refused_or_answered_never_crashes(client):
    response = sql(client, "SELECT " + "(" * 3000 + "1" + ")" * 3000)
    assert response.status_code in (200, 400)
    nested = "SELECT * FROM " + "(SELECT * FROM " * 400 + "events" + ") AS s" * 400
    assert sql(client, nested).status_code in (200, 400)


def test_pages_follow_limit_and_offset(client):
    query = "SELECT range AS n FROM range(10) ORDER BY n"
    first = ok(sql(client, query, limit=4))
    assert (first["rows"], first["truncated"], first["next_offset"]) == ([[0], [1], [2], [3]], True, 4)
    last = ok(sql(client, query, limit=4, offset=8))
    assert (last["rows"], last["truncated"], last["next_offset"]) == ([[8], [9]], False, None)
    assert ok(sql(client, query, limit=4, offset=50))["rows"] == []
    assert ok(sql(client, query, limit=0))["truncated"] is True


def test_the_row_cap_holds_whatever_the_request_asks(api_lake):
    for client in make_client(api_lake, default_page_rows=3, max_page_rows=5):
        query = "SELECT * FROM range(100)"
        assert (body := ok(sql(client, query)))["row_count"] == 3 and body["limit"] == 3
        body = ok(sql(client, query, limit=1_000_000))
        assert (body["row_count"], body["limit"], body["truncated"], body["next_offset"]) == (5, 5, True, 5)


def test_a_page_past_the_byte_limit_is_cut_short_with_a_next_offset(api_lake):
    for client in make_client(api_lake, max_result_bytes=20_000):
        body = ok(sql(client, "SELECT range AS n, '" + "x" * 1000 + "' AS s FROM range(100) ORDER BY n", limit=100))
        assert 0 < body["row_count"] < 100 and body["truncated"] and body["next_offset"] == body["row_count"]


def test_values_become_strict_json(client):
    query = """SELECT TIMESTAMPTZ '2026-01-01 00:00:01.5+00' AS ts, 'nan'::DOUBLE AS nan, 'inf'::DOUBLE AS inf,
               '\\x01\\x02'::BLOB AS blob, 1.25::DECIMAL(5, 2) AS dec, INTERVAL 90 SECOND AS iv,
               [1, 2] AS ids, {'a': 1} AS st, MAP {'k': 2} AS m, NULL AS nothing"""
    response = sql(client, query)
    row = ok(response)["rows"][0]
    assert json.loads(response.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert row[0].startswith("2026-01-01T00:00:01.5") and row[1] is None and row[2] is None
    assert row[3:] == ["AQI=", "1.25", {"months": 0, "days": 0, "seconds": 90.0}, [1, 2], {"a": 1}, [["k", 2]], None]


def test_token_columns_come_back_as_numbers(client):
    body = ok(sql(client, "SELECT prompt_token_ids, logprobs FROM llm_calls WHERE rollout_id = 'r1' ORDER BY seq"))
    assert body["rows"] == [[[1, 2, 3], [-0.5, -0.25]], [[1, 2, 3, 4, 5, 6], [-1.0, -0.5, -0.125]]]


def test_sql_errors_come_back_with_a_hint(client):
    error = refused(sql(client, "SELECT nope FROM rollouts"), "query_error")
    assert "nope" in error["message"] and "DESCRIBE" in error["hint"]
    refused(sql(client, "SELEC 1"))


def test_views_list_what_each_tenant_can_read(client):
    acme = {v["name"]: v["columns"] for v in ok(client.get("/v1/sql/views", headers=ACME))["views"]}
    beta = {v["name"] for v in ok(client.get("/v1/sql/views", headers=BETA))["views"]}
    assert {"events", "rollouts", "llm_calls", "tool_steps", "datasets__acme_only"} <= set(acme)
    assert "datasets__acme_only" not in beta and "datasets__beta_only" in beta
    assert not {"quarantine", "dataset_versions", "dataset_lineage", "checkpoints", "datasets__everyone"} & set(acme)
    assert {"name": "rollout_id", "type": "VARCHAR"} in acme["rollouts"]


def test_a_dataset_built_for_the_tenant_is_queryable_at_its_latest_version(client):
    body = ok(sql(client, "SELECT DISTINCT tenant, rollout_id FROM datasets__acme_only ORDER BY ALL"))
    assert body["rows"] == [["acme", "r1"]]
    refused(sql(client, "SELECT * FROM datasets__everyone"))
    refused(sql(client, "SELECT * FROM datasets__acme_only", BETA))


@pytest.mark.parametrize("body", [
    {"sql": 1},
    {"sql": None},
    {"sql": ["SELECT 1"]},
    {"sql": "SELECT 1", "limit": "10"},
    {"sql": "SELECT 1", "limit": -1},
    {"sql": "SELECT 1", "limit": 1.5},
    {"sql": "SELECT 1", "offset": -5},
    {"sql": "SELECT 1", "offset": 10**12},
    {"sql": "SELECT 1", "unexpected": True},
    {"limit": 10},
    {},
    ["SELECT 1"],
    "SELECT 1",
])
def test_malformed_bodies_are_422_with_what_is_wrong(client, body):
    response = client.post("/v1/sql", json=body, headers=ACME)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b'{"sql": "SELECT 1"'])
def test_broken_json_is_422(client, raw):
    response = client.post("/v1/sql", content=raw, headers={**ACME, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text


def test_a_chunked_body_past_the_limit_is_413(client):
    def chunks():
        yield b'{"sql": "SELECT 1 '
        for _ in range(100):
            yield b"-" * 1024
        yield b'"}'

    response = client.post("/v1/sql", content=chunks(), headers={**ACME, "Content-Type": "application/json"})
    assert response.status_code == 413, response.text


def test_queries_beyond_the_concurrency_limit_get_429(api_lake):
    for client in make_client(api_lake, max_concurrent_queries=1):
        with client.app.state.service.sandbox("acme"):  # holds the only slot
            response = sql(client, "SELECT 1")
        assert response.status_code == 429 and response.headers["Retry-After"] == "2"
        assert ok(sql(client, "SELECT 1 AS one"))["rows"] == [[1]]


def test_concurrent_requests_of_two_tenants_never_see_each_others_rows(api_lake):
    from concurrent.futures import ThreadPoolExecutor

    for client in make_client(api_lake, max_concurrent_queries=16):
        def tenant_seen(i: int) -> tuple[str, list]:
            headers, tenant = (ACME, "acme") if i % 2 else (BETA, "beta")
            return tenant, ok(sql(client, "SELECT DISTINCT tenant FROM events", headers))["rows"]

        with ThreadPoolExecutor(8) as pool:
            for tenant, rows in pool.map(tenant_seen, range(16)):
                assert rows == [[tenant]]
