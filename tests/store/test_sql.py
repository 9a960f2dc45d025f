"""SQL over real Delta lakes: base views, joined views, the read-only query API, exports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from tests.store.lake_builder import event, sample_rollout, write_events

from schemas.tables import INGESTED_TABLES, LOGPROBS, TOKENS
from store.lake import Lake
from store.sql import (
    JOINED_VIEWS,
    LakeMissing,
    QueryError,
    WriteRefused,
    connect,
    describe_views,
    discover_tables,
    export,
    run_query,
    run_read_only,
    view_name,
)

BIG_ID = 2**31 - 1


def rows(lake: Lake, sql: str) -> list[dict]:
    return run_query(lake, sql).to_pylist()


def request(call_id: str, seq: int, ids: list[int], **k) -> object:
    return event("llm.request", {"call_id": call_id, "model": "m", "prompt_token_ids": ids}, seq=seq, **k)


def response(call_id: str, seq: int, ids: list[int], logprobs: list[float], **k) -> object:
    payload = {"call_id": call_id, "response_token_ids": ids, "logprobs": logprobs, "token_source": "engine",
               "finish_reason": "stop", "latency_ms": 10.0}
    return event("llm.response", payload, seq=seq, **k)


@pytest.fixture
def empty_lake(lake: Lake) -> Lake:
    Path(lake.root).mkdir(parents=True)
    return lake


# ------------------------------------------------------------------ young lakes


def test_every_known_view_answers_on_an_empty_lake(empty_lake):
    for name in [*INGESTED_TABLES, *JOINED_VIEWS]:
        assert rows(empty_lake, f"SELECT * FROM {name}") == []
    calls = run_query(empty_lake, "SELECT prompt_token_ids, logprobs FROM llm_calls")
    assert calls.schema.field("prompt_token_ids").type == TOKENS
    assert calls.schema.field("logprobs").type == LOGPROBS


def test_joined_views_work_when_only_events_were_written(lake):
    write_events(lake, sample_rollout(), tables={"events"})
    assert rows(lake, "SELECT count(*) AS n FROM events") == [{"n": 11}]
    assert rows(lake, "SELECT count(*) AS n FROM rollouts") == [{"n": 0}]
    assert rows(lake, "SELECT count(*) AS n FROM llm_calls") == [{"n": 0}]


def test_a_missing_lake_root_is_a_clear_error(tmp_path):
    with pytest.raises(LakeMissing, match="no lake at .*TRAJLAKE_LAKE"):
        run_query(Lake(str(tmp_path / "nowhere")), "SELECT 1")


# ------------------------------------------------------------------ llm_calls


def test_token_ids_and_logprobs_come_back_exact(lake):
    ids, logprobs = [0, 7, BIG_ID, 151643], [-0.0, -1.5, -23.125, -1e-7]
    write_events(lake, [request("c1", 1, [5, BIG_ID, 0]), response("c1", 2, ids, logprobs)])
    table = run_query(lake, "SELECT prompt_token_ids, response_token_ids, logprobs, n_prompt_tokens, "
                            "n_response_tokens FROM llm_calls")
    assert table.schema.field("response_token_ids").type == TOKENS
    assert table.schema.field("logprobs").type == LOGPROBS
    row = table.to_pylist()[0]
    assert row["prompt_token_ids"] == [5, BIG_ID, 0]
    assert row["response_token_ids"] == ids
    assert row["logprobs"] == pa.array(logprobs, pa.float32()).to_pylist()
    assert (row["n_prompt_tokens"], row["n_response_tokens"]) == (3, 4)


def test_a_late_response_joins_when_it_lands(lake):
    write_events(lake, [request("c1", 1, [1, 2])])
    [pending] = rows(lake, "SELECT has_response, response_token_ids, finish_reason, latency_ms FROM llm_calls")
    assert pending == {"has_response": False, "response_token_ids": None, "finish_reason": None, "latency_ms": None}
    write_events(lake, [response("c1", 2, [3], [-0.5])])
    [done] = rows(lake, "SELECT has_response, response_token_ids, finish_reason, response_seq FROM llm_calls")
    assert done == {"has_response": True, "response_token_ids": [3], "finish_reason": "stop", "response_seq": 2}


def test_a_response_without_request_is_not_a_call(lake):
    write_events(lake, [response("orphan", 2, [3], [-0.5]), request("c1", 3, [1])])
    assert [r["call_id"] for r in rows(lake, "SELECT call_id FROM llm_calls")] == ["c1"]


def test_a_duplicated_call_id_keeps_the_first_request_and_response_by_seq(lake):
    write_events(lake, [request("c1", 5, [9, 9]), response("c1", 6, [8], [-2.0])])
    write_events(lake, [request("c1", 1, [1, 2]), response("c1", 2, [3], [-0.5])])
    [row] = rows(lake, "SELECT seq, prompt_token_ids, response_token_ids, response_seq FROM llm_calls")
    assert row == {"seq": 1, "prompt_token_ids": [1, 2], "response_token_ids": [3], "response_seq": 2}


def test_a_copy_with_the_same_event_id_is_one_call(lake):
    """A producer retry past the ingester's bounded dedupe window lands twice with one event id: one call."""
    copies = [request("c1", 1, [1, 2]), response("c1", 2, [3], [-0.5])]
    write_events(lake, copies)
    write_events(lake, copies)
    got = rows(lake, "SELECT call_id, prompt_token_ids, response_token_ids FROM llm_calls")
    assert got == [{"call_id": "c1", "prompt_token_ids": [1, 2], "response_token_ids": [3]}]


