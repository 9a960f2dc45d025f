"""The gateway over real HTTP (uvicorn) in front of the fake engine; events land in a memory sink."""

from __future__ import annotations

import json

import httpx
import pytest
from gateway_helpers import KEY, OTHER_KEY, TENANT, memory_emitter, serve, wait_for, wire_event
from prometheus_client.parser import text_string_to_metric_families

from devkit.ports import free_port
from ingest.gateway import create_gateway_app
from ingest.gateway.bodies import MAX_NESTING
from ingest.gateway.server import MAX_HEADER_BYTES, GatewayHttpProtocol

AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "tell me a story"}]}


@pytest.fixture
def gateway(settings, tmp_path):
    """(gateway base URL, memory sink, emitter) with a fresh spool per test."""
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter), http=GatewayHttpProtocol) as url:
        yield url, sink, emitter


def events(sink, n: int) -> list[dict]:
    wait_for(lambda: len(sink.records) >= n, what=f"{n} events")
    return [wire_event(v) for _, v in sink.records]


def sse_chunks(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_answer_equals_the_engines_and_the_call_is_recorded_with_ids(gateway, engine):
    url, sink, _ = gateway
    direct = httpx.post(f"{engine[0]}/chat/completions", json=CHAT).json()
    through = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH)
    assert through.status_code == 200 and through.json() == direct
    request, response = events(sink, 2)
    sampled = httpx.post(f"{engine[0]}/chat/completions", json={**CHAT, "return_token_ids": True}).json()
    assert request["payload"]["prompt_token_ids"] == sampled["prompt_token_ids"]
    assert response["payload"]["response_token_ids"] == sampled["choices"][0]["token_ids"]
    assert response["payload"]["token_source"] == "engine" and len(response["payload"]["logprobs"]) == 16
    assert request["tenant"] == response["tenant"] == TENANT
    assert request["task_id"] == "_unattached" and request["rollout_id"] == request["payload"]["call_id"]
    assert sink.records[0][0] == request["rollout_id"].encode()


def test_fields_the_client_asked_for_are_passed_through(gateway, engine):
    url, _, _ = gateway
    body = {**CHAT, "return_token_ids": True, "logprobs": True}
    direct = httpx.post(f"{engine[0]}/chat/completions", json=body).json()
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH).json() == direct
    only_ids = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "return_token_ids": True}, headers=AUTH).json()
    assert only_ids["choices"][0]["token_ids"] and only_ids["choices"][0]["logprobs"] is None


def test_streaming_is_relayed_chunk_for_chunk_without_unasked_fields(gateway, engine):
    url, sink, _ = gateway
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    direct = httpx.post(f"{engine[0]}/chat/completions", json=body).text
    through = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH)
    assert through.headers["content-type"].startswith("text/event-stream")
    assert sse_chunks(through.text) == sse_chunks(direct) and through.text.endswith("data: [DONE]\n\n")
    assert "token_ids" not in through.text and '"logprobs":{' not in through.text.replace(" ", "")
    _, response = events(sink, 2)
    assert len(response["payload"]["response_token_ids"]) == 16 and response["payload"]["usage"]["total_tokens"]
    asked = httpx.post(f"{url}/v1/chat/completions", json={**body, "return_token_ids": True}, headers=AUTH).text
    assert sse_chunks(asked) == sse_chunks(httpx.post(f"{engine[0]}/chat/completions",
                                                      json={**body, "return_token_ids": True}).text)


def test_text_completions_streaming_and_not(gateway, engine):
    url, sink, _ = gateway
    body = {"model": "fake-model", "prompt": "once upon a time", "max_tokens": 5}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=AUTH).json() == \
        httpx.post(f"{engine[0]}/completions", json=body).json()
    streamed = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, headers=AUTH).text
    assert "token_ids" not in streamed
    recorded = events(sink, 4)
    assert recorded[0]["payload"]["prompt"] == "once upon a time" and len(recorded[0]["payload"]["prompt_token_ids"]) == 4
    assert [len(e["payload"]["response_token_ids"]) for e in recorded if e["type"] == "llm.response"] == [5, 5]


