"""The ingester against a real broker (tansu) and real Delta tables."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from ingester_support import produce, stream, wire_event
from kafka import KafkaConsumer, KafkaProducer

from ingest.consumer import BrokerUnreachable
from ingest.dead_letters import REASON_HEADER, SOURCE_HEADER
from ingest.ingester import IngesterConfig, IngestStats, ingest_until_idle, run_ingester
from store.sql import connect


def config(broker, topic, group, lake, **kw) -> IngesterConfig:
    return IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group, **kw)


def wait_for(condition, *, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def stored_ids(lake, table="events") -> list[str]:
    return lake.read(table, columns=["event_id"]).column("event_id").to_pylist() if lake.exists(table) else []


def test_end_to_end_sql_returns_exactly_the_tokens_sent(broker, topic, group, lake):
    sent = list(stream(300, seed=1))  # 3,300 events
    produce(broker.bootstrap_servers, topic, sent)
    stats = ingest_until_idle(config(broker, topic, group, lake, batch_max_events=1000), idle_s=2)
    assert stats.events == len(sent) and stats.quarantined == 0 and stats.batches >= 4

    con = connect(lake)
    requests = dict(con.sql("SELECT event_id, prompt_token_ids FROM llm_requests").fetchall())
    responses = {e: (ids, lps) for e, ids, lps in con.sql(
        "SELECT event_id, response_token_ids, logprobs FROM llm_responses").fetchall()}
    counts = dict(con.sql("SELECT type, count(*) FROM events GROUP BY type").fetchall())
    assert sum(counts.values()) == len(sent)
    for e in sent:
        p = e["payload"]
        if e["type"] == "llm.request":
            assert requests.pop(e["event_id"]) == p["prompt_token_ids"]
        elif e["type"] == "llm.response":
            ids, lps = responses.pop(e["event_id"])
            assert ids == p["response_token_ids"]
            assert lps == np.asarray(p["logprobs"], dtype=np.float32).tolist()
    assert not requests and not responses  # nothing extra
    log_tokens = con.sql("SELECT sum(len(token_ids)) FROM events").fetchone()[0]
    assert log_tokens == sum(len(e["payload"].get("prompt_token_ids") or e["payload"].get("response_token_ids") or [])
                             for e in sent)


def test_same_event_sent_twice_is_stored_once(broker, topic, group, lake):
    events = list(stream(5, seed=2))
    retry = events[3]
    produce(broker.bootstrap_servers, topic, [*events, retry])  # retry in the same batch
    first = ingest_until_idle(config(broker, topic, group, lake), idle_s=1.5)
    produce(broker.bootstrap_servers, topic, [retry, events[0]])  # retries after a restart
    second = ingest_until_idle(config(broker, topic, group, lake), idle_s=1.5)
    ids = stored_ids(lake)
    assert sorted(ids) == sorted(e["event_id"] for e in events)
    assert (first.duplicates, second.duplicates, second.events) == (1, 2, 0)
    assert stored_ids(lake, "llm_requests").count(retry["event_id"]) == (retry["type"] == "llm.request")


def bad_inputs() -> dict[str, tuple[bytes, str]]:
    """name -> (raw message, text the quarantine reason must contain)."""
    ok = wire_event("reward", {"name": "r", "value": 1.0}, rollout="bad", seq=0)

    def variant(**changes):
        return json.dumps({**ok, **changes}).encode()

    missing = {k: v for k, v in ok.items() if k != "task_id"}
    return {
        "malformed json": (b'{"event_id": "x", ', "not valid JSON"),
        "not an object": (b"[1, 2, 3]", "must be a JSON object"),
        "wrong type": (variant(seq="seven"), "seq"),
        "wrong token type": (json.dumps(wire_event("llm.request", {"call_id": "c", "prompt_token_ids": [1, "2"]},
                                                   rollout="bad", seq=1)).encode(), "prompt_token_ids"),
        "missing field": (json.dumps(missing).encode(), "task_id"),
        "unknown event type": (variant(type="llm.stream"), "unknown event type"),
        "newer schema_version": (variant(schema_version=99), "newer than this reader"),
        "schema_version not int": (variant(schema_version="1"), "must be an integer"),
        "oversized": (variant(payload={"name": "r", "value": 1.0, "source": "x" * 300_000}), "exceeds the 200000-byte limit"),
        "not utf-8": (b'{"event_id": "\xff\xfe"}', "not valid JSON"),
        # Python's json reads these, and they failed every encoder after validation: the batch, on every restart
        "lone surrogate in text": (json.dumps(wire_event("llm.response", {"call_id": "c", "text": "\ud800"},
                                                         rollout="bad", seq=2)).encode(), "payload.text: holds a lone"),
        "lone surrogate in a key": (json.dumps(wire_event("rollout.started", {"metadata": {"\udfff": 1}},
                                                          rollout="bad", seq=3)).encode(), "lone UTF-16 surrogate"),
        "lone surrogate event_id": (variant(event_id="\ud800", seq="x"), "event_id: holds a lone"),
        "integer of 5,000 digits": (variant(seq=0).replace(b'"seq": 0', b'"seq": ' + b"9" * 5000), "not valid JSON"),
    }


def test_bad_input_is_quarantined_with_reason_and_valid_events_around_it_are_stored(broker, topic, group, lake):
    bad = bad_inputs()
    good = list(stream(4, seed=3))
    messages, cursor = [], 0
    for raw, _ in bad.values():  # interleave: good, bad, good, bad, ... on one partition
        messages += [*good[cursor:cursor + 4], raw]
        cursor += 4
    messages += good[cursor:]
    produce(broker.bootstrap_servers, topic, [m if isinstance(m, bytes) else json.dumps(m).encode() for m in messages],
            key=b"one-key")
    stats = ingest_until_idle(config(broker, topic, group, lake, max_event_bytes=200_000), idle_s=1.5)

    assert sorted(stored_ids(lake)) == sorted(e["event_id"] for e in good)
    assert stats.quarantined == len(bad)
    quarantined = {bytes(r["raw"]): r for r in lake.read("quarantine").to_pylist()}
    for name, (raw, reason) in bad.items():
        assert raw in quarantined, f"{name} not quarantined whole"
        assert reason in quarantined[raw]["reason"], (name, quarantined[raw]["reason"])
    assert quarantined[bad["wrong type"][0]]["event_id"] is not None
    assert quarantined[bad["lone surrogate event_id"][0]]["event_id"] is None, "no text column can hold it"

    dlq = KafkaConsumer(f"{topic}.dlq", bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                        consumer_timeout_ms=3000)
    letters = {m.value: dict(m.headers) for m in dlq}
    dlq.close()
    assert set(letters) == set(quarantined)
    row = quarantined[bad["missing field"][0]]
    headers = letters[bad["missing field"][0]]
    assert headers[REASON_HEADER].decode() == row["reason"]
    assert headers[SOURCE_HEADER].decode() == f"{topic}:{row['kafka_partition']}:{row['kafka_offset']}"


def test_null_message_value_is_quarantined(broker, topic, group, lake):
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    producer.send(topic, key=b"k", value=None)
    producer.flush()
    producer.close()
    ingest_until_idle(config(broker, topic, group, lake, dlq_topic=""), idle_s=1.5)
    assert "empty message" in lake.read("quarantine").column("reason").to_pylist()[0]


def test_two_ingesters_in_one_group_split_partitions_and_store_everything_once(broker, topic, group, lake):
    first_half, second_half = list(stream(60, seed=4)), list(stream(60, seed=5))
    latest: dict[str, IngestStats] = {}
    stop = threading.Event()

    def ingester(name: str) -> threading.Thread:
        def note(stats: IngestStats) -> None:
            latest[name] = stats
        cfg = config(broker, topic, group, lake, batch_max_ms=300)
        t = threading.Thread(target=run_ingester, args=(cfg, stop), kwargs={"on_progress": note}, daemon=True)
        t.start()
        return t

    a = ingester("a")
    produce(broker.bootstrap_servers, topic, first_half)
    wait_for(lambda: "a" in latest and latest["a"].events == len(first_half), what="a to store the first half")
    b = ingester("b")
    wait_for(lambda: "b" in latest and latest["b"].partitions and len(latest["a"].partitions) < 4,
             what="the group to rebalance", timeout_s=90)
    produce(broker.bootstrap_servers, topic, second_half)
    sent = {e["event_id"] for e in first_half + second_half}
    wait_for(lambda: latest["a"].events + latest["b"].events >= len(sent), what="both halves", timeout_s=90)
    stop.set()
    a.join(30)
    b.join(30)
    ids = stored_ids(lake)
    assert sorted(ids) == sorted(sent)
    assert set(latest["a"].partitions).isdisjoint(latest["b"].partitions)
    assert latest["b"].events > 0
    for table in ("llm_requests", "rollout_starts"):
        typed = stored_ids(lake, table)
        assert len(typed) == len(set(typed)) == sum(1 for e in first_half + second_half
                                                    if e["type"] == {"llm_requests": "llm.request"}.get(table, "rollout.started"))


def test_sigterm_commits_the_batch_in_hand(broker, topic, group, lake, tmp_path):
    sent = list(stream(40, seed=6))
    produce(broker.bootstrap_servers, topic, sent)
    log = tmp_path / "ingest.log"
    env = {**os.environ, "TRAJLAKE_LOG_LEVEL": "DEBUG"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", lake.root, "--bootstrap-servers",
             broker.bootstrap_servers, "--topic", topic, "--partitions", "0,1,2,3", "--batch-max-ms", "600000"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
        in_hand = f"batch_in_hand={len(sent)} ".encode()
        wait_for(lambda: in_hand in log.read_bytes(), what="every event in the ingester's (never due) batch")
        assert stored_ids(lake) == []  # nothing committed before the signal
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert sorted(stored_ids(lake)) == sorted(e["event_id"] for e in sent)
    assert "every consumed message is committed" in log.read_text()


def test_unreachable_broker_is_a_clear_error(lake):
    with pytest.raises(BrokerUnreachable, match="TRAJLAKE_BOOTSTRAP_SERVERS"):
        run_ingester(IngesterConfig(lake=lake.root, bootstrap_servers="127.0.0.1:1", bootstrap_timeout_ms=1000),
                     threading.Event())


def test_unreachable_broker_leaves_the_lake_untouched(lake):
    with pytest.raises(BrokerUnreachable):
        ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers="127.0.0.1:1", bootstrap_timeout_ms=500))
    assert not lake.exists("events")


def test_a_batch_the_consumer_cannot_read_is_a_warning_not_silence(broker, topic, group, lake, monkeypatch, caplog):
    """A gzip record batch whose payload does not decompress: librdkafka retries it for ever and the partition's
    later records wait; that was logged at DEBUG only (review3). Now a warning names the partition and the offset."""
    import kafka.record.default_records as default_records

    events = list(stream(1, seed=9))

    def send(batch: list[dict], *, damaged: bool) -> None:
        with monkeypatch.context() as patched:
            if damaged:
                patched.setattr(default_records, "gzip_encode", lambda data: b"\x1f\x8b not gzip " + bytes(20))
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, compression_type="gzip")
            for e in batch:
                producer.send(topic, partition=0, key=b"k", value=json.dumps(e).encode())
            producer.flush()
            producer.close()

    send(events[:4], damaged=False)
    send(events[4:8], damaged=True)
    caplog.set_level(logging.WARNING, logger="ingest.consumer")
    ingest_until_idle(config(broker, topic, group, lake, dlq_topic=""), idle_s=3.0)
    assert sorted(stored_ids(lake)) == sorted(e["event_id"] for e in events[:4])
    warnings = [r.getMessage() for r in caplog.records if r.name == "ingest.consumer"]
    assert len(warnings) == 1 and "partition 0" in warnings[0] and "cannot be read" in warnings[0], warnings
