"""``POST /v1/traces``: the real OpenTelemetry SDK's OTLP/HTTP exporter against the gateway.

The end-to-end test runs one scripted agent twice against the fake engine:
through the gateway's proxy (+ ``POST /v1/events`` for its tools), and
instrumented with OpenTelemetry (GenAI semantic conventions) exporting to
``/v1/traces``; through a real broker and the ingester, both rollouts must read
the same in the ``llm_calls`` and ``tool_steps`` views, token ids aside.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from gateway_helpers import KEY, TENANT, memory_emitter, serve, wait_for
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle
from store.sql import run_query

FIXTURES = Path(__file__).parent.parent / "otlp" / "fixtures"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

Chat = Callable[[list[dict]], dict]
Tool = Callable[[dict], str]


def run_agent(chat: Chat, tool: Tool) -> str:
    """The agent under test: ask, call the tool the model picked, answer."""
    messages = [{"role": "user", "content": "what is the weather in Paris"}]
    first = chat(messages)
    call = first["tool_calls"][0]
    calls = [{"id": call["id"], "type": "function", "function": call["function"]}]
    messages += [{"role": "assistant", "tool_calls": calls},
                 {"role": "tool", "tool_call_id": call["id"], "content": tool(call)}]
    return chat(messages)["content"]


def weather(call: dict) -> str:
    return "sunny in " + json.loads(call["function"]["arguments"])["city"]


# ----------------------------------------------------------------- an OTel instrumentation, GenAI conventions


def _parts(message: dict) -> dict:
    if message["role"] == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": message["tool_call_id"],
                                           "response": message["content"]}]}
    parts = [{"type": "text", "content": message["content"]}] if message.get("content") is not None else []
    parts += [{"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
               "arguments": c["function"]["arguments"]} for c in message.get("tool_calls") or []]
    return {"role": message["role"], "parts": parts}


def traced_chat(tracer, engine_url: str, *, model: str) -> Chat:
    def chat(messages: list[dict]) -> dict:
        with tracer.start_as_current_span(f"chat {model}") as span:
            span.set_attributes({
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": model,
                "gen_ai.request.temperature": 0.0, "gen_ai.tool.definitions": json.dumps(TOOLS),
                "gen_ai.input.messages": json.dumps([_parts(m) for m in messages]),
            })
            answer = httpx.post(f"{engine_url}/chat/completions", timeout=10,
                                json={"model": model, "messages": messages, "tools": TOOLS, "temperature": 0}).json()
            choice = answer["choices"][0]
            span.set_attributes({
                "gen_ai.response.id": answer["id"], "gen_ai.response.model": answer["model"],
                "gen_ai.response.finish_reasons": [choice["finish_reason"]],
                "gen_ai.usage.input_tokens": answer["usage"]["prompt_tokens"],
                "gen_ai.usage.output_tokens": answer["usage"]["completion_tokens"],
                "gen_ai.output.messages": json.dumps([{**_parts(choice["message"]),
                                                       "finish_reason": choice["finish_reason"]}]),
            })
            return choice["message"]
    return chat


def traced_tool(tracer) -> Tool:
    def tool(call: dict) -> str:
        with tracer.start_as_current_span(f"execute_tool {call['function']['name']}") as span:
            result = weather(call)
            span.set_attributes({
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["function"]["name"],
                "gen_ai.tool.call.id": call["id"], "gen_ai.tool.call.arguments": call["function"]["arguments"],
                "gen_ai.tool.call.result": json.dumps(result),
            })
            return result
    return tool


def otel_provider(gateway_url: str, *, key: str = KEY) -> TracerProvider:
    """The SDK as an agent would configure it; spans leave only on ``force_flush`` (one export)."""
    exporter = OTLPSpanExporter(endpoint=f"{gateway_url}/v1/traces", headers={"Authorization": f"Bearer {key}"},
                                compression=Compression.Gzip, timeout=10)
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent",
                                                        "trajlake.harness.name": "weather-agent",
                                                        "trajlake.harness.version": "1.0"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    return provider


def run_traced_agent(provider: TracerProvider, engine_url: str, *, task_id: str, rollout_id: str) -> str:
    tracer = provider.get_tracer("weather-agent")
    with tracer.start_as_current_span("invoke_agent weather") as root:
        root.set_attributes({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
                             "trajlake.task_id": task_id, "trajlake.rollout_id": rollout_id})
        answer = run_agent(traced_chat(tracer, engine_url, model="fake-model"), traced_tool(tracer))
        root.set_status(Status(StatusCode.OK))
    assert provider.force_flush(30_000)
    return answer


# ----------------------------------------------------------------- the same agent through the gateway


def run_gateway_agent(gateway_url: str, *, task_id: str, rollout_id: str) -> str:
    base = f"{gateway_url}/tasks/{task_id}/rollouts/{rollout_id}/v1"
    harness = {"x-trajlake-harness": "weather-agent", "x-trajlake-harness-version": "1.0", **AUTH}

    def chat(messages: list[dict]) -> dict:
        answer = httpx.post(f"{base}/chat/completions", headers=harness, timeout=10,
                            json={"model": "fake-model", "messages": messages, "tools": TOOLS, "temperature": 0})
        return answer.json()["choices"][0]["message"]

    def tool(call: dict) -> str:
        envelope = {"schema_version": 1, "task_id": task_id, "rollout_id": rollout_id,
                    "harness": {"name": "weather-agent", "version": "1.0"}}
        name, started = call["function"]["name"], time.time_ns()
        result = weather(call)
        events = [
            {**envelope, "event_id": f"{rollout_id}-{call['id']}-call", "type": "tool.call",
             "ts": _rfc3339(started), "seq": started // 1000,
             "payload": {"call_id": call["id"], "name": name, "arguments": json.loads(call["function"]["arguments"])}},
            {**envelope, "event_id": f"{rollout_id}-{call['id']}-result", "type": "tool.result",
             "ts": _rfc3339(time.time_ns()), "seq": started // 1000 + 1,
             "payload": {"call_id": call["id"], "name": name, "result": result, "duration_ms": 0.1}},
        ]
        posted = httpx.post(f"{gateway_url}/v1/events", headers=AUTH, json={"events": events}, timeout=10).json()
        assert posted["accepted"] == 2, posted
        return result

    return run_agent(chat, tool)


def _rfc3339(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns % 10**9 // 1000:06d}Z"


# ----------------------------------------------------------------- tests


LLM_COLUMNS = ("task_id", "model", "messages", "prompt", "tools", "params", "text", "tool_calls", "finish_reason",
               "usage", "policy_version", "error", "has_response", "harness_name", "harness_version")
TOOL_COLUMNS = ("task_id", "name", "arguments", "result", "error", "has_result", "state_changed", "harness_name")
JSON_COLUMNS = {"messages", "tools", "params", "tool_calls", "usage", "arguments", "result"}


def view_rows(lake, view: str, rollout_id: str, columns: tuple[str, ...]) -> list[dict]:
    """The view's rows; for llm_calls with full messages and tools (the gateway stores references)."""
    full = (" v.* REPLACE (m.messages AS messages, m.tools AS tools)", " JOIN llm_call_messages AS m "
            "USING (tenant, rollout_id, call_id)") if view == "llm_calls" else (" v.*", "")
    rows = run_query(lake, f"SELECT{full[0]} FROM {view} AS v{full[1]} WHERE rollout_id = '{rollout_id}' "
                           "ORDER BY v.seq").to_pylist()
    return [{c: json.loads(r[c]) if c in JSON_COLUMNS and r[c] is not None else r[c] for c in columns} for r in rows]


