"""Harness SDK: real-broker round trips, plus unit tests with a recording producer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from devkit.broker import EmbeddedBroker
from devkit.ports import free_port
from ingest.ids import rfc3339, uuid7
from ingest.producer import BrokerUnreachable, encode_event
from ingest.redaction import RedactionRule, Redactor
from ingest.sdk import Harness, SdkSettings, TrajectoryClient, harness_identity
from schemas.answer_message import answer_message
from schemas.errors import InvalidEvent
from schemas.versions import validate_event
from store.messages import StoredMessages, full_messages
from tests.kafka_reading import consume

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Harness(name="test-agent", version="0.3.1", config_hash="sha256:abc")


class RecordingProducer:
    """Unit-test stand-in for EventProducer: validates like it, keeps events in memory."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.flushes = 0
        self.closed = False

    def send(self, event: dict) -> None:
        encode_event(event)
        self.events.append(event)

    def flush(self, *, timeout_s: float = 60.0) -> None:
        self.flushes += 1

    def close(self, *, timeout_s: float = 60.0) -> None:
        self.closed = True


@pytest.fixture
def recorded() -> tuple[TrajectoryClient, RecordingProducer]:
    producer = RecordingProducer()
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer)
    yield client, producer
    client.close()


def test_a_rollout_arrives_keyed_stamped_and_in_seq_order(broker, topic):
    client = TrajectoryClient(broker.bootstrap_servers, topic=topic, tenant="acme", harness=HARNESS)
    with client.rollout("task-1", attempt=2, group_id="g-1", policy_version="ckpt-3") as r:
        r.llm_call(prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5], logprobs=[-0.5, -0.1],
                   model="m", latency_ms=12.0)
        call = r.tool_call("search", {"q": "x"})
        r.tool_result(call, "search", {"hits": 2}, duration_ms=3.0, state_changed=False)
        with r.subagent() as helper:
            helper.llm_call(prompt_token_ids=[7], response_token_ids=[8], logprobs=[-1.0])
        r.reward("correctness", 1.0, source="tests")
    # no flush, no close: the rollout's end flushed
    messages = consume(broker.bootstrap_servers, topic, 9)
    client.close()
    events = [json.loads(m.value) for m in messages]
    assert {m.key for m in messages} == {r.rollout_id.encode()}
    assert len({m.partition for m in messages}) == 1
    assert [e["type"] for e in events] == [
        "rollout.started", "llm.request", "llm.response", "tool.call", "tool.result",
        "llm.request", "llm.response", "reward", "rollout.finished"]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    for event in events:
        validate_event(event)
        assert (event["tenant"], event["task_id"], event["attempt"]) == ("acme", "task-1", 2)
        assert event["harness"] == HARNESS.model_dump(exclude_defaults=True)
        assert uuid.UUID(event["event_id"]).version == 7
        assert event["ts"].endswith("Z") and datetime.fromisoformat(event["ts"]).utcoffset().total_seconds() == 0
    assert len({e["event_id"] for e in events}) == len(events)
    root, sub = events[0]["span_id"], events[5]["span_id"]
    assert sub != root and events[5]["parent_span_id"] == root
    assert "parent_span_id" not in events[0]  # fields at their defaults are left out (readers fill them in)
    assert events[0]["payload"] == {"group_id": "g-1", "policy_version": "ckpt-3"}
    assert events[2]["payload"]["token_source"] == "engine"
    assert events[1]["payload"]["call_id"] == events[2]["payload"]["call_id"]
    assert events[-1]["payload"] == {"status": "succeeded", "steps": 1}
    assert validate_event(events[-1]).payload.reason is None