def test_a_keyed_retry_answered_twice_prefers_the_successful_response(lake):
    failed = event("llm.response", {"call_id": "c1", "error": "upstream 503", "token_source": "none"}, seq=2)
    write_events(lake, [request("c1", 1, [1, 2]), failed, response("c1", 3, [7], [-0.1])])
    [row] = rows(lake, "SELECT error, response_token_ids, response_seq FROM llm_calls")
    assert row == {"error": None, "response_token_ids": [7], "response_seq": 3}


def test_calls_never_join_across_tenants_or_rollouts(lake):
    write_events(lake, [
        request("c1", 1, [1], tenant="a"), response("c1", 2, [2], [-1.0], tenant="a"),
        request("c1", 1, [1], tenant="b"),
        request("c1", 1, [1], tenant="a", rollout_id="other"),
    ])
    got = rows(lake, "SELECT tenant, rollout_id, has_response FROM llm_calls ORDER BY ALL")
    assert got == [
        {"tenant": "a", "rollout_id": "other", "has_response": False},
        {"tenant": "a", "rollout_id": "r1", "has_response": True},
        {"tenant": "b", "rollout_id": "r1", "has_response": False},
    ]


# ------------------------------------------------------------------ tool_steps


def test_tool_steps_join_results_and_keep_calls_without_one(lake):
    write_events(lake, [
        event("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": "ls"}}, seq=1),
        event("tool.result", {"call_id": "t1", "name": "bash", "result": {"files": 2}, "error": "exit 1",
                              "duration_ms": 12.5, "state_changed": True}, seq=2),
        event("tool.call", {"call_id": "t2", "name": "edit"}, seq=3),
    ])
    got = rows(lake, "SELECT call_id, arguments, result, error, duration_ms, state_changed, has_result "
                     "FROM tool_steps ORDER BY seq")
    assert got == [
        {"call_id": "t1", "arguments": '{"cmd":"ls"}', "result": '{"files":2}', "error": "exit 1",
         "duration_ms": 12.5, "state_changed": True, "has_result": True},
        {"call_id": "t2", "arguments": None, "result": None, "error": None, "duration_ms": None,
         "state_changed": None, "has_result": False},
    ]


# ------------------------------------------------------------------ rollouts


def test_a_finished_rollout_sums_tokens_and_takes_the_latest_reward_per_name(lake):
    write_events(lake, sample_rollout())
    [r] = rows(lake, "SELECT * FROM rollouts")
    assert (r["status"], r["reason"], r["steps"], r["group_id"], r["policy_version"]) == (
        "succeeded", "tests pass", 2, "t1", "p7")
    assert (r["n_llm_calls"], r["n_tool_calls"], r["n_prompt_tokens"], r["n_response_tokens"]) == (2, 1, 9, 5)
    assert (r["harness_name"], r["harness_version"], r["harness_config_hash"]) == ("swe-agent", "1.2", "abc123")
    assert r["llm_latency_ms"] == 200.0
    assert r["reward"] == 1.5  # pass: 1.0 (re-scored from 0.0) + format: 0.5
    assert r["n_rewards"] == 3
    assert [(x["name"], x["value"]) for x in r["rewards"]] == [("format", 0.5), ("pass", 1.0)]
    assert r["finished_at"] > r["started_at"]


def test_a_rollout_shows_up_running_before_start_or_finish_land(lake):
    write_events(lake, [event("reward", {"name": "pass", "value": 1.0}, seq=9, task_id="t9", rollout_id="early")])
    [r] = rows(lake, "SELECT rollout_id, task_id, group_id, status, started_at, n_llm_calls, reward FROM rollouts")
    assert r == {"rollout_id": "early", "task_id": "t9", "group_id": "t9", "status": "running",
                 "started_at": None, "n_llm_calls": 0, "reward": 1.0}