def test_an_otel_instrumented_agent_reads_like_the_same_agent_through_the_gateway(
    settings, broker, topic, group, lake, engine
):
    settings.bootstrap_servers, settings.topic = broker.bootstrap_servers, topic
    with serve(create_gateway_app(settings)) as url:
        through_gateway = run_gateway_agent(url, task_id="task-weather", rollout_id="ro-gateway")
        provider = otel_provider(url)
        try:
            traced = run_traced_agent(provider, engine[0], task_id="task-weather", rollout_id="ro-otel")
        finally:
            provider.shutdown()
    assert traced == through_gateway

    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers,
                                             topic=topic, group=group, dlq_topic=""), idle_s=1.5)
    assert stats.quarantined == 0
    gateway_calls = view_rows(lake, "llm_calls", "ro-gateway", LLM_COLUMNS)
    otel_calls = view_rows(lake, "llm_calls", "ro-otel", LLM_COLUMNS)
    assert len(gateway_calls) == 2 and otel_calls == gateway_calls
    assert view_rows(lake, "tool_steps", "ro-otel", TOOL_COLUMNS) == view_rows(lake, "tool_steps", "ro-gateway",
                                                                                TOOL_COLUMNS)
    tokens = run_query(lake, "SELECT rollout_id, token_source, response_token_ids IS NULL AS no_ids, tenant "
                             "FROM llm_calls ORDER BY rollout_id").to_pylist()
    assert {(t["rollout_id"], t["token_source"], t["no_ids"], t["tenant"]) for t in tokens} == {
        ("ro-gateway", "engine", False, TENANT), ("ro-otel", "none", True, TENANT)}  # nothing invented
    nesting = run_query(lake, "SELECT span_id, parent_span_id FROM llm_calls WHERE rollout_id = 'ro-otel' "
                              "UNION ALL SELECT span_id, parent_span_id FROM tool_steps "
                              "WHERE rollout_id = 'ro-otel'").to_pylist()
    roots = {n["parent_span_id"] for n in nesting}
    assert len(roots) == 1 and None not in roots and all(n["span_id"] for n in nesting)
    rollout = run_query(lake, "SELECT status FROM rollouts WHERE rollout_id = 'ro-otel'").to_pylist()
    assert rollout == [{"status": "succeeded"}]