def test_events_are_flushed_when_the_process_exits(broker, topic):
    script = textwrap.dedent(f"""
        from ingest.sdk import TrajectoryClient
        client = TrajectoryClient({broker.bootstrap_servers!r}, topic={topic!r}, flush_each_rollout=False)
        with client.rollout("task-exit", rollout_id="r-exit") as r:
            r.tool_call("noop")
        client.reward("task-exit", "r-exit", "late", 0.25)
    """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    events = [json.loads(m.value) for m in consume(broker.bootstrap_servers, topic, 4)]
    assert [e["type"] for e in events] == ["rollout.started", "tool.call", "rollout.finished", "reward"]


def test_an_escaping_exception_finishes_the_rollout_as_failed(recorded):
    client, producer = recorded
    with pytest.raises(ValueError, match="parser broke"):
        with client.rollout("t") as r:
            r.tool_call("parse")
            raise ValueError("parser broke")
    finished = producer.events[-1]
    assert finished["type"] == "rollout.finished"
    assert finished["payload"]["status"] == "failed"
    assert finished["payload"]["reason"] == "ValueError: parser broke"
    assert producer.flushes == 1


def test_interrupt_means_cancelled_and_set_status_wins(recorded):
    client, producer = recorded
    with pytest.raises(KeyboardInterrupt):
        with client.rollout("t"):
            raise KeyboardInterrupt
    assert producer.events[-1]["payload"]["status"] == "cancelled"
    with client.rollout("t") as r:
        r.set_status("truncated", reason="step limit", steps=30)
    assert producer.events[-1]["payload"] == {"status": "truncated", "reason": "step limit", "steps": 30}


def test_late_rewards_go_through_the_client_after_the_rollout_ended(recorded):
    client, producer = recorded
    with client.rollout("t", rollout_id="r-7") as r:
        sub = r.subagent()
    with pytest.raises(RuntimeError, match="client.reward"):
        r.reward("late", 1.0)
    with pytest.raises(RuntimeError, match="client.reward"):
        sub.tool_call("x")
    client.reward("t", "r-7", "human", 0.5, source="review", attempt=1)
    reward = producer.events[-1]
    assert (reward["type"], reward["rollout_id"], reward["attempt"], reward["tenant"]) == ("reward", "r-7", 1, "acme")
    assert reward["payload"] == {"name": "human", "value": 0.5, "source": "review"}
    assert reward["seq"] > producer.events[-2]["seq"]


@pytest.mark.parametrize(("emit", "field"), [
    (lambda r: r.llm_call(prompt_token_ids=[1], response_token_ids=["5"]), "payload.response_token_ids.0"),
    (lambda r: r.llm_call(prompt_token_ids="1 2 3"), "payload.prompt_token_ids"),
    (lambda r: r.llm_call(response_token_ids=[1, 2], logprobs=[-0.1]), "payload"),
    (lambda r: r.llm_call(response_token_ids=[-1]), "payload.response_token_ids"),
    (lambda r: r.llm_call(token_source="engine"), "payload"),
    (lambda r: r.llm_call(token_source="guessed"), "payload.token_source"),
    (lambda r: r.reward("score", float("inf")), "payload.value"),
    (lambda r: r.reward("score", "high"), "payload.value"),
    (lambda r: r.reward("", 1.0), "payload.name"),
    (lambda r: r.tool_call("x" * 201), "payload.name"),
    (lambda r: r.tool_result("c-1", "search", duration_ms=-5), "payload.duration_ms"),
    (lambda r: r.set_status("exploded") or r.__exit__(None, None, None), "payload.status"),
])
def test_bad_input_fails_in_the_harness_naming_the_field(recorded, emit, field):
    client, producer = recorded
    r = client.rollout("t").__enter__()
    sent = len(producer.events)
    with pytest.raises(InvalidEvent) as exc:
        emit(r)
    assert exc.value.field == field
    assert len(producer.events) == sent


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"task_id": ""}, "task_id"),
    ({"task_id": "t", "attempt": -1}, "attempt"),
    ({"task_id": "t", "attempt": "0"}, "attempt"),
    ({"task_id": "t", "rollout_id": "r" * 501}, "rollout_id"),
    ({"task_id": "t", "metadata": ["not", "a", "dict"]}, "payload.metadata"),
])
def test_bad_rollout_identity_is_refused_at_start(recorded, kwargs, field):
    client, producer = recorded
    task_id = kwargs.pop("task_id")
    with pytest.raises(InvalidEvent) as exc:
        with client.rollout(task_id, **kwargs):
            pass
    assert exc.value.field == field
    assert producer.events == []


def test_subagents_in_threads_keep_one_increasing_seq(recorded):
    client, producer = recorded
    with client.rollout("t") as r:
        def work() -> None:
            sub = r.subagent()
            for _ in range(50):
                sub.tool_call("step")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    seqs = [e["seq"] for e in producer.events]
    assert len(seqs) == 202 and seqs == sorted(set(seqs))
    assert len({e["span_id"] for e in producer.events}) == 5


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRAJLAKE_TENANT", "team-b")
    monkeypatch.setenv("TRAJLAKE_HARNESS_NAME", "env-agent")
    monkeypatch.setenv("TRAJLAKE_HARNESS_VERSION", "9")
    monkeypatch.setenv("TRAJLAKE_CONNECT_TIMEOUT_S", "2.5")
    settings = SdkSettings()
    assert settings.connect_timeout_s == 2.5
    producer = RecordingProducer()
    with TrajectoryClient.from_settings(settings, producer=producer) as client:
        with client.rollout("t"):
            pass
    assert producer.closed
    assert producer.events[0]["tenant"] == "team-b"
    assert producer.events[0]["harness"] == {"name": "env-agent", "version": "9", "config_hash": None}