def test_rollouts_are_per_tenant(lake):
    write_events(lake, sample_rollout(tenant="a") + sample_rollout(tenant="b")[:3])
    got = rows(lake, "SELECT tenant, status, n_llm_calls FROM rollouts ORDER BY tenant")
    assert got == [{"tenant": "a", "status": "succeeded", "n_llm_calls": 2},
                   {"tenant": "b", "status": "running", "n_llm_calls": 1}]


# ------------------------------------------------------------------ discovery


def test_every_delta_table_under_the_root_becomes_a_view(lake):
    write_events(lake, sample_rollout(), tables={"events"})
    for table in ("dataset_versions", "datasets/gsm8k-v2", "datasets/nightly", "rollouts", "_spool/x", ".hidden/y"):
        write_deltalake(lake.uri(table), pa.table({"x": [1, 2]}))  # tables of other tools, too
    (Path(lake.root) / "not_a_table").mkdir()
    assert discover_tables(lake) == {
        "dataset_versions": "dataset_versions",
        "datasets__gsm8k_v2": "datasets/gsm8k-v2",
        "datasets__nightly": "datasets/nightly",
        "events": "events",
        "rollouts__table": "rollouts",
    }
    assert rows(lake, "SELECT sum(x) AS s FROM datasets__gsm8k_v2") == [{"s": 3}]
    assert rows(lake, "SELECT count(*) AS n FROM rollouts__table") == [{"n": 2}]
    assert "status" in run_query(lake, "SELECT * FROM rollouts").column_names  # the joined view keeps its name


def test_view_names_are_sql_identifiers():
    assert view_name("datasets/gsm8k-v2.1") == "datasets__gsm8k_v2_1"
    assert view_name("llm_calls") == "llm_calls__table"


def test_connect_can_expose_only_some_tables(lake):
    write_events(lake, sample_rollout())
    lake.append("checkpoints", pa.table({"checkpoint_id": ["ck1"]}))
    con = connect(lake, tables=["checkpoints", "rollout_starts", "runs"])
    assert con.execute("SELECT checkpoint_id FROM checkpoints").fetchall() == [("ck1",)]
    assert con.execute("SELECT count(*) FROM rollout_starts").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM llm_requests").fetchall() == [(0,)]  # not exposed: empty view
    con.close()


def test_describe_views_reports_kinds_rows_and_versions(lake):
    write_events(lake, sample_rollout())
    write_events(lake, sample_rollout("r2"), tables={"rollout_starts"})
    info = {v.name: v for v in describe_views(lake)}
    assert (info["rollout_starts"].kind, info["rollout_starts"].rows, info["rollout_starts"].version) == ("delta", 2, 1)
    assert (info["rollouts"].kind, info["rollouts"].rows, info["rollouts"].version) == ("joined", 2, None)
    assert (info["quarantine"].kind, info["quarantine"].rows) == ("empty", 0)
    assert info["events"].table == "events"


# ------------------------------------------------------------------ read-only query API


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1) TO 'x.csv'",
    "COPY llm_calls TO 'x.parquet' (FORMAT parquet)",
    "CREATE TABLE t AS SELECT 1",
    "INSERT INTO events SELECT * FROM events",
    "DELETE FROM events",
    "ATTACH 'other.db' AS o",
    "SET enable_external_access = true",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CALL duckdb_tables()",
])
def test_anything_but_select_is_refused(empty_lake, sql):
    with pytest.raises(WriteRefused, match="not allowed.*read-only"):
        run_query(empty_lake, sql)
    assert sorted(p.name for p in Path(empty_lake.root).iterdir()) == []


@pytest.mark.parametrize(("sql", "named"), [("INSTALL httpfs", "INSTALL"), ("  load httpfs", "LOAD"),
                                             ("DELETE FROM events", "DELETE")])
def test_a_refused_statement_is_named_as_written(empty_lake, sql, named):
    with pytest.raises(WriteRefused, match=f"^{named} statements are not allowed"):
        run_query(empty_lake, sql)


