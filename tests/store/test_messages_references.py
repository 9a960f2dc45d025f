"""Messages and tools references in the lake: stored as sent, full messages resolved in SQL and in Python.

A rollout of four chat calls, each extending the previous one's messages (the
third also re-sends them all: its stored list is empty; the fourth shares only
the tools), is written with references; ``llm_call_messages`` and
``store.messages`` must give back every call's full messages and tools
exactly. A rollout whose second call counts the first call's answer (the
harness's echo, not stored) resolves to the echo rebuilt from the response.
A reference to a call that is not in the lake, longer than what it names, or
counting an answer without a response, does not resolve.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from schemas.answer_message import answer_message
from schemas.events import EVENT_ADAPTER
from store.lake import Lake
from store.messages import full_messages, full_messages_json, request_rows_sql, stored_messages
from store.sql import run_query
from store.trajectory import load_trajectory
from tests.store.lake_builder import event, write_events
from trajlake.cli import build_app

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "Be exact.", "weight": 1.0}
USER = {"role": "user", "content": [{"type": "text", "text": "héllo\n"}], "name": None}
ANSWER = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function",
                                                                 "function": {"name": "run", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "t1", "content": "done: 1e2"}
FULL = {  # call -> (full messages, full tools), as the client sent them
    "c1": ([SYSTEM, USER], TOOLS),
    "c2": ([SYSTEM, USER, ANSWER, RESULT], TOOLS),
    "c3": ([SYSTEM, USER, ANSWER, RESULT], TOOLS),
    "c4": ([{"role": "user", "content": "new task"}], TOOLS),
}
REFERENCES = {"c2": ("c1", 2), "c3": ("c2", 4), "c4": ("c3", None)}  # call -> (extended call, shared messages)


ECHO = answer_message(None, ANSWER["tool_calls"])  # how the openai client sends ANSWER back: another key order
ECHOED = {"e1": [SYSTEM, USER], "e2": [SYSTEM, USER, ECHO, RESULT], "e3": [SYSTEM, USER, ECHO, RESULT, USER]}


def rollout(rollout_id: str, *, missing: str | None = None, beyond: bool = False) -> list:
    events = []
    for seq, (call_id, (messages, tools)) in enumerate(FULL.items()):
        payload = {"call_id": call_id, "messages": messages, "tools": tools}
        if call_id in REFERENCES:
            extends, shared = REFERENCES[call_id]
            payload.update(extends_call_id=extends, extends_tools=True, tools=None)
            if shared is not None:
                payload.update(extends_messages=shared + 2 * (beyond and call_id == "c2"), messages=messages[shared:])
        if call_id != missing:
            events.append(event("llm.request", payload, seq=2 * seq, rollout_id=rollout_id))
    return events


def echo_rollout(rollout_id: str, *, answered: bool = True) -> list:
    """e2 counts e1's answer (its 3rd message is the echo, not stored); e3 extends e2's four messages."""
    return [event("llm.request", {"call_id": "e1", "messages": ECHOED["e1"]}, seq=1, rollout_id=rollout_id),
            *([event("llm.response", {"call_id": "e1", "tool_calls": ANSWER["tool_calls"]}, seq=2,
                     rollout_id=rollout_id)] if answered else []),
            event("llm.request", {"call_id": "e2", "messages": [RESULT], "extends_call_id": "e1",
                                  "extends_messages": 3}, seq=3, rollout_id=rollout_id),
            event("llm.request", {"call_id": "e3", "messages": [USER], "extends_call_id": "e2",
                                  "extends_messages": 4}, seq=5, rollout_id=rollout_id)]


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(str(tmp_path / "lake"))
    write_events(lake, rollout("refs") + rollout("gap", missing="c2") + rollout("beyond", beyond=True)
                 + echo_rollout("echo") + echo_rollout("unanswered", answered=False))
    return lake


def test_every_call_s_full_messages_and_tools_resolve_exactly(lake):
    stored = run_query(lake, "SELECT call_id, messages, tools, extends_call_id, extends_messages, extends_tools "
                             "FROM llm_requests WHERE rollout_id = 'refs' ORDER BY seq").to_pylist()
    assert [json.loads(r["messages"]) for r in stored] == [[SYSTEM, USER], [ANSWER, RESULT], [],
                                                            FULL["c4"][0]]
    assert [r["tools"] for r in stored][1:] == [None] * 3
    full, problems = full_messages(stored_messages(stored))
    assert problems == {} and {c: (f.messages, f.tools) for c, f in full.items()} == FULL
    view = run_query(lake, "SELECT call_id, messages, tools, resolved FROM llm_call_messages "
                           "WHERE rollout_id = 'refs' ORDER BY seq").to_pylist()
    assert {r["call_id"]: (json.loads(r["messages"]), json.loads(r["tools"])) for r in view} == FULL
    assert all(r["resolved"] for r in view)


def test_a_counted_answer_resolves_to_the_echo_rebuilt_from_the_response(lake):
    assert list(ECHO) == ["role", "tool_calls"] and list(ECHO["tool_calls"][0]) == ["id", "function", "type"]
    rows = run_query(lake, request_rows_sql("rollout_id = 'echo'")).to_pylist()
    assert [json.loads(r["messages"]) for r in rows] == [ECHOED["e1"], [RESULT], [USER]]  # the echo is not stored
    full, problems = full_messages(stored_messages(rows))
    assert problems == {} and {c: f.messages for c, f in full.items()} == ECHOED
    assert json.dumps(full["e2"].messages[2]) == json.dumps(ECHO)  # key order too: the layout the client sends
    assert full_messages_json(rows) == {c: json.dumps(m, ensure_ascii=False) for c, m in ECHOED.items() if c != "e1"}
    view = run_query(lake, "SELECT call_id, messages, resolved FROM llm_call_messages WHERE rollout_id = 'echo' "
                           "ORDER BY seq").to_pylist()
    assert all(r["resolved"] for r in view)
    assert {r["call_id"]: json.loads(r["messages"]) for r in view} == ECHOED
    assert [list(json.loads(r["messages"])[2]) for r in view[1:]] == [["role", "tool_calls"]] * 2


def test_a_reference_that_cannot_be_followed_does_not_resolve(lake):
    view = run_query(lake, "SELECT rollout_id, call_id, messages, resolved FROM llm_call_messages "
                           "WHERE rollout_id NOT IN ('refs', 'echo') ORDER BY rollout_id, seq").to_pylist()
    assert [(r["rollout_id"], r["call_id"], r["resolved"]) for r in view] == [
        ("beyond", "c1", True), ("beyond", "c2", False), ("beyond", "c3", False), ("beyond", "c4", False),
        ("gap", "c1", True), ("gap", "c3", False), ("gap", "c4", False),
        ("unanswered", "e1", True), ("unanswered", "e2", False), ("unanswered", "e3", False)]
    rows = run_query(lake, "SELECT * FROM llm_requests WHERE rollout_id = 'gap'").to_pylist()
    assert full_messages(stored_messages(rows))[1] == {"c3": "missing_call", "c4": "missing_call"}
    rows = run_query(lake, "SELECT * FROM llm_requests WHERE rollout_id = 'beyond'").to_pylist()
    assert set(full_messages(stored_messages(rows))[1].values()) == {"beyond_prefix"}
    rows = run_query(lake, request_rows_sql("rollout_id = 'unanswered'")).to_pylist()
    assert full_messages(stored_messages(rows))[1] == {"e2": "missing_answer", "e3": "missing_answer"}


def test_a_table_written_before_the_columns_existed_reads_full_messages(tmp_path):
    lake = Lake(str(tmp_path / "new"))
    write_events(lake, [event("llm.request", {"call_id": "c1", "messages": [SYSTEM], "tools": TOOLS}, seq=1)])
    old = Lake(str(tmp_path / "old"))
    old.append("llm_requests", lake.read("llm_requests").drop_columns(
        ["extends_call_id", "extends_tokens", "extends_messages", "extends_tools"]))
    [row] = run_query(old, "SELECT messages, tools, resolved FROM llm_call_messages").to_pylist()
    assert row["resolved"] and json.loads(row["messages"]) == [SYSTEM] and json.loads(row["tools"]) == TOOLS


def test_rollout_show_excerpts_the_full_last_message(lake):
    steps = [s for s in load_trajectory(lake, "refs").steps if s.kind == "llm.call"]
    assert [s.prompt_excerpt for s in steps] == [json.dumps(USER["content"]), "done: 1e2", "done: 1e2",
                                                 "new task"]
    shown = CliRunner().invoke(build_app(), ["rollout", "show", "refs", "--lake", lake.root], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and shown.output.count("done: 1e2") == 2, shown.output


@pytest.mark.parametrize("payload, problem", [
    ({"extends_messages": 1, "messages": []}, "need extends_call_id"),
    ({"extends_call_id": "c0"}, "needs extends_tokens, extends_messages or extends_tools"),
    ({"extends_call_id": "c0", "extends_messages": 1}, "extends_messages needs messages"),
    ({"extends_call_id": "c0", "extends_tools": True, "tools": TOOLS}, "send tools null"),
    ({"extends_call_id": "c0", "extends_tools": False}, "extends_tools"),
])
def test_the_contract_refuses_a_reference_that_says_too_little_or_too_much(payload, problem):
    with pytest.raises(ValueError, match=problem):
        EVENT_ADAPTER.validate_python({"event_id": "e1", "type": "llm.request", "schema_version": 1,
                                       "ts": "2026-01-01T00:00:00Z", "tenant": "a", "task_id": "t", "rollout_id": "r",
                                       "seq": 1, "payload": {"call_id": "c1", **payload}})
