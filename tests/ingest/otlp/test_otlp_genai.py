"""Recorded GenAI spans (OTel semantic conventions; OpenLLMetry's attributes) -> trajlake events."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.otlp import read_export_request, span_events
from ingest.otlp.wire import JSON

FIXTURES = Path(__file__).parent / "fixtures"


def outcomes(name: str, *, tenant: str = "acme"):
    raw = (FIXTURES / name).read_bytes()
    spans = read_export_request(raw, content_type=JSON, content_encoding=None, max_bytes=1 << 20)
    return {o.span.span_id: o for o in span_events(spans, tenant=tenant, default_task="_unattached")}


def by_type(outcome) -> dict:
    return {e.type: e for e in outcome.events}


def test_semantic_conventions_chat_tool_and_sub_agent_spans():
    got = outcomes("semconv_genai.json")
    root = by_type(got["a000000000000001"])
    assert set(root) == {"rollout.started", "rollout.finished"}
    assert root["rollout.finished"].payload.status == "succeeded"
    assert root["rollout.started"].payload.metadata == {"agent": {"name": "weather"}}

    chat = by_type(got["a000000000000002"])
    request, response = chat["llm.request"], chat["llm.response"]
    for event in chat.values():  # identity inherited from the root span; harness from the resource
        assert (event.tenant, event.task_id, event.rollout_id) == ("acme", "task-weather", "ro-semconv")
        assert (event.span_id, event.parent_span_id) == ("a000000000000002", "a000000000000001")
        assert (event.harness.name, event.harness.version) == ("weather-agent", "1.2.0")
    assert request.payload.messages == [{"role": "system", "content": "You are a weather bot."},
                                        {"role": "user", "content": "weather in Paris?"}]
    assert request.payload.model == "gpt-4o" and request.payload.params == {"max_tokens": 64, "temperature": 0.0}
    assert request.payload.tools[0]["function"]["name"] == "get_weather"
    assert response.payload.tool_calls == [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert response.payload.finish_reason == "tool_calls" and response.payload.text is None
    assert response.payload.usage == {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
    assert response.payload.latency_ms == pytest.approx(500.0)
    assert response.payload.policy_version == "gpt-4o-2024-08-06"
    assert (response.payload.token_source, response.payload.response_token_ids) == ("none", None)
    assert request.payload.prompt_token_ids is None
    assert request.seq < response.seq and request.payload.call_id == response.payload.call_id

    tool = by_type(got["a000000000000003"])
    assert tool["tool.call"].payload.call_id == "call_1" and tool["tool.call"].payload.arguments == {"city": "Paris"}
    assert tool["tool.result"].payload.result == "sunny, 21C" and tool["tool.result"].payload.error is None
    assert tool["tool.result"].payload.duration_ms == pytest.approx(50.0)

    assert got["a000000000000004"].events == [] and got["a000000000000004"].rejected is None  # nested agent
    sub = by_type(got["a000000000000005"])  # the sub-agent's call nests under it, token ids carried
    assert sub["llm.request"].parent_span_id == "a000000000000004"
    assert sub["llm.request"].rollout_id == "ro-semconv"
    assert sub["llm.request"].payload.messages == [{"role": "user", "content": "summarize: sunny, 21C"}]
    assert sub["llm.request"].payload.prompt_token_ids == [11, 12]
    assert sub["llm.response"].payload.response_token_ids == [7, 8]
    assert sub["llm.response"].payload.logprobs == [-0.5, -0.25]
    assert (sub["llm.response"].payload.token_source, sub["llm.response"].payload.text) == ("engine", "Sunny and mild.")

    events_form = by_type(got["a000000000000006"])  # the earlier event form of the conventions
    assert events_form["llm.request"].payload.messages == [{"role": "user", "content": "and tomorrow?"}]
    assert events_form["llm.response"].payload.text == "Rain."
    assert events_form["llm.response"].payload.error == "rate limited once, retried"

    assert got["a000000000000007"].ignored  # plain HTTP span
    assert "unsupported gen_ai.operation.name 'embeddings'" in got["a000000000000008"].rejected
    assert "gen_ai.input.messages is not valid JSON" in got["a000000000000009"].rejected


def test_openllmetry_indexed_attributes():
    got = outcomes("openllmetry.json")
    assert got["b000000000000001"].ignored  # traceloop workflow span: structure only
    first = by_type(got["b000000000000002"])
    for event in first.values():  # no trajlake attributes: the trace is the rollout
        assert (event.rollout_id, event.task_id) == ("0af7651916cd43dd8448eb211c80319c", "_unattached")
        assert event.harness is None
    assert first["llm.request"].payload.messages == [{"role": "system", "content": "You are a weather bot."},
                                                     {"role": "user", "content": "weather in Paris?"}]
    assert first["llm.request"].payload.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    assert first["llm.request"].payload.params == {"temperature": 0.2}
    assert first["llm.response"].payload.tool_calls[0]["id"] == "call_9"
    assert first["llm.response"].payload.finish_reason == "tool_calls"
    assert first["llm.response"].payload.usage == {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}

    tool = by_type(got["b000000000000003"])
    assert tool["tool.call"].payload.name == "get_weather"
    assert tool["tool.call"].payload.arguments == {"args": [], "kwargs": {"city": "Paris"}}
    assert tool["tool.result"].payload.result == "sunny"

    second = by_type(got["b000000000000004"])
    assert second["llm.request"].payload.messages == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]
    assert second["llm.response"].payload.text == "It is sunny in Paris."
    assert "without gen_ai.operation.name" in got["b000000000000005"].rejected


def test_event_ids_are_stable_per_tenant_so_a_resent_export_is_stored_once():
    first, again, other = outcomes("openllmetry.json"), outcomes("openllmetry.json"), outcomes("openllmetry.json",
                                                                                               tenant="globex")
    ids = [e.event_id for o in first.values() for e in o.events]
    assert ids == [e.event_id for o in again.values() for e in o.events]
    assert not set(ids) & {e.event_id for o in other.values() for e in o.events}
    assert len(set(ids)) == len(ids)


def test_a_span_whose_events_break_the_contract_is_rejected_with_the_field():
    raw = (FIXTURES / "semconv_genai.json").read_text().replace(
        '{"key": "trajlake.rollout_id", "value": {"stringValue": "ro-semconv"}}',
        '{"key": "trajlake.rollout_id", "value": {"stringValue": "ro-semconv"}},'
        '{"key": "trajlake.attempt", "value": {"intValue": "-1"}}')
    spans = read_export_request(raw.encode(), content_type=JSON, content_encoding=None, max_bytes=1 << 20)
    rejected = [o.rejected for o in span_events(spans, tenant="acme", default_task="_unattached") if o.rejected]
    assert any(r.startswith("attempt:") for r in rejected)


@pytest.mark.parametrize("literal", ["NaN", "-Infinity", "1e400"])
def test_a_span_whose_json_attribute_holds_nan_or_infinity_is_rejected_naming_the_place(literal):
    raw = (FIXTURES / "semconv_genai.json").read_text().replace(
        '{\\"city\\": \\"Paris\\"}', '{\\"city\\": {\\"lat\\": %s}}' % literal)
    spans = read_export_request(raw.encode(), content_type=JSON, content_encoding=None, max_bytes=1 << 20)
    got = {o.span.span_id: o for o in span_events(spans, tenant="acme", default_task="_unattached")}
    assert got["a000000000000003"].rejected.startswith("payload.arguments.city.lat: NaN and Infinity are not JSON")
    assert got["a000000000000003"].events == [] and got["a000000000000002"].events  # the others stay


def test_openinference_attributes():
    got = outcomes("openinference.json")
    root = by_type(got["c000000000000001"])
    assert root["rollout.finished"].payload.status == "failed"
    assert root["rollout.finished"].payload.reason == "step limit reached"
    llm = by_type(got["c000000000000002"])
    request, response = llm["llm.request"].payload, llm["llm.response"].payload
    assert (llm["llm.request"].rollout_id, llm["llm.request"].task_id, llm["llm.request"].attempt) == (
        "ro-oi", "task-oi", 2)
    assert request.model == "gpt-4o-mini" and request.params == {"temperature": 0.1, "max_tokens": 128}
    assert request.messages == [{"role": "user", "content": "weather in Paris?"}]
    assert request.tools[0]["function"]["name"] == "get_weather"
    assert response.tool_calls == [{"id": "call_oi", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert response.usage == {"prompt_tokens": 40, "completion_tokens": 11, "total_tokens": 51}
    tool = by_type(got["c000000000000003"])
    assert tool["tool.call"].payload.call_id == "call_oi" and tool["tool.call"].payload.arguments == {"city": "Paris"}
    assert tool["tool.result"].payload.result == {"sky": "clear", "temp_c": 21}
    assert got["c000000000000004"].ignored  # a CHAIN span is structure