def test_a_select_cannot_read_or_write_files_outside_the_lake(empty_lake, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(QueryError, match="(?s)Permission.*hint: queries read the lake"):
        run_query(empty_lake, f"SELECT * FROM read_csv('{secret}')")
    with pytest.raises(QueryError, match="Expected a single SELECT"):
        run_query(empty_lake, f"SELECT * FROM query('COPY (SELECT 1) TO ''{tmp_path / 'x.csv'}''')")


@pytest.mark.parametrize("sql, message", [
    ("", "empty query"),
    ("   \n ", "empty query"),
    ("SELECT 1; SELECT 2", "got 2 statements"),
    ("SELEC * FROM events", "syntax error"),
    ("SELECT * FROM events WHERE", "syntax error"),
    ("SELECT '\x00' FROM", "Parser Error"),
    ("SELECT nope FROM rollouts", "(?s)nope.*DESCRIBE"),
])
def test_malformed_queries_explain_themselves(empty_lake, sql, message):
    with pytest.raises(QueryError, match=message):
        run_query(empty_lake, sql)


def test_an_unknown_table_lists_the_views(empty_lake):
    with pytest.raises(QueryError) as e:
        run_query(empty_lake, "SELECT * FROM llm_call")
    assert "llm_call" in e.value.message
    assert all(name in e.value.hint for name in ("llm_calls", "rollouts", "tool_steps", "events"))


def test_oversized_queries_run_or_fail_cleanly(empty_lake):
    wide = "SELECT count(*) AS n FROM range(10) WHERE range IN (" + ", ".join(map(str, range(20_000))) + ")"
    assert rows(empty_lake, wide) == [{"n": 10}]
    assert rows(empty_lake, "SELECT length('" + "x" * 1_000_000 + "') AS n") == [{"n": 1_000_000}]
    with pytest.raises(QueryError, match="expression depth"):
        run_query(empty_lake, "SELECT " + " + ".join(["1"] * 5_000))


def test_max_rows_stops_early_and_rejects_negatives(empty_lake):
    assert run_query(empty_lake, "SELECT * FROM range(1000000)", max_rows=7).num_rows == 7
    assert run_query(empty_lake, "SELECT * FROM range(10)", max_rows=0).num_rows == 0
    assert run_query(empty_lake, "SELECT * FROM range(10)").num_rows == 10
    with pytest.raises(ValueError, match="max_rows"):
        run_query(empty_lake, "SELECT 1", max_rows=-1)


def test_a_sandboxed_connection_serves_many_queries_and_stays_locked(lake):
    write_events(lake, sample_rollout())
    con = connect(lake, sandbox=True)
    for _ in range(3):
        assert run_read_only(con, "SELECT count(*) AS n FROM llm_calls").to_pylist() == [{"n": 2}]
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    con.close()


def test_python_variables_are_invisible_to_sql(empty_lake):
    secret_table = pa.table({"x": [1]})  # noqa: F841 - a replacement scan would find this local
    with pytest.raises(QueryError, match="secret_table"):
        run_query(empty_lake, "SELECT * FROM secret_table")


# ------------------------------------------------------------------ exports


@pytest.fixture
def calls(lake: Lake) -> pa.Table:
    write_events(lake, sample_rollout())
    return run_query(lake, "SELECT call_id, prompt_token_ids, logprobs, latency_ms, requested_at, error "
                           "FROM llm_calls ORDER BY seq")


def test_parquet_export_keeps_exact_types(calls, tmp_path):
    export(calls, tmp_path / "out.parquet", format="parquet")
    back = pq.read_table(tmp_path / "out.parquet")
    assert back.schema.field("prompt_token_ids").type == TOKENS
    assert back.to_pylist() == calls.to_pylist()


def test_csv_export_writes_lists_and_utc_timestamps(calls, tmp_path):
    export(calls, tmp_path / "out.csv", format="csv")
    with (tmp_path / "out.csv").open() as f:
        got = list(csv.DictReader(f))
    assert [r["call_id"] for r in got] == ["c1", "c2"]
    assert json.loads(got[1]["prompt_token_ids"]) == [1, 2, 3, 4, 5, 6]
    assert json.loads(got[0]["logprobs"]) == [-0.5, -0.25]
    assert got[0]["requested_at"] == "2026-01-01T00:00:01.000000Z"
    assert got[0]["error"] == ""


def test_json_export_writes_one_object_per_line(calls, tmp_path):
    export(calls, tmp_path / "out.json", format="json")
    got = [json.loads(line) for line in (tmp_path / "out.json").read_text().splitlines()]
    assert got[1]["prompt_token_ids"] == [1, 2, 3, 4, 5, 6]
    assert got[1]["logprobs"] == [-1.0, -0.5, -0.125]
    assert got[0]["requested_at"] == "2026-01-01T00:00:01.000000Z"
    assert got[0]["error"] is None


def test_export_refuses_unknown_formats(calls, tmp_path):
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        export(calls, tmp_path / "out.xml", format="xml")


def test_the_catalogue_lists_the_joined_views_of_views_sql_in_order():
    """``JOINED_VIEWS`` is read from views.sql (no Arrow schemas at import); the catalogue names the same views."""
    from schemas.tables import VIEWS

    assert JOINED_VIEWS == tuple(VIEWS)


def test_the_light_list_of_ingested_tables_is_the_catalogues():
    from schemas.table_names import INGESTED_TABLE_NAMES

    assert sorted(INGESTED_TABLE_NAMES) == sorted(INGESTED_TABLES)
