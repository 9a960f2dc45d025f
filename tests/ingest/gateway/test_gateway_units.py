"""Unit tests: token-format handling, identity, keys, events built from a call."""

from __future__ import annotations

import json

import pytest
from gateway_fake_engine import chat_answer, completion_answer, token_id

from ingest.gateway.auth import KeyConfigError, KeyRing, bearer_token, parse_keys
from ingest.gateway.capture import CapturedCall, Recorder
from ingest.gateway.errors import BadRequest, IdempotencyConflict, IdempotencyKeyReused
from ingest.gateway.idempotency import IdempotencyCache, StoredReply
from ingest.gateway.identity import UNATTACHED_TASK, CallIdentity, call_identity, rollout_identity
from ingest.gateway.sessions.state import SessionStore
from ingest.gateway.tokens import Asked, StreamAccumulator, asked_by, read_completion, strip, upstream_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello world"}]}


def test_upstream_body_asks_for_ids_and_logprobs_without_touching_the_clients_body():
    asked = asked_by("chat", CHAT)
    assert asked == Asked(token_ids=False, logprobs=False)
    body = upstream_body("chat", CHAT, asked)
    assert body["return_token_ids"] is True and body["logprobs"] is True
    assert "return_token_ids" not in CHAT
    assert upstream_body("completions", {"prompt": "x"}, Asked(False, False))["logprobs"] == 1
    assert upstream_body("chat", {**CHAT, "logprobs": True, "top_logprobs": 3}, Asked(False, True))["top_logprobs"] == 3


def test_strip_removes_only_what_was_not_asked():
    answer = chat_answer({**CHAT, "logprobs": True}, ids=True)
    assert strip("chat", answer, Asked(token_ids=True, logprobs=False))
    assert answer["choices"][0]["logprobs"] is None and "token_ids" in answer["choices"][0]
    assert strip("chat", answer, Asked(token_ids=False, logprobs=False))
    assert "prompt_token_ids" not in answer and "token_ids" not in answer["choices"][0]
    assert not strip("chat", answer, Asked(token_ids=False, logprobs=False))
    completion = completion_answer({"model": "m", "prompt": "a b"}, ids=True)
    strip("completions", completion, Asked(False, False))
    assert set(completion["choices"][0]) == {"index", "text", "finish_reason", "logprobs"}


def test_read_completion_takes_ids_and_one_logprob_per_token():
    done = read_completion("chat", chat_answer({**CHAT, "logprobs": True}, ids=True))
    assert len(done.response_token_ids) == len(done.logprobs) == 16
    assert done.prompt_token_ids and done.finish_reason == "stop"
    text = read_completion("completions", completion_answer({"model": "m", "prompt": "a b", "logprobs": 0}, ids=True))
    assert len(text.prompt_token_ids) == 2 and len(text.logprobs) == len(text.response_token_ids)