def test_rollout_identity_from_path_headers_and_query(gateway):
    url, sink, _ = gateway
    headers = {**AUTH, "x-trajlake-attempt": "3", "x-trajlake-harness": "swe-agent",
               "x-trajlake-harness-version": "1.2"}
    assert httpx.post(f"{url}/tasks/task-9/rollouts/ro-1/v1/chat/completions", json=CHAT, headers=headers).is_success
    assert httpx.post(f"{url}/rollouts/ro-2/v1/chat/completions?task_id=task-8", json=CHAT, headers=AUTH).is_success
    recorded = events(sink, 4)
    assert {(e["task_id"], e["rollout_id"], e["attempt"]) for e in recorded} == {("task-9", "ro-1", 3), ("task-8", "ro-2", 0)}
    assert recorded[0]["harness"] == {"name": "swe-agent", "version": "1.2", "config_hash": None}


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer sk-nope"}, {"authorization": "Basic abc"}])
def test_missing_or_unknown_key_is_401_and_nothing_is_recorded(gateway, headers):
    url, sink, emitter = gateway
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/v1/events")):
        r = httpx.request(method, f"{url}{path}", json=CHAT, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    httpx.post(f"{url}/rollouts/r/v1/chat/completions", json=CHAT, headers=headers)
    metrics = httpx.get(f"{url}/metrics").text
    for route, count in (("chat", 2), ("models", 1), ("events", 1)):
        assert f'trajlake_gateway_requests_total{{route="{route}",status="401"}} {count}.0' in metrics
    emitter.close()
    assert sink.records == []


@pytest.mark.parametrize("body, status, problem", [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "empty"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (json.dumps({"messages": CHAT["messages"]}).encode(), 400, "'model' is required"),
    (json.dumps({"model": 7, "messages": CHAT["messages"]}).encode(), 400, "'model' must be a string"),
    (json.dumps({"model": "m", "messages": "hi"}).encode(), 400, "'messages' must be a list"),
    (json.dumps({"model": "m", "messages": []}).encode(), 400, "must not be empty"),
    (json.dumps({"model": "m", "messages": [{"content": "x"}]}).encode(), 400, "string 'role'"),
    (json.dumps({**CHAT, "stream": "yes"}).encode(), 400, "'stream' must be a boolean"),
    (json.dumps({**CHAT, "logprobs": 1}).encode(), 400, "'logprobs' must be a boolean"),
    (json.dumps({**CHAT, "tools": {"a": 1}}).encode(), 400, "'tools' must be a list"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (json.dumps(CHAT).encode()[:-1] + b', "temperature": NaN}', 400, "temperature: NaN and Infinity are not JSON"),
    (json.dumps(CHAT).encode()[:-1] + b', "x": [1e400]}', 400, "x.0: NaN and Infinity are not JSON"),
    (json.dumps(CHAT).encode()[:-1] + b', "user": "\\udfff"}', 400, "user: holds a lone UTF-16 surrogate"),
    (json.dumps({**CHAT, "pad": "x" * 70_000}).encode(), 413, "exceeds"),
])
def test_bad_bodies_get_clear_errors_and_reach_nobody(gateway, engine, body, status, problem):
    url, sink, emitter = gateway
    calls_before = sum(engine[1].state.calls.values())
    r = httpx.post(f"{url}/v1/chat/completions", content=body, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == status and problem in r.json()["error"]["message"]
    emitter.close()
    assert sink.records == [] and sum(engine[1].state.calls.values()) == calls_before


def test_huge_body_without_content_length_is_cut_off(gateway):
    url, _, _ = gateway

    def chunks():
        for _ in range(100):
            yield b"x" * 1024

    r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), headers=AUTH)
    assert r.status_code == 413


def test_null_optional_fields_mean_not_given(gateway, engine):
    """``"tools": null`` (sent by some clients and frameworks) is no tools, as the engines read it; null ``model`` is missing."""
    url, _, _ = gateway
    body = {**CHAT, "tools": None, "stream": None, "logprobs": None, "return_token_ids": None}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": None}, headers=AUTH)
    assert r.status_code == 400 and "'model' is required" in r.json()["error"]["message"]


def test_completions_wrong_types(gateway):
    url, _, _ = gateway
    for body in ({"model": "m"}, {"model": "m", "prompt": 5}, {"model": "m", "prompt": "x", "logprobs": "3"}):
        r = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH)
        assert r.status_code == 400, body


