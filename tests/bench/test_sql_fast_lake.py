"""bench/sql/fast_lake.py: a lake drawn straight into columns answers like a workload lake, duplicates included."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.sql.fast_lake import FastLakeConfig, write_lake
from bench.sql.questions import questions
from devkit.workload import WorkloadConfig, generate_rollouts
from store.lake import Lake
from store.sql import connect

ROLLOUTS = 96


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A small fast lake whose rare irregularities are made common, so each shows up."""
    config = FastLakeConfig.for_rollouts(ROLLOUTS, per_commit=16)
    workload = config.workload.model_copy(update={"duplicate_send_rate": 0.2})
    config = FastLakeConfig(workload, per_commit=16, kept_resend_rate=1.0, keyed_error_rate=0.1)
    root = tmp_path_factory.mktemp("fast") / "lake"
    return root, write_lake(str(root), config, rollouts=ROLLOUTS, workers=0)


@pytest.fixture(scope="module")
def con(drawn: tuple[Path, dict[str, int]]):
    connection = connect(Lake(str(drawn[0])))
    yield connection
    connection.close()


def rows(con, sql: str) -> list[dict]:
    return con.execute(sql).to_arrow_table().to_pylist()


def one(con, sql: str):
    return next(iter(rows(con, sql)[0].values()))


def test_every_rollout_commits_in_batches_and_every_call_has_its_request_and_response(con, drawn) -> None:
    totals = drawn[1]
    assert totals["commits"] == 6
    assert one(con, "SELECT count(*) FROM rollouts") == ROLLOUTS
    assert one(con, "SELECT count(*) FROM rollouts WHERE status = 'running'") == 0
    calls = one(con, "SELECT count(*) FROM llm_calls")
    assert calls == totals["llm_calls"] == one(con, "SELECT sum(n_llm_calls) FROM rollouts")
    assert one(con, "SELECT count(*) FROM llm_calls WHERE NOT has_response OR error IS NOT NULL") == 0
    assert one(con, "SELECT count(*) FROM tool_steps WHERE NOT has_result") == 0


@pytest.mark.parametrize("table, view", [("llm_requests", "llm_calls"), ("llm_responses", "llm_calls"),
                                         ("tool_calls", "tool_steps"), ("tool_results", "tool_steps")])
def test_duplicated_keys_left_in_the_raw_tables_collapse_in_the_views(con, table: str, view: str) -> None:
    keys = "tenant, rollout_id, call_id"
    assert one(con, f"SELECT count(*) FROM (SELECT {keys} FROM {table} GROUP BY ALL HAVING count(*) > 1)") > 0
    assert one(con, f"SELECT count(*) FROM (SELECT {keys} FROM {view} GROUP BY ALL HAVING count(*) > 1)") == 0


def test_a_call_answered_by_an_error_then_a_success_keeps_the_success(con) -> None:
    retried = rows(con, "SELECT c.upstream_retries, c.error, c.n_response_tokens FROM llm_calls c SEMI JOIN "
                        "(SELECT tenant, rollout_id, call_id FROM llm_responses WHERE error IS NOT NULL) "
                        "USING (tenant, rollout_id, call_id)")
    assert retried and all(r["upstream_retries"] == 1 and r["error"] is None for r in retried)


def test_a_prompt_extends_the_previous_prompt_and_response_of_its_context(con) -> None:
    """Full prompts, as the contract has them: most calls continue the one before in the same span."""
    pairs = rows(con, """
        WITH c AS (SELECT rollout_id, span_id, seq, prompt_token_ids AS p, response_token_ids AS r,
                          lag(prompt_token_ids) OVER w AS prev_p, lag(response_token_ids) OVER w AS prev_r
                   FROM llm_calls WINDOW w AS (PARTITION BY rollout_id, span_id ORDER BY seq))
        SELECT count(*) AS n, count(*) FILTER (WHERE p[1:len(prev_p) + len(prev_r)] = list_concat(prev_p, prev_r)) AS ext
        FROM c WHERE prev_p IS NOT NULL AND p IS NOT NULL AND prev_r IS NOT NULL""")[0]
    assert pairs["ext"] > 0.6 * pairs["n"]
    assert one(con, "SELECT count(*) FROM llm_calls WHERE response_token_ids[-1] != 2") == 0


def test_views_and_hand_written_raw_sql_give_the_same_rows(con) -> None:
    rollout_id = one(con, "SELECT rollout_id FROM rollout_starts ORDER BY rollout_id LIMIT 1")
    for q in questions(rollout_id):
        view, raw = rows(con, q.view), rows(con, q.raw)
        assert view and sorted(view, key=repr) == sorted(raw, key=repr), q.name


def test_the_same_kinds_of_rows_and_shape_as_the_workload_generator(con) -> None:
    """Statuses, finish reasons, token sources, tools, harness versions and mean sizes as devkit.workload draws them."""
    workload = WorkloadConfig(tasks=8, rollouts_per_task=8, max_context_tokens=512)
    events = [e for r in generate_rollouts(workload) for e in r.events]
    requests = {e["payload"]["call_id"]: e for e in events if e["type"] == "llm.request"}
    responses = [e["payload"] for e in events if e["type"] == "llm.response"]
    expected = {
        "status": {e["payload"]["status"] for e in events if e["type"] == "rollout.finished"},
        "finish_reason": {p["finish_reason"] for p in responses},
        "token_source": {p["token_source"] for p in responses},
        "name": {e["payload"]["name"] for e in events if e["type"] == "tool.call"},
        "harness_version": {e["harness"]["version"] for e in events},
    }
    for column, kinds in expected.items():
        view = "rollouts" if column in ("status", "harness_version") else "tool_steps" if column == "name" else "llm_calls"
        assert {r[column] for r in rows(con, f"SELECT DISTINCT {column} FROM {view}")} == kinds, column
    prompt = statistics.mean(len(e["payload"]["prompt_token_ids"]) for e in requests.values()
                             if e["payload"]["prompt_token_ids"])
    calls_per_rollout = len(requests) / workload.rollouts
    fast = rows(con, "SELECT avg(n_prompt_tokens) AS prompt, count(*) / count(DISTINCT rollout_id) AS calls "
                     "FROM llm_calls")[0]
    assert fast["prompt"] == pytest.approx(prompt, rel=0.25)
    assert fast["calls"] == pytest.approx(calls_per_rollout, rel=0.25)


def test_a_commit_is_drawn_the_same_way_every_time(tmp_path: Path) -> None:
    config = FastLakeConfig.for_rollouts(8, per_commit=4)
    first = write_lake(str(tmp_path / "a"), config, rollouts=8, workers=0)
    again = write_lake(str(tmp_path / "b"), config, rollouts=8, workers=0)
    assert first == again
    ids = [Lake(str(tmp_path / d)).read("llm_requests", columns=["event_id"]).column(0).to_pylist() for d in "ab"]
    assert ids[0] == ids[1]