def test_stream_accumulator_rebuilds_text_ids_and_tool_calls():
    chunks = [
        {"model": "m", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [7],
                      "logprobs": {"content": [{"logprob": -0.5}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get"}}]},
                      "token_ids": [8], "logprobs": {"content": [{"logprob": -0.25}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]},
                      "token_ids": [9], "logprobs": {"content": [{"logprob": -1.0}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
                      "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"total_tokens": 5}},
    ]
    acc = StreamAccumulator("chat")
    for chunk in chunks:
        acc.feed(chunk)
    done = acc.result()
    assert done.prompt_token_ids == [1, 2] and done.response_token_ids == [7, 8, 9]
    assert done.logprobs == [-0.5, -0.25, -1.0] and done.text == "hi"
    assert done.tool_calls == [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]
    assert done.finish_reason == "tool_calls" and done.usage == {"total_tokens": 5}


def test_identity_from_headers_path_and_query_with_path_first():
    identity = rollout_identity(
        call_id="c",
        path={"rollout_id": "from-path"},
        headers={"x-trajlake-rollout-id": "from-header", "x-trajlake-task-id": "t1", "x-trajlake-attempt": "2",
                 "x-trajlake-harness": "h", "x-trajlake-harness-version": "1.0"},
        query={"task_id": "from-query", "span_id": "s1"},
    )
    assert (identity.rollout_id, identity.task_id, identity.attempt) == ("from-path", "t1", 2)
    assert identity.harness.name == "h" and identity.span_id == "s1" and identity.attached


def test_unattached_call_is_its_own_rollout():
    identity = rollout_identity(call_id="call-9", path={}, headers={}, query={})
    assert (identity.task_id, identity.rollout_id, identity.attached) == (UNATTACHED_TASK, "call-9", False)


@pytest.mark.parametrize("headers, problem", [
    ({"x-trajlake-attempt": "-1"}, "non-negative integer"),
    ({"x-trajlake-attempt": "two"}, "non-negative integer"),
    ({"x-trajlake-attempt": str(2**40)}, "non-negative integer"),
    ({"x-trajlake-rollout-id": "x" * 501}, "1-500 characters"),
    ({"x-trajlake-rollout-id": "  "}, "1-500 characters"),
    ({"x-trajlake-harness": "h"}, "together"),
])
def test_malformed_identity_is_a_clear_400(headers, problem):
    with pytest.raises(BadRequest, match=problem):
        rollout_identity(call_id="c", path={}, headers=headers, query={})


def keyed(tenant: str = "acme", body: dict = CHAT, **headers: str) -> CallIdentity:
    return call_identity(tenant=tenant, headers=headers or {"idempotency-key": "k1"}, kind="chat", body=body)


def test_idempotency_key_gives_a_stable_call_id_per_tenant_and_body():
    a = keyed()
    assert a == keyed() and a.fingerprint
    assert a.call_id != keyed("globex").call_id
    assert keyed(**{"x-client-request-id": "k1"}).call_id == a.call_id
    assert a.call_id == keyed(body=dict(reversed(CHAT.items()))).call_id  # key order is not a different body
    assert a.call_id != keyed(body={**CHAT, "temperature": 0.5}).call_id
    assert call_identity(tenant="acme", headers={}, kind="chat", body=CHAT).call_id != \
        call_identity(tenant="acme", headers={}, kind="chat", body=CHAT).call_id
    with pytest.raises(BadRequest):
        keyed(**{"idempotency-key": "k" * 201})


def test_a_reused_idempotency_key_with_another_body_is_refused_whatever_the_first_call_did():
    cache = IdempotencyCache(max_entries=10, ttl_s=60)
    assert cache.begin("acme", "k", "fp-1") is None
    with pytest.raises(IdempotencyKeyReused, match="different request body"):
        cache.begin("acme", "k", "fp-2")
    with pytest.raises(IdempotencyConflict):
        cache.begin("acme", "k", "fp-1")
    cache.finish("acme", "k", "fp-1", StoredReply(200, b"{}", "application/json"))
    assert cache.begin("acme", "k", "fp-1").body == b"{}"
    with pytest.raises(IdempotencyKeyReused):
        cache.begin("acme", "k", "fp-2")
    assert cache.begin("globex", "k", "fp-2") is None  # keys are per tenant
    cache.finish("globex", "k", "fp-2", None)  # a failed first attempt is forgotten: any body may run
    assert cache.begin("globex", "k", "fp-3") is None


def test_keys_parse_from_env_and_file(tmp_path):
    assert parse_keys("a=t1, b = t2\n# comment\nc=t3", source="x") == {"a": "t1", "b": "t2", "c": "t3"}
    for bad in ("a", "=t", "a="):
        with pytest.raises(KeyConfigError, match="key=tenant"):
            parse_keys(bad, source="x")
    file = tmp_path / "keys"
    file.write_text("sk-file=filetenant\n")
    ring = KeyRing.load(env_value="sk-env=envtenant", file=file, allow_anonymous=False)
    assert ring.tenant("sk-file") == "filetenant" and ring.tenant("sk-env") == "envtenant"
    assert ring.tenant("sk-wrong") is None and ring.tenant(None) is None
    with pytest.raises(KeyConfigError, match="cannot read"):
        KeyRing.load(env_value=None, file=tmp_path / "missing", allow_anonymous=False)
    with pytest.raises(KeyConfigError, match="no gateway API keys"):
        KeyRing.load(env_value=None, file=None, allow_anonymous=False)
    assert KeyRing({}, allow_anonymous=True).tenant(None) == "default"


def test_bearer_token():
    assert bearer_token("Bearer sk-1") == "sk-1"
    assert bearer_token("bearer  sk-1 ") == "sk-1"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None, "sk-2") == "sk-2"


def _captured(raw: bytes | None, **extra) -> CapturedCall:
    call = keyed()
    return CapturedCall(
        kind="chat", tenant="acme", rollout=rollout_identity(call_id=call.call_id, path={}, headers={}, query={}),
        call=call, request=CHAT, received_ns=1_000_000_000, finished_ns=1_002_000_000, upstream_retries=1,
        raw_response=raw, **extra,
    )


def test_recorder_builds_request_and_response_with_engine_tokens():
    raw = json.dumps(chat_answer({**CHAT, "logprobs": True}, ids=True)).encode()
    request, response = Recorder(policy_version="p7", retokenizer=None).events(_captured(raw))
    assert request.payload.prompt_token_ids == [token_id(w) for w in ("hello", "world", "<assistant>")]
    assert response.payload.token_source == "engine" and response.payload.latency_ms == 2.0
    assert response.payload.policy_version == "p7" and response.payload.upstream_retries == 1
    assert request.seq < response.seq and request.tenant == response.tenant == "acme"
    again = Recorder(policy_version="p7", retokenizer=None).events(_captured(raw))
    assert [e.event_id for e in again] == [request.event_id, response.event_id]  # keyed: stable ids


def test_recorder_without_ids_or_tokenizer_says_none_and_bad_json_is_an_error():
    raw = json.dumps(chat_answer(CHAT, ids=False)).encode()
    _, response = Recorder(policy_version=None, retokenizer=None).events(_captured(raw))
    assert response.payload.token_source == "none" and response.payload.response_token_ids is None
    _, broken = Recorder(policy_version=None, retokenizer=None).events(_captured(b"<html>"))
    assert "not a JSON object" in broken.payload.error
    _, failed = Recorder(policy_version=None, retokenizer=None).events(_captured(None, error="upstream 503"))
    assert failed.payload.error == "upstream 503"
    assert failed.event_id != broken.event_id  # error answers never share ids


def test_mismatched_logprobs_are_dropped_not_stored_wrong():
    answer = chat_answer({**CHAT, "logprobs": True}, ids=True)
    answer["choices"][0]["logprobs"]["content"].pop()
    _, response = Recorder(policy_version=None, retokenizer=None).events(_captured(json.dumps(answer).encode()))
    assert response.payload.logprobs is None and len(response.payload.response_token_ids) == 16


@pytest.mark.parametrize("bad", [float("-inf"), float("nan"), None])
def test_logprobs_that_are_not_finite_numbers_are_dropped_and_the_call_still_recorded(bad):
    answer = chat_answer({**CHAT, "logprobs": True}, ids=True)
    answer["choices"][0]["logprobs"]["content"][3]["logprob"] = bad
    _, response = Recorder(policy_version=None, retokenizer=None).events(_captured(json.dumps(answer).encode()))
    assert response.payload.logprobs is None and len(response.payload.response_token_ids) == 16


def test_recorder_references_the_rollout_s_last_call_but_never_the_call_itself():
    history = SessionStore(max_bytes=1 << 20, ttl_s=60)
    recorder = Recorder(policy_version=None, retokenizer=None, history=history)
    headers = {"x-trajlake-task-id": "t", "x-trajlake-rollout-id": "r"}
    raw = json.dumps(chat_answer(CHAT, ids=True)).encode()

    def recorded(call: CallIdentity, messages: list[dict]):
        rollout = rollout_identity(call_id=call.call_id, path={}, headers=headers, query={})
        captured = CapturedCall(kind="chat", tenant="acme", rollout=rollout, call=call,
                                request={**CHAT, "messages": messages}, received_ns=1, finished_ns=2,
                                upstream_retries=0, raw_response=raw)
        return recorder.events(captured)[0].payload

    first = recorded(keyed(), CHAT["messages"])
    again = recorded(keyed(), CHAT["messages"])  # a keyed retry recorded again: same call id, whole messages
    assert first.extends_call_id is None and again.extends_call_id is None and again.messages == CHAT["messages"]
    answer = {"role": "assistant", "content": "hi"}
    later = recorded(CallIdentity(call_id="call-2", idempotency_key=None), [*CHAT["messages"], answer])
    assert (later.extends_call_id, later.extends_messages, later.messages) == (first.call_id, len(CHAT["messages"]),
                                                                            [answer])