def test_bad_identity_header_is_400(gateway):
    url, _, _ = gateway
    r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={**AUTH, "x-trajlake-attempt": "first"})
    assert r.status_code == 400 and "X-Trajlake-Attempt" in r.json()["error"]["message"]


def test_upstream_5xx_is_retried_then_passed_through_and_recorded_as_error(gateway, engine):
    url, sink, _ = gateway
    body = {**CHAT, "model": "fake-503", "messages": [{"role": "user", "content": "always fails"}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 503 and r.json()["error"]["message"] == "engine overloaded"
    _, response = events(sink, 2)
    assert "HTTP 503" in response["payload"]["error"] and response["payload"]["response_token_ids"] is None
    assert response["payload"]["token_source"] == "none" and response["payload"]["upstream_retries"] == 2
    assert engine[1].state.calls.total() >= 3  # 1 try + 2 retries


def test_flaky_upstream_succeeds_on_retry_and_counts_retries(gateway):
    url, sink, _ = gateway
    body = {**CHAT, "model": "fake-flaky-1", "messages": [{"role": "user", "content": "flaky once"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH).status_code == 200
    _, response = events(sink, 2)
    assert response["payload"]["upstream_retries"] == 1 and response["payload"]["error"] is None


def test_upstream_timeout_is_504_and_recorded(gateway):
    url, sink, _ = gateway
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "fake-slow"}, headers=AUTH, timeout=10)
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    _, response = events(sink, 2)
    assert "did not answer" in response["payload"]["error"]


def test_upstream_down_is_502(settings, tmp_path):
    settings.upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 502 and "unreachable after 3 attempt(s)" in r.json()["error"]["message"]
        stream = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH)
        assert stream.status_code == 502
        metrics = httpx.get(f"{url}/metrics").text
    assert 'trajlake_gateway_upstream_errors_total{kind="upstream_unavailable"} 2.0' in metrics
    recorded = events(sink, 4)
    assert [e["payload"]["upstream_retries"] for e in recorded if e["type"] == "llm.response"] == [2, 2]


def test_idempotent_retry_gets_the_recorded_answer_and_is_recorded_once(gateway, engine):
    url, sink, emitter = gateway
    body = {**CHAT, "messages": [{"role": "user", "content": "idempotent please"}]}
    headers = {**AUTH, "idempotency-key": "retry-me"}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    second = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert first.content == second.content and second.headers["idempotent-replayed"] == "true"
    other_tenant = httpx.post(f"{url}/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {OTHER_KEY}", "idempotency-key": "retry-me"})
    assert "idempotent-replayed" not in other_tenant.headers
    emitter.close()
    recorded = [wire_event(v) for _, v in sink.records]
    assert len(recorded) == 4 and {e["tenant"] for e in recorded} == {TENANT, "globex"}
    assert recorded[0]["payload"]["idempotency_key"] == "retry-me"