def test_harness_identity_hashes_the_config_canonically():
    a = harness_identity("agent", "1", {"b": 1, "a": [1, 2]})
    assert a == harness_identity("agent", "1", {"a": [1, 2], "b": 1})
    assert a.config_hash != harness_identity("agent", "1", {"a": [2, 1], "b": 1}).config_hash
    assert harness_identity("agent", "1").config_hash is None


def test_a_closed_client_refuses_new_events(recorded):
    client, producer = recorded
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.reward("t", "r", "x", 1.0)


@pytest.mark.timeout(20)  # kafka-python's own default would wait 30 s: this guards the connect timeout
def test_no_broker_means_broker_unreachable_at_construction():
    with pytest.raises(BrokerUnreachable, match="trajlake broker"):
        TrajectoryClient(f"127.0.0.1:{free_port()}", connect_timeout_s=0.5)


def test_uuid7_ids_sort_by_creation_and_can_be_reproduced():
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    fixed = uuid7(unix_ms=1_767_225_600_123, random_bytes=bytes(range(10)))
    assert fixed == uuid7(unix_ms=1_767_225_600_123, random_bytes=bytes(range(10)))
    assert int(fixed.replace("-", "")[:12], 16) == 1_767_225_600_123
    assert uuid7(unix_ms=1, random_bytes=bytes(10)) < uuid7(unix_ms=2, random_bytes=bytes(10))


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"unix_ms": 0, "random_bytes": b"short"}, "10 bytes"),
    ({"unix_ms": -1, "random_bytes": bytes(10)}, "unix_ms"),
    ({"unix_ms": 2**48, "random_bytes": bytes(10)}, "unix_ms"),
    ({"random_bytes": bytes(10)}, "needs unix_ms"),
])
def test_uuid7_refuses_bad_arguments(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        uuid7(**kwargs)


def test_rfc3339_is_utc_with_milliseconds():
    assert rfc3339(1_767_225_600_123) == "2026-01-01T00:00:00.123Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert datetime.fromisoformat(rfc3339()).utcoffset().total_seconds() == 0


VLLM_CHAT_ANSWER = {
    "id": "chatcmpl-1", "model": "qwen3-8b", "prompt_token_ids": [151644, 872, 198],
    "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [151657, 5152, 151658],
                 "message": {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "tc-1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
                 "logprobs": {"content": [{"token": t, "logprob": lp, "top_logprobs": []}
                                          for t, lp in (("a", -0.5), ("b", -0.25), ("c", -1.0))]}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    "object": "chat.completion", "created": 1767225600,
}


def test_a_direct_engine_call_is_recorded_from_its_request_and_answer(recorded):
    client, producer = recorded
    request = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7,
               "return_token_ids": True, "logprobs": True}
    with client.rollout("t") as r:
        r.llm_call_from_response(request, VLLM_CHAT_ANSWER, latency_ms=80.0, idempotency_key="k-1")
    sent, answered = producer.events[1]["payload"], producer.events[2]["payload"]
    assert sent["prompt_token_ids"] == [151644, 872, 198] and sent["idempotency_key"] == "k-1"
    assert sent["params"] == {"temperature": 0.7, "return_token_ids": True, "logprobs": True}
    assert sent["messages"] == request["messages"] and sent["model"] == "qwen3-8b"
    assert answered["response_token_ids"] == [151657, 5152, 151658]
    assert answered["logprobs"] == [-0.5, -0.25, -1.0] and answered["token_source"] == "engine"
    assert answered["tool_calls"][0]["id"] == "tc-1" and answered["finish_reason"] == "tool_calls"
    assert answered["latency_ms"] == 80.0


def test_an_engine_answer_without_logprobs_for_every_token_is_refused(recorded):
    client, producer = recorded
    answer = json.loads(json.dumps(VLLM_CHAT_ANSWER))
    answer["choices"][0]["logprobs"]["content"].pop()
    r = client.rollout("t").__enter__()
    with pytest.raises(InvalidEvent, match="send one logprob per response token"):
        r.llm_call_from_response({"model": "m"}, answer)
    assert [e["type"] for e in producer.events] == ["rollout.started"]


def test_an_openai_client_response_object_is_read_too(recorded):
    from openai.types.chat import ChatCompletion

    client, producer = recorded
    with client.rollout("t") as r:
        r.llm_call_from_response({"model": "qwen3-8b"}, ChatCompletion.model_validate(VLLM_CHAT_ANSWER))
    assert producer.events[1]["payload"]["prompt_token_ids"] == [151644, 872, 198]
    assert producer.events[2]["payload"]["response_token_ids"] == [151657, 5152, 151658]
    assert producer.events[2]["payload"]["logprobs"] == [-0.5, -0.25, -1.0]


@pytest.mark.timeout(60)
def test_a_broker_that_dies_mid_rollout_makes_the_rollout_end_fail_loudly():
    with EmbeddedBroker() as private:
        private.create_topic("events", partitions=1)
        client = TrajectoryClient(private.bootstrap_servers, topic="events", connect_timeout_s=1, flush_timeout_s=1)
        with pytest.raises(BrokerUnreachable, match="flush timed out after 1 s"):
            with client.rollout("t") as r:
                r.tool_call("x")
                private.kill()
        with pytest.raises(BrokerUnreachable):
            client.close()
        client.close()  # already closed: nothing left to do


def test_async_rollouts_record_the_same_events_and_cancellation(recorded):
    client, producer = recorded

    async def harness() -> None:
        async with client.rollout("t", rollout_id="r-async") as r:
            r.tool_call("search")
        with pytest.raises(asyncio.CancelledError):
            async with client.rollout("t", rollout_id="r-cancelled"):
                raise asyncio.CancelledError

    asyncio.run(harness())
    assert [(e["rollout_id"], e["type"]) for e in producer.events] == [
        ("r-async", "rollout.started"), ("r-async", "tool.call"), ("r-async", "rollout.finished"),
        ("r-cancelled", "rollout.started"), ("r-cancelled", "rollout.finished")]
    assert producer.events[2]["payload"]["status"] == "succeeded"
    assert producer.events[-1]["payload"]["status"] == "cancelled"
    assert producer.flushes == 2


def test_prefix_references_send_each_token_once_when_asked():
    producer = RecordingProducer()
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer, prefix_references=True)
    with client.rollout("t") as r:
        first = r.llm_call(prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5])
        second = r.llm_call(prompt_token_ids=[1, 2, 3, 4, 5, 6], response_token_ids=[7])
        r.llm_call(prompt_token_ids=[1, 2, 3, 4, 9], response_token_ids=[8])  # diverges inside the answer
        r.llm_call(prompt_token_ids=[5], response_token_ids=[6])  # shares nothing: sent whole
        r.subagent().llm_call(prompt_token_ids=[1, 2], response_token_ids=[3])  # own span: its own chain
    client.close()
    requests = [e["payload"] for e in producer.events if e["type"] == "llm.request"]
    assert [(p.get("extends_call_id"), p.get("extends_tokens"), p["prompt_token_ids"]) for p in requests] == [
        (None, None, [1, 2, 3]), (first, 5, [6]), (second, 4, [9]), (None, None, [5]), (None, None, [1, 2])]


