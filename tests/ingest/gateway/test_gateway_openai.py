"""The official openai client through the gateway: same answers as direct, token-exact records.

Upstreams: the reference engine ``trajlake serve-model`` (tiny real model) and
the fake engine (deterministic tool calls). Events go to a real Kafka-protocol
broker; the ingester writes them to a real Delta lake.
"""

from __future__ import annotations

import json

import httpx
import pytest
from gateway_helpers import KEY, TENANT, memory_emitter, read_topic, serve, wait_for, wire_event
from openai import OpenAI
from transformers import AutoTokenizer

from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle
from schemas.answer_message import answer_message
from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity
from serve.app import create_serve_app
from store.messages import StoredMessages, full_messages

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def serve_model(tiny_model_dir):
    app = create_serve_app(tiny_model_dir, served_name="tiny", policy_version="policy-1", max_new_tokens_cap=32)
    with serve(app) as url:
        yield f"{url}/v1"


def gateway_app(settings, *, upstream: str, broker, topic):
    settings.upstream_url = upstream
    settings.bootstrap_servers = broker.bootstrap_servers
    settings.topic = topic
    return create_gateway_app(settings)


def client(base_url: str, **headers: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=KEY, default_headers=headers, max_retries=0)


def test_openai_client_gets_the_same_answers_and_the_lake_holds_the_sampled_tokens(
    settings, broker, topic, group, lake, serve_model
):
    params = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    direct = client(serve_model)
    sampled = httpx.post(f"{serve_model}/chat/completions",
                         json={**params, "return_token_ids": True, "logprobs": True}).json()
    with serve(gateway_app(settings, upstream=serve_model, broker=broker, topic=topic)) as url:
        through = client(f"{url}/v1", **{"x-trajlake-task-id": "task-1", "x-trajlake-rollout-id": "ro-1"})
        d, g = direct.chat.completions.create(**params), through.chat.completions.create(**params)
        assert g.choices[0].message == d.choices[0].message and g.usage == d.usage
        assert g.choices[0].finish_reason == d.choices[0].finish_reason and g.model == d.model
        assert "token_ids" not in (g.choices[0].model_extra or {}) and "prompt_token_ids" not in (g.model_extra or {})

        d_chunks = list(direct.chat.completions.create(**params, stream=True))
        g_chunks = list(through.chat.completions.create(**params, stream=True))
        assert [c.choices[0].delta for c in g_chunks if c.choices] == [c.choices[0].delta for c in d_chunks if c.choices]
        assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in g_chunks if c.choices)

        text_params = dict(model="tiny", prompt="def main():", max_tokens=6, temperature=0)
        d_text, g_text = direct.completions.create(**text_params), through.completions.create(**text_params)
        assert g_text.choices[0].text == d_text.choices[0].text
        assert through.models.list().data[0].id == "tiny"

    on_kafka = [e["payload"] for e in read_topic(broker.bootstrap_servers, topic, count=6) if e["type"] == "llm.response"]
    assert all(isinstance(p["logprobs"], str) for p in on_kafka)  # the engine's float32 logprobs, compact on the wire
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers,
                                             topic=topic, group=group, dlq_topic=""), idle_s=1.5)
    assert stats.events == 6 and stats.quarantined == 0
    requests = {r["call_id"]: r for r in lake.read("llm_requests").to_pylist()}
    responses = [
        (r["response_token_ids"], r["token_source"], r["policy_version"], r["tenant"],
         requests[r["call_id"]]["prompt_token_ids"])
        for r in sorted(lake.read("llm_responses").to_pylist(), key=lambda r: r["seq"]) if r["rollout_id"] == "ro-1"
    ]
    assert len(responses) == 3
    chat_ids = sampled["choices"][0]["token_ids"]
    engine_logprobs = [e["logprob"] for e in sampled["choices"][0]["logprobs"]["content"]]
    assert [r["logprobs"] for r in lake.read("llm_responses").to_pylist() if r["call_id"] in requests
            and r["response_token_ids"] == chat_ids] == [engine_logprobs] * 2  # exactly the engine's numbers
    for ids, source, policy, tenant, prompt_ids in responses[:2]:  # chat, then streamed chat
        assert ids == chat_ids and prompt_ids == sampled["prompt_token_ids"]
        assert (source, policy, tenant) == ("engine", "policy-1", TENANT)
    text_sampled = httpx.post(f"{serve_model}/completions", json={**text_params, "return_token_ids": True}).json()
    assert responses[2][0] == text_sampled["choices"][0]["token_ids"]


