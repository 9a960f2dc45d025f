"""Spans recorded from real instrumentation libraries (``record_fixtures.py``) -> trajlake events.

Each fixture is the same exchange, the official ``openai`` client against the fake engine:
a chat call offered ``get_weather`` answers with a tool call, the tool's answer goes back,
a second chat call answers with text; both inside one plain application span.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.otlp import read_export_request, span_events
from ingest.otlp.wire import JSON

FIXTURES = Path(__file__).parent / "fixtures"
LIBRARIES = ("openllmetry", "openinference")
CALL_ID = "call_c7bac973ea3cf83a"
TOOL_CALL = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
QUESTION = [{"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "what is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def recorded(library: str):
    raw = (FIXTURES / f"recorded_{library}.json").read_bytes()
    spans = read_export_request(raw, content_type=JSON, content_encoding=None, max_bytes=1 << 20)
    return spans, span_events(spans, tenant="acme", default_task="_unattached")


def calls(library: str) -> tuple[dict, dict, object]:
    """The two chat calls' events by type, in the order they started, and the application span."""
    spans, outcomes = recorded(library)
    assert [o.rejected for o in outcomes] == [None] * len(spans)
    (agent,) = [s for s in spans if s.name == "weather-agent"]
    llm = sorted((o for o in outcomes if o.events), key=lambda o: o.span.start_ns)
    assert len(llm) == 2 and [o for o in outcomes if o.ignored] == [o for o in outcomes if o.span is agent]
    first, second = ({e.type: e for e in o.events} for o in llm)
    for events, outcome in ((first, llm[0]), (second, llm[1])):
        assert set(events) == {"llm.request", "llm.response"}
        for event in events.values():  # the span's own ids; its parent is the application span
            assert (event.span_id, event.parent_span_id) == (outcome.span.span_id, agent.span_id)
            assert (event.rollout_id, event.task_id) == (outcome.span.trace_id, "_unattached")
        assert events["llm.request"].payload.call_id == events["llm.response"].payload.call_id
        assert events["llm.request"].seq < events["llm.response"].seq
    return first, second, agent


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_recorded_tool_call_then_answer_lands_as_two_llm_calls(library):
    first, second, _ = calls(library)
    request, response = first["llm.request"].payload, first["llm.response"].payload
    assert request.model == "fake-weather" and request.messages == QUESTION and request.tools == TOOLS
    assert request.params == {"max_tokens": 8, "temperature": 0.0}
    assert (response.text, response.tool_calls, response.finish_reason) == (None, [TOOL_CALL], "tool_calls")
    assert response.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert response.policy_version == "fake-weather"
    assert (response.token_source, response.response_token_ids, request.prompt_token_ids) == ("none", None, None)

    request, response = second["llm.request"].payload, second["llm.response"].payload
    assert request.messages == [*QUESTION, {"role": "assistant", "tool_calls": [TOOL_CALL]},
                                {"role": "tool", "tool_call_id": CALL_ID, "content": "sunny, 21C"}]
    assert request.tools == TOOLS
    assert (response.text, response.tool_calls) == ("the quick brown fox jumps over the lazy", None)
    assert response.finish_reason == "stop"
    assert response.usage == {"prompt_tokens": 14, "completion_tokens": 8, "total_tokens": 22}


def test_both_libraries_give_the_same_trajectory():
    def content(library: str) -> list[dict]:
        exclude = {"call_id", "latency_ms"}
        return [e.payload.model_dump(exclude=exclude) for call in calls(library)[:2] for e in call.values()]

    assert content("openllmetry") == content("openinference")