def test_messages_and_tools_references_send_each_message_once_when_asked():
    producer = RecordingProducer()
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer, prefix_references=True)
    tools = [{"type": "function", "function": {"name": "f"}}]
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u", "n": 1}
    answer, result = {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}
    sent = [([system, user], tools, [1, 2]), ([system, user, answer, result], tools, [1, 2, 3, 4]),
            ([system, {**user, "n": 1.0}, answer], tools, [1, 2, 9]),  # an echo with 1.0 for 1: not the same JSON
            ([{"role": "user", "content": "other"}], None, [7])]
    with client.rollout("t") as r:
        ids = [r.llm_call(messages=m, tools=t, prompt_token_ids=p, response_token_ids=[3]) for m, t, p in sent]
    client.close()
    requests = [e["payload"] for e in producer.events if e["type"] == "llm.request"]
    assert [(p.get("extends_call_id"), p.get("extends_tokens"), p.get("extends_messages"), p.get("extends_tools"))
            for p in requests] == [(None, None, None, None), (ids[0], 3, 2, True), (ids[1], 2, 1, True),
                                   (None, None, None, None)]
    assert [len(p["messages"]) for p in requests] == [2, 2, 2, 1] and requests[1]["tools"] is None
    full, problems = full_messages(StoredMessages(p["call_id"], json.dumps(p["messages"]), json.dumps(p["tools"]),
                                                  p.get("extends_call_id"), p.get("extends_messages"),
                                                  p.get("extends_tools")) for p in requests)
    assert problems == {} and [(full[i].messages, full[i].tools) for i in ids] == [(m, t) for m, t, _ in sent]