def test_tool_calls_round_trip_and_are_recorded(settings, broker, topic, engine):
    with serve(gateway_app(settings, upstream=engine[0], broker=broker, topic=topic)) as url:
        through = client(f"{url}/rollouts/ro-tools/v1")
        messages = [{"role": "user", "content": "what is the weather in Paris"}]
        answer = through.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        call = answer.choices[0].message.tool_calls[0]
        assert answer.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        streamed = list(through.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS,
                                                        stream=True))
        arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                            for c in streamed if c.choices and c.choices[0].delta.tool_calls)
        assert json.loads(arguments) == {"city": "Paris"}
        follow_up = messages + [answer.choices[0].message.model_dump(exclude_none=True),
                                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        assert through.chat.completions.create(model="fake-model", messages=follow_up, tools=TOOLS).choices

    recorded = read_topic(broker.bootstrap_servers, topic, count=6)
    assert len(recorded) == 6 and {e["rollout_id"] for e in recorded} == {"ro-tools"}
    requests = [e for e in recorded if e["type"] == "llm.request"]
    responses = {e["payload"]["call_id"]: e for e in recorded if e["type"] == "llm.response"}
    answers = {c: answer_message(r["payload"]["text"], r["payload"]["tool_calls"]) for c, r in responses.items()}
    full, problems = full_messages(StoredMessages(  # the later calls reference the one before: messages stored once
        p["call_id"], json.dumps(p["messages"]), json.dumps(p["tools"]) if p["tools"] else None, p.get("extends_call_id"),
        p.get("extends_messages"), p.get("extends_tools"), answers[p["call_id"]]) for p in (r["payload"] for r in requests))
    assert problems == {} and all(f.tools == TOOLS for f in full.values())
    # the follow-up's echo (the client's dump of the first answer) is byte for byte the second (streamed) answer:
    # counted as that call's answer, not stored
    assert [r["payload"].get("extends_messages") for r in requests] == [None, 1, 2]
    assert [len(r["payload"]["messages"]) for r in requests] == [1, 0, 1]
    assert full[requests[2]["payload"]["call_id"]].messages == follow_up
    for request in requests[:2]:
        response = responses[request["payload"]["call_id"]]["payload"]
        assert response["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        assert response["finish_reason"] == "tool_calls" and response["token_source"] == "engine"


def test_engine_without_ids_is_retokenized_with_the_configured_tokenizer(settings, tiny_model_dir, tmp_path):
    settings.tokenizer = str(tiny_model_dir)
    emitter, sink = memory_emitter(tmp_path)
    messages = [{"role": "user", "content": "what is the weather in Paris"}]
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        answer = client(f"{url}/v1").chat.completions.create(model="fake-noids", messages=messages, tools=TOOLS)
        assert answer.choices[0].message.tool_calls
    wait_for(lambda: len(sink.records) == 2, what="2 events")
    request, response = (wire_event(v) for _, v in sink.records)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert request["payload"]["prompt_token_ids"] == list(expected)
    assert request["payload"]["tokenizer"] == tokenizer_identity(tiny_model_dir)
    assert request["payload"]["chat_template_hash"] == chat_template_hash(tokenizer.chat_template)
    assert response["payload"]["token_source"] == "retokenized"
    assert response["payload"]["logprobs"] is None or len(response["payload"]["logprobs"]) == len(
        response["payload"]["response_token_ids"])


def test_tool_call_streams_the_client_closes_at_done_are_recorded_complete(settings, tmp_path):
    """The openai client closes a stream on reading [DONE], often before the engine's end of stream reaches
    the gateway (always with ``fake-linger``): every call must still be recorded as complete."""
    settings.upstream_timeout_s = 30.0  # a loaded machine must not turn one of the many calls into a 504
    emitter, sink = memory_emitter(tmp_path)
    messages = [{"role": "user", "content": "what is the weather in Paris"}]
    models = ["fake-linger"] * 5 + ["fake-model"] * 120
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        through = client(f"{url}/v1")
        for model in models:
            chunks = list(through.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True))
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
        emitter.close()
    responses = [wire_event(v)["payload"] for _, v in sink.records if json.loads(v)["type"] == "llm.response"]
    assert len(responses) == len(models)
    assert [r["error"] for r in responses] == [None] * len(models)
    assert all(r["finish_reason"] == "tool_calls" and r["tool_calls"] and r["response_token_ids"] for r in responses)