def test_a_reused_idempotency_key_with_another_body_is_422_and_reaches_nobody(gateway, engine):
    url, sink, emitter = gateway
    body = {**CHAT, "messages": [{"role": "user", "content": "first question"}]}
    headers = {**AUTH, "idempotency-key": "one-key"}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    calls = engine[1].state.calls.total()
    other = httpx.post(f"{url}/v1/chat/completions", headers=headers,
                       json={**body, "messages": [{"role": "user", "content": "another question"}]})
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert "different request body" in other.json()["error"]["message"]
    reordered = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(dict(reversed(body.items()))),
                           headers={**headers, "content-type": "application/json"})
    assert reordered.status_code == 200 and reordered.content == first.content  # same body: replayed
    assert reordered.headers["idempotent-replayed"] == "true" and engine[1].state.calls.total() == calls
    emitter.close()
    assert len(sink.records) == 2


def test_deep_json_is_400_and_the_gateway_keeps_serving(settings, tmp_path):
    settings.max_body_bytes = 1 << 20
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter), http=GatewayHttpProtocol) as url:
        deep_json_is_refused(url)
    emitter.close()
    assert len(sink.records) == 4 and emitter.invalid == 0


def deep_json_is_refused(url: str) -> None:
    nested = lambda depth: "[" * depth + "]" * depth  # noqa: E731
    fits = {**CHAT, "metadata": json.loads(nested(MAX_NESTING - 1))}
    assert httpx.post(f"{url}/v1/chat/completions", json=fits, headers=AUTH).status_code == 200
    for depth in (MAX_NESTING, 1_000, 100_000):
        body = b'{"model": "m", "metadata": ' + nested(depth).encode() + b"}"
        for path in ("/v1/chat/completions", "/v1/events"):
            r = httpx.post(f"{url}{path}", content=body, headers={**AUTH, "content-type": "application/json"})
            assert r.status_code == 400 and f"deeper than {MAX_NESTING} levels" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200


def test_headers_over_the_limit_are_431_without_being_read_whole(gateway):
    url, _, _ = gateway
    fits = {**AUTH, "x-pad": "p" * (MAX_HEADER_BYTES - 1024)}
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=fits).status_code == 200
    for size in (MAX_HEADER_BYTES + 1, 20 << 20):
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={**AUTH, "x-pad": "p" * size}, timeout=30)
        assert r.status_code == 431 and r.json()["error"]["code"] == "request_header_fields_too_large"
        assert str(MAX_HEADER_BYTES) in r.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v2/chat/completions", 404), ("POST", "/nothing/here", 404), ("GET", "/v1/chat/completions", 405),
])
def test_unknown_routes_get_openai_shaped_errors(gateway, method, path, status):
    url, _, _ = gateway
    r = httpx.request(method, f"{url}{path}", headers=AUTH)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and f"{method} {path}" in error["message"]


def test_post_events_gives_per_event_results_and_forces_the_tenant(gateway):
    url, sink, _ = gateway
    good = {"event_id": "ev-1", "type": "reward", "schema_version": 1, "ts": "2026-01-01T00:00:00Z",
            "tenant": "someone-else", "task_id": "t", "rollout_id": "r", "seq": 4,
            "payload": {"name": "pass", "value": 1.0}}
    batch = [good,
             {**good, "event_id": "ev-2", "payload": {"name": "pass", "value": "high"}},
             {**good, "event_id": "ev-3", "type": "tool.teleport"},
             "not an object",
             {**good, "event_id": "ev-4", "payload": {"name": "big", "value": 1.0, "pad": "x" * 5_000_000}},
             {**good, "event_id": "ev-5", "type": "rollout.finished", "payload": {"status": "succeeded", "steps": 3}}]
    r = httpx.post(f"{url}/v1/events", content=json.dumps({"events": batch}), headers=AUTH, timeout=30)
    assert r.status_code == 413  # 5 MB event is over the body limit of this gateway (64 KiB)
    batch[4] = {**good, "event_id": "ev-4", "seq": "4"}
    r = httpx.post(f"{url}/v1/events", json={"events": batch}, headers=AUTH)
    assert r.status_code == 200
    result = r.json()
    assert (result["accepted"], result["rejected"]) == (2, 4)
    statuses = [(x["index"], x["status"]) for x in result["results"]]
    assert statuses == [(0, "accepted"), (1, "rejected"), (2, "rejected"), (3, "rejected"), (4, "rejected"),
                        (5, "accepted")]
    assert "payload.value" in result["results"][1]["error"] and "unknown event type" in result["results"][2]["error"]
    recorded = events(sink, 2)
    assert [e["event_id"] for e in recorded] == ["ev-1", "ev-5"] and {e["tenant"] for e in recorded} == {TENANT}