def test_the_echo_of_the_last_answer_is_counted_not_resent():
    producer = RecordingProducer()
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer, prefix_references=True)
    user, result = {"role": "user", "content": "u"}, {"role": "tool", "tool_call_id": "t1", "content": "r"}
    calls = [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    echo = {"content": "a", "role": "assistant",  # as the openai client dumps the answer
            "tool_calls": [{"id": "t1", "function": {"arguments": "{}", "name": "f"}, "type": "function"}]}
    sent = [[user], [user, echo, result], [user, echo, result, {**echo, "role": "assistant"}],
            [user, echo, result, {"role": "assistant", "content": "a", "tool_calls": echo["tool_calls"]}]]
    with client.rollout("t") as r:
        ids = [r.llm_call(messages=m, text="a", tool_calls=calls) for m in sent[:3]]
        ids.append(r.llm_call(messages=sent[3], error="engine failed"))
        r.llm_call(messages=[*sent[3], user])  # the last call failed: no answer to count
    client.close()
    requests = [e["payload"] for e in producer.events if e["type"] == "llm.request"]
    assert [p.get("extends_messages") for p in requests] == [None, 2, 4, 3, 4]  # 4th: the echo in another key order
    assert [len(p["messages"]) for p in requests] == [1, 1, 0, 1, 1]
    answers = {i: answer_message("a", calls) for i in ids[:3]}
    full, problems = full_messages(StoredMessages(p["call_id"], json.dumps(p["messages"]), None,
                                                  p.get("extends_call_id"), p.get("extends_messages"),
                                                  answer=answers.get(p["call_id"])) for p in requests)
    assert problems == {} and [full[i].messages for i in ids] == sent


def test_references_hide_nothing_from_the_ingesters_redaction_rules():
    """An echo the rules change is sent (the ingester redacts it there), and a call whose full messages they change
    keeps no prompt ids, although the part it stores is clean."""
    producer = RecordingProducer()
    redactor = Redactor([RedactionRule(name="answer", field="messages[1].content"),
                         RedactionRule(name="key", pattern="sk-[a-z0-9]{8,}")])
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer, prefix_references=True,
                              redactor=redactor)
    user, echo = {"role": "user", "content": "u"}, {"content": "a", "role": "assistant"}
    sent = [[user], [user, echo, {"role": "user", "content": "sk-abcdef123"}],
            [user, echo, {"role": "user", "content": "sk-abcdef123"}, echo, {"role": "user", "content": "ok"}]]
    with client.rollout("t") as r:
        ids = [r.llm_call(messages=m, text="a", prompt_token_ids=list(range(2 * len(m))), response_token_ids=[1])
               for m in sent]
    client.close()
    requests = [redactor.redact(validate_event(e)).payload for e in producer.events if e["type"] == "llm.request"]
    assert [(p.extends_messages, p.extends_tokens, p.prompt_token_ids is None) for p in requests] == [
        (None, None, False), (1, None, True), (4, None, True)]  # the 2nd sends the echo; the 3rd stores only "ok"
    full, problems = full_messages(StoredMessages(p.call_id, json.dumps(p.messages), None, p.extends_call_id,
                                                  p.extends_messages, answer=answer_message("a", None))
                                   for p in requests)
    assert problems == {} and all(full[i].messages[1]["content"] == "[REDACTED:answer]" for i in ids[1:])
    assert "sk-abcdef123" not in json.dumps([full[i].messages for i in ids])


def test_a_call_recorded_again_under_its_own_id_is_not_its_own_reference():
    producer = RecordingProducer()
    client = TrajectoryClient(tenant="acme", harness=HARNESS, producer=producer, prefix_references=True)
    messages = [{"role": "user", "content": "u"}]
    with client.rollout("t") as r:
        for _ in range(2):
            r.llm_call(call_id="c1", messages=messages, prompt_token_ids=[1, 2], response_token_ids=[3])
    client.close()
    requests = [e["payload"] for e in producer.events if e["type"] == "llm.request"]
    assert [(p.get("extends_call_id"), p["messages"], p["prompt_token_ids"]) for p in requests] == [
        (None, messages, [1, 2])] * 2
