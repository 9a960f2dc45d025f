"""The joined views' shapes: duplicates collapse the same way whatever a query filters or reads,
and questions that read no token lists never make DuckDB read them (store/views.sql)."""

from __future__ import annotations

import pytest
from tests.store.lake_builder import event, sample_rollout, write_events

from store.lake import Lake
from store.sql import connect, run_query


def rows(lake: Lake, sql: str) -> list[dict]:
    return run_query(lake, sql).to_pylist()


def messy_rollout(rollout_id: str) -> tuple[list, list]:
    """Two batches of one rollout with every kind of duplicate the views collapse."""
    k = {"rollout_id": rollout_id}
    start = event("rollout.started", {"policy_version": "p1"}, seq=0, **k)
    copy_of_request = event("llm.request", {"call_id": "c2", "model": "m", "prompt_token_ids": [5]}, seq=4, **k)
    first = [
        start,
        event("llm.request", {"call_id": "c1", "model": "m", "prompt_token_ids": [1, 2]}, seq=1, **k),
        event("llm.response", {"call_id": "c1", "error": "upstream 503", "token_source": "none"}, seq=2, **k),
        copy_of_request,
        event("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": "ls"}}, seq=6, **k),
        event("tool.result", {"call_id": "t1", "name": "bash", "error": "exit 1"}, seq=7, **k),
        event("rollout.finished", {"status": "failed", "reason": "first try"}, seq=10, **k),
        event("reward", {"name": "pass", "value": 0.0}, seq=11, **k),
    ]
    second = [
        start,  # a replay: same event id
        event("llm.request", {"call_id": "c1", "model": "late", "prompt_token_ids": [9, 9, 9]}, seq=8, **k),
        event("llm.response", {"call_id": "c1", "response_token_ids": [3], "logprobs": [-0.5],
                               "token_source": "engine", "finish_reason": "stop", "latency_ms": 5.0}, seq=3, **k),
        copy_of_request,
        event("llm.response", {"call_id": "c2", "response_token_ids": [6], "logprobs": [-0.1],
                               "token_source": "engine", "finish_reason": "stop", "latency_ms": 7.0}, seq=5, **k),
        event("tool.call", {"call_id": "t1", "name": "edit"}, seq=9, **k),
        event("tool.result", {"call_id": "t1", "name": "bash", "result": {"ok": True}}, seq=12, **k),
        event("rollout.finished", {"status": "succeeded", "reason": "second try"}, seq=13, **k),
        event("reward", {"name": "pass", "value": 1.0}, seq=14, **k),
    ]
    return first, second


@pytest.fixture
def messy(lake: Lake) -> Lake:
    batches = [messy_rollout(r) for r in ("r1", "r2")]
    write_events(lake, batches[0][0] + batches[1][0])
    write_events(lake, batches[0][1] + batches[1][1] + sample_rollout("r3"))
    return lake


def test_duplicates_collapse_to_the_documented_winners(messy):
    calls = rows(messy, "SELECT call_id, seq, model, prompt_token_ids, response_token_ids, error, response_seq "
                        "FROM llm_calls WHERE rollout_id = 'r1' ORDER BY call_id")
    assert calls == [
        {"call_id": "c1", "seq": 1, "model": "m", "prompt_token_ids": [1, 2], "response_token_ids": [3],
         "error": None, "response_seq": 3},
        {"call_id": "c2", "seq": 4, "model": "m", "prompt_token_ids": [5], "response_token_ids": [6],
         "error": None, "response_seq": 5},
    ]
    [step] = rows(messy, "SELECT name, arguments, result, error, result_seq FROM tool_steps WHERE rollout_id = 'r1'")
    assert step == {"name": "bash", "arguments": '{"cmd":"ls"}', "result": None, "error": "exit 1", "result_seq": 7}
    [r] = rows(messy, "SELECT status, reason, policy_version, n_llm_calls, n_llm_errors, n_tool_calls, n_tool_errors, "
                      "n_prompt_tokens, reward, n_rewards FROM rollouts WHERE rollout_id = 'r1'")
    assert r == {"status": "succeeded", "reason": "second try", "policy_version": "p1", "n_llm_calls": 2,
                 "n_llm_errors": 0, "n_tool_calls": 1, "n_tool_errors": 1, "n_prompt_tokens": 3, "reward": 1.0,
                 "n_rewards": 2}


@pytest.mark.parametrize("view, key", [("llm_calls", "call_id"), ("tool_steps", "call_id"),
                                        ("rollouts", "rollout_id")])
def test_a_filter_on_one_rollout_sees_the_rows_of_the_whole_view(messy, view, key):
    """The filter reaches every side of the dedupe; the rows it keeps must not change."""
    con = connect(messy)
    try:
        columns = [c for (c, t, *_) in con.execute(f"DESCRIBE {view}").fetchall() if "TIMESTAMP" not in t]
        select = f"SELECT {', '.join(columns)} FROM {view}"
        everything = con.execute(f"{select} ORDER BY rollout_id, {key}").to_arrow_table().to_pylist()
        for rollout in ("r1", "r2", "r3"):
            one = con.execute(f"{select} WHERE rollout_id = ? ORDER BY {key}", [rollout]).to_arrow_table()
            assert one.to_pylist() == [r for r in everything if r["rollout_id"] == rollout], rollout
        (n,) = con.execute(f"SELECT count(*) FROM {view}").fetchone()
        assert n == len(everything)
    finally:
        con.close()


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM llm_calls",
    "SELECT model, finish_reason, count(*), avg(latency_ms) FROM llm_calls GROUP BY ALL",
    "SELECT seq, n_prompt_tokens, n_response_tokens FROM llm_calls WHERE rollout_id = 'r1'",
    "SELECT status, count(*), avg(reward), sum(n_prompt_tokens) FROM rollouts GROUP BY ALL",
])
def test_scalar_questions_read_no_token_lists(messy, sql):
    """A CTE read twice is materialized with every column of the view; no shape may bring that back."""
    con = connect(messy)
    try:
        plan = "\n".join(row[1] for row in con.execute(f"EXPLAIN {sql}").fetchall())
    finally:
        con.close()
    assert not [c for c in ("prompt_token_ids", "response_token_ids", "logprobs", "messages") if c in plan], plan
    assert "CTE_SCAN" not in plan, plan
