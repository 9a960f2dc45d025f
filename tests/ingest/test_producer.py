"""EventProducer against the real embedded broker; bad events fail at the source."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from devkit.broker import EmbeddedBroker
from devkit.ports import free_port
from ingest.producer import CODECS, BrokerUnreachable, EventProducer, encode_event
from devkit.workload import WorkloadConfig, generate_events
from schemas.errors import InvalidEvent
from schemas.events import Harness
from schemas.versions import validate_event
from tests.kafka_reading import consume


def reward_event(rollout_id: str = "r-1", seq: int = 0, **payload) -> dict:
    return {
        "event_id": f"e-{rollout_id}-{seq}", "type": "reward", "schema_version": 1,
        "ts": "2026-01-01T00:00:00Z", "task_id": "t-1", "rollout_id": rollout_id, "seq": seq,
        "payload": {"name": "correctness", "value": 1.0, **payload},
    }


def test_dicts_and_models_arrive_keyed_by_rollout_as_compact_json(broker, topic):
    event = reward_event("r-a")
    model = validate_event(reward_event("r-b", 1))
    with EventProducer(broker.bootstrap_servers, topic=topic) as producer:
        producer.send(event)
        producer.send(model)
    messages = {m.key: m.value for m in consume(broker.bootstrap_servers, topic, 2)}
    assert set(messages) == {b"r-a", b"r-b"}
    assert json.loads(messages[b"r-a"]) == event
    assert b": " not in messages[b"r-a"] and b", " not in messages[b"r-a"]
    assert validate_event(json.loads(messages[b"r-b"])) == model


def test_fields_at_their_defaults_are_left_out_and_everything_else_kept():
    event = {**reward_event(source=None, future_field=None), "attempt": 0, "span_id": None, "tenant": "default",
             "harness": {"name": "h", "version": "1", "config_hash": None}, "future_envelope_field": 0}
    sent = json.loads(encode_event(event)[1])
    assert sent == {**reward_event(future_field=None), "harness": {"name": "h", "version": "1"},
                    "future_envelope_field": 0}  # unknown fields are kept as given, null or not
    assert validate_event(sent) == validate_event(event)
    llm = {**reward_event(), "type": "llm.request", "payload": {
        "call_id": "c", "messages": [{"role": "assistant", "content": None}], "params": {}, "tools": None}}
    assert json.loads(encode_event(llm)[1])["payload"] == {  # free-form values are never touched
        "call_id": "c", "messages": [{"role": "assistant", "content": None}]}


def test_a_rollout_stays_on_one_partition_in_send_order(broker, topic):
    events = list(generate_events(WorkloadConfig(tasks=2, rollouts_per_task=3, max_context_tokens=512)))
    with EventProducer(broker.bootstrap_servers, topic=topic, compression="gzip") as producer:
        assert producer.send_many(events) == len(events)
    messages = consume(broker.bootstrap_servers, topic, len(events))
    assert len(messages) == len(events)
    partitions, order = defaultdict(set), defaultdict(list)
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        partitions[m.key].add(m.partition)
        order[m.key.decode()].append(json.loads(m.value)["event_id"])
    assert all(len(p) == 1 for p in partitions.values())
    for rollout_id, ids in order.items():
        assert ids == [e["event_id"] for e in events if e["rollout_id"] == rollout_id]


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda e: e.pop("event_id"), "event_id"),
    (lambda e: e.update(seq="3"), "seq"),
    (lambda e: e.update(type="reward.v2"), "type"),
    (lambda e: e["payload"].update(value=float("nan")), "payload.value"),
    (lambda e: e.update(ts="2026-01-01T00:00:00"), "ts"),
    (lambda e: e.update(schema_version=99), "schema_version"),
])
def test_invalid_events_fail_at_the_source_and_send_nothing(broker, topic, mutate, field):
    event = reward_event()
    mutate(event)
    with EventProducer(broker.bootstrap_servers, topic=topic) as producer:
        with pytest.raises(InvalidEvent) as exc:
            producer.send(event)
        producer.send(reward_event("r-ok"))
        assert producer.sent == 1
    assert exc.value.field == field
    assert [m.key for m in consume(broker.bootstrap_servers, topic, 1)] == [b"r-ok"]


@pytest.mark.parametrize("not_an_event", [["a", "list"], "text", b"{}", 42, None])
def test_non_objects_are_refused(not_an_event):
    with pytest.raises(InvalidEvent, match="must be an Event model or a dict") as exc:
        encode_event(not_an_event)
    assert exc.value.field == "(event)"


def test_oversized_events_are_refused():
    event = reward_event(source="x" * 5_000)
    encode_event(event, max_bytes=6_000)
    with pytest.raises(InvalidEvent, match="exceeds the 1000-byte limit") as exc:
        encode_event(event, max_bytes=1_000)
    assert exc.value.field == "(event)"


def test_values_json_cannot_carry_are_refused():
    event = {**reward_event(), "type": "rollout.started", "payload": {"metadata": {"tags": {"a", "b"}}}}
    with pytest.raises(InvalidEvent, match="not JSON-serialisable"):
        encode_event(event)


def test_options_are_checked():
    with pytest.raises(ValueError, match="compression"):
        EventProducer("127.0.0.1:1", compression="brotli")
    with pytest.raises(ValueError, match="connect_timeout_s"):
        EventProducer("127.0.0.1:1", connect_timeout_s=0)


def test_a_codec_without_its_library_is_refused_before_connecting(monkeypatch):
    monkeypatch.setitem(CODECS, "zstd", lambda: False)
    with pytest.raises(ValueError, match="'zstd' needs its Python library"):
        EventProducer("127.0.0.1:1", compression="zstd")


def test_a_model_that_is_not_an_event_is_refused():
    with pytest.raises(InvalidEvent) as exc:
        encode_event(Harness(name="agent", version="1"))
    assert exc.value.field == "type"


@pytest.mark.timeout(20)  # kafka-python's own default would wait 30 s: this guards our setting
def test_no_broker_raises_broker_unreachable_naming_what_to_check():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnreachable) as exc:
        EventProducer(address, connect_timeout_s=0.5)
    message = str(exc.value)
    assert address in message and "TRAJLAKE_BOOTSTRAP_SERVERS" in message and "trajlake broker" in message


@pytest.mark.timeout(60)
def test_flush_after_the_broker_died_raises_broker_unreachable():
    with EmbeddedBroker() as private:
        private.create_topic("events", partitions=1)
        producer = EventProducer(private.bootstrap_servers, topic="events", connect_timeout_s=1)
        producer.send(reward_event())
        producer.flush()
        private.kill()
        producer.send(reward_event(seq=1))
        with pytest.raises(BrokerUnreachable, match="flush timed out"):
            producer.flush(timeout_s=1)
        with pytest.raises(BrokerUnreachable):
            producer.close(timeout_s=1)
        producer.close()  # a second close does nothing