@pytest.fixture
def recorded(tmp_path, settings):
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        yield url, sink


def test_sdk_exporter_protobuf_gzip_lands_events_under_the_keys_tenant(recorded, engine):
    url, sink = recorded
    provider = otel_provider(url)
    try:
        run_traced_agent(provider, engine[0], task_id="t-1", rollout_id="r-1")
    finally:
        provider.shutdown()
    wait_for(lambda: len(sink.records) == 8, what="8 events (2 rollout, 4 llm, 2 tool)")
    events = [json.loads(v) for _, v in sink.records]
    assert {(e["tenant"], e["task_id"], e["rollout_id"]) for e in events} == {(TENANT, "t-1", "r-1")}
    assert sorted(e["type"] for e in events) == sorted(["rollout.started", "rollout.finished", "tool.call",
                                                        "tool.result"] + ["llm.request", "llm.response"] * 2)
    assert {k for k, _ in sink.records} == {b"r-1"}


def test_json_body_and_partial_success_names_each_rejected_span(recorded):
    url, sink = recorded
    body = (FIXTURES / "semconv_genai.json").read_bytes()
    answer = httpx.post(f"{url}/v1/traces", content=gzip.compress(body),
                        headers={**AUTH, "content-type": "application/json", "content-encoding": "gzip"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    partial = answer.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "2"  # int64 is a string in protobuf's JSON
    assert "a000000000000008" in partial["errorMessage"] and "embeddings" in partial["errorMessage"]
    assert "a000000000000009" in partial["errorMessage"]
    wait_for(lambda: len(sink.records) == 12, what="10 events of the fixture's 5 recorded spans + 2 rejected spans")
    metrics = httpx.get(f"{url}/metrics").text
    assert 'trajlake_gateway_otlp_spans_total{result="rejected"} 2.0' in metrics
    assert 'trajlake_gateway_otlp_spans_total{result="ignored"} 2.0' in metrics  # HTTP span, nested agent span


def test_rejected_spans_are_quarantined_with_their_reasons(settings, broker, topic, group, lake):
    settings.bootstrap_servers, settings.topic = broker.bootstrap_servers, topic
    with serve(create_gateway_app(settings)) as url:
        answer = httpx.post(f"{url}/v1/traces", content=(FIXTURES / "semconv_genai.json").read_bytes(),
                            headers={**AUTH, "content-type": "application/json"})
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "2"
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers,
                                             topic=topic, group=group, dlq_topic=""), idle_s=1.5)
    assert stats.quarantined == 2 and stats.events == 10
    rows = run_query(lake, "SELECT field, reason, raw FROM quarantine ORDER BY reason").to_pylist()
    kept = {json.loads(r["raw"])["input"]["span_id"]: r for r in rows}
    assert set(kept) == {"a000000000000008", "a000000000000009"}
    embeddings = kept["a000000000000008"]
    assert embeddings["field"] == "(span)" and "unsupported gen_ai.operation.name 'embeddings'" in embeddings["reason"]
    assert all(json.loads(r["raw"])["tenant"] == TENANT for r in rows)


def test_refusals_name_what_to_fix(recorded):
    url, _ = recorded
    assert httpx.post(f"{url}/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"}
                      ).status_code == 401
    wrong = httpx.post(f"{url}/v1/traces", content=b"{}", headers={**AUTH, "content-type": "text/plain"})
    assert wrong.status_code == 415 and "application/x-protobuf" in wrong.json()["error"]["message"]
    garbage = httpx.post(f"{url}/v1/traces", content=b"\xff\x00garbage",
                         headers={**AUTH, "content-type": "application/x-protobuf"})
    assert garbage.status_code == 400 and "ExportTraceServiceRequest" in garbage.json()["error"]["message"]
    not_gzip = httpx.post(f"{url}/v1/traces", content=b"plain",
                          headers={**AUTH, "content-type": "application/json", "content-encoding": "gzip"})
    assert not_gzip.status_code == 400 and "gzip" in not_gzip.json()["error"]["message"]
    empty = httpx.post(f"{url}/v1/traces", content=b"", headers={**AUTH, "content-type": "application/x-protobuf"})
    assert empty.status_code == 200
    assert ExportTraceServiceResponse.FromString(empty.content).partial_success.rejected_spans == 0