@pytest.mark.parametrize("body, problem", [
    (b"{}", "must be"), (b'{"events": 5}', "must be"), (b"nope", "not valid JSON"),
    (json.dumps([{}] * 1001).encode(), "at most 1000"),
    (b'{"events": [{"type": "tool.call", "payload": {"arguments": {"x": -Infinity}}}]}',
     "events.0.payload.arguments.x: NaN and Infinity are not JSON"),
    # both were accepted, then failed the emitter's encoding: answered "accepted", never sent (review3)
    (b'{"events": [{"type": "reward", "payload": {"name": "\\ud800"}}]}',
     "events.0.payload.name: holds a lone UTF-16 surrogate"),
    (b'{"events": [{"seq": ' + b"9" * 5000 + b'}]}', "not valid JSON: Exceeds the limit"),
])
def test_post_events_bad_batches(gateway, body, problem):
    url, _, _ = gateway
    r = httpx.post(f"{url}/v1/events", content=body, headers=AUTH)
    assert r.status_code == 400 and problem in r.json()["error"]["message"]


def test_models_health_ready_and_metrics(gateway):
    url, _, _ = gateway
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"] == "fake-model"
    assert httpx.get(f"{url}/rollouts/r/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200 and ready.json()["spool"]["events"] == 0
    httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH)
    scraped = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text) for s in family.samples}
    assert scraped[("trajlake_gateway_requests_total", (("route", "chat"), ("status", "200")))] == 1
    assert scraped[("trajlake_gateway_request_seconds_count", (("route", "chat"),))] == 1
    for name in ("trajlake_gateway_spool_depth_bytes", "trajlake_gateway_events_produced_total",
                 "trajlake_gateway_events_dropped_total", "trajlake_gateway_broker_up"):
        assert (name, ()) in scraped, name


def test_stream_broken_by_the_engine_ends_with_an_error_chunk_and_is_recorded(gateway):
    url, sink, _ = gateway
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "fake-break", "stream": True}, headers=AUTH)
    chunks = sse_chunks(r.text)
    assert chunks[-1]["error"]["code"] == "stream_broken" and "[DONE]" not in r.text
    _, response = events(sink, 2)
    assert "upstream stream broke" in response["payload"]["error"]
    assert len(response["payload"]["response_token_ids"]) == 3  # what was sampled before the break


def test_client_leaving_mid_stream_is_recorded_as_such(gateway):
    url, sink, _ = gateway
    body = {**CHAT, "model": "fake-slowstream", "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH) as r:
        next(r.iter_lines())
    _, response = events(sink, 2)
    assert response["payload"]["error"] == "client disconnected before the stream ended"


def test_engine_that_must_not_be_asked_for_ids_gets_the_body_unchanged(settings, tmp_path):
    settings.request_token_ids = False
    emitter, sink = memory_emitter(tmp_path)
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200
    _, response = events(sink, 2)
    assert response["payload"]["token_source"] == "none" and response["payload"]["response_token_ids"] is None
    assert response["payload"]["logprobs"] is None


def test_idempotent_retry_of_a_stream_replays_the_same_stream(gateway):
    url, sink, emitter = gateway
    headers = {**AUTH, "idempotency-key": "stream-once"}
    body = {**CHAT, "stream": True}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    second = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert second.headers["idempotent-replayed"] == "true"
    assert second.headers["content-type"].startswith("text/event-stream") and second.text == first.text
    emitter.close()
    assert len(sink.records) == 2
