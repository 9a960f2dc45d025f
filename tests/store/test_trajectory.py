"""Whole rollouts read back in order from real Delta lakes."""

from __future__ import annotations

import pytest
from tests.store.lake_builder import event, sample_rollout, write_events

from store.lake import Lake
from store.sql import LakeMissing
from store.trajectory import (
    AmbiguousRollout,
    LlmCallStep,
    RolloutNotFound,
    ToolStep,
    Trajectory,
    excerpt,
    load_trajectory,
)


def test_steps_come_back_in_seq_order_with_their_summaries(lake):
    write_events(lake, list(reversed(sample_rollout())))  # arrival order must not matter
    t = load_trajectory(lake, "r1")
    assert [s.kind for s in t.steps] == [
        "rollout.started", "llm.call", "tool.call", "llm.call", "rollout.finished", "reward", "reward", "reward",
    ]
    assert [s.seq for s in t.steps] == [0, 1, 3, 5, 7, 8, 9, 10]
    first, tool, second = t.steps[1], t.steps[2], t.steps[3]
    assert isinstance(first, LlmCallStep) and isinstance(tool, ToolStep)
    assert (first.call_id, first.n_prompt_tokens, first.n_response_tokens) == ("c1", 3, 2)
    assert (first.finish_reason, first.latency_ms, first.token_source) == ("tool_calls", 120.0, "engine")
    assert (first.prompt_excerpt, first.text_excerpt) == ("fix the bug", "I will run the tests")
    assert first.responded_at > first.ts
    assert (tool.name, tool.arguments_excerpt, tool.result_excerpt) == ("bash", '{"cmd":"pytest"}', "1 failed")
    assert (tool.duration_ms, tool.state_changed, tool.has_result) == (800.0, False, True)
    assert (second.prompt_excerpt, second.n_prompt_tokens) == (None, 6)
    assert [(s.name, s.value) for s in t.steps[5:]] == [("pass", 0.0), ("pass", 1.0), ("format", 0.5)]
    s = t.summary
    assert (s.status, s.n_llm_calls, s.n_tool_calls, s.n_prompt_tokens, s.n_response_tokens) == (
        "succeeded", 2, 1, 9, 5)
    assert (s.reward, s.n_rewards, s.policy_version, s.harness_name) == (1.5, 3, "p7", "swe-agent")


def test_a_running_rollout_shows_what_has_arrived(lake):
    write_events(lake, sample_rollout()[:4])
    t = load_trajectory(lake, "r1")
    assert t.summary.status == "running" and t.summary.finished_at is None
    assert [s.kind for s in t.steps] == ["rollout.started", "llm.call", "tool.call"]
    assert t.steps[2].has_result is False and t.steps[2].result_excerpt is None


def test_a_call_without_response_and_with_an_error(lake):
    write_events(lake, [
        event("llm.request", {"call_id": "c1", "prompt": "2+2="}, seq=1),
        event("llm.request", {"call_id": "c2", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, seq=2),
        event("llm.response", {"call_id": "c2", "error": "upstream 503", "upstream_retries": 2}, seq=3),
    ])
    pending, failed = load_trajectory(lake, "r1").steps
    assert (pending.has_response, pending.n_response_tokens, pending.prompt_excerpt) == (False, None, "2+2=")
    assert (failed.has_response, failed.error, failed.upstream_retries) == (True, "upstream 503", 2)
    assert failed.prompt_excerpt == '[{"type": "text"}]'


def test_excerpts_are_cut_to_the_asked_length(lake):
    long_text = "word " * 500
    write_events(lake, [
        event("llm.request", {"call_id": "c1", "messages": [{"role": "user", "content": long_text}]}, seq=1),
        event("llm.response", {"call_id": "c1", "text": long_text}, seq=2),
    ])
    [call] = load_trajectory(lake, "r1", excerpt_chars=20).steps
    assert call.text_excerpt == "word word word word…" and len(call.prompt_excerpt) == 20


def test_tenants_keep_rollouts_apart(lake):
    write_events(lake, sample_rollout(tenant="a") + sample_rollout(tenant="b")[:2])
    with pytest.raises(AmbiguousRollout, match="tenants a, b: pass the tenant"):
        load_trajectory(lake, "r1")
    assert len(load_trajectory(lake, "r1", tenant="a").steps) == 8
    assert [s.kind for s in load_trajectory(lake, "r1", tenant="b").steps] == ["rollout.started", "llm.call"]
    with pytest.raises(RolloutNotFound, match="for tenant 'c'"):
        load_trajectory(lake, "r1", tenant="c")


@pytest.mark.parametrize("rollout_id", ["nope", "", "r1' OR '1'='1", "r1\x00", "x" * 100_000])
def test_unknown_or_malformed_ids_are_not_found(lake, rollout_id):
    write_events(lake, sample_rollout())
    with pytest.raises(RolloutNotFound, match="SELECT rollout_id, status FROM rollouts"):
        load_trajectory(lake, rollout_id)


def test_a_missing_lake_is_a_clear_error(tmp_path):
    with pytest.raises(LakeMissing):
        load_trajectory(Lake(str(tmp_path / "nowhere")), "r1")


def test_the_trajectory_is_plain_data_that_round_trips_through_json(lake):
    write_events(lake, sample_rollout())
    t = load_trajectory(lake, "r1")
    assert Trajectory.model_validate_json(t.model_dump_json()) == t


def test_excerpt_folds_whitespace_and_marks_cuts():
    assert excerpt(None) is None
    assert excerpt("a \n\t b") == "a b"
    assert excerpt("abcdef", 4) == "abc…"
    assert excerpt("abcd", 4) == "abcd"
    assert excerpt("abc", 1) == "…"
    assert excerpt("abc", 0) is None
