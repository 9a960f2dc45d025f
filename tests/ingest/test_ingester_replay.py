"""Bounded replay: a restart re-reads at most one batch, whatever tables were idle; a crash between the
``events`` commit and the typed tables' commits leaves no typed row missing; markers reach the log end."""

import subprocess
import sys
import time
from collections import Counter

import pytest
from deltalake import DeltaTable
from ingester_support import produce, stream, wire_event
from kafka import KafkaConsumer

from ingest.ingester import IngesterConfig, ingest_until_idle
from schemas.tables import TYPED_TABLES
from store.commit import MarkedTable, marker_app_id

BATCH = 100


def config(broker, topic, lake, **kw) -> IngesterConfig:
    return IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic,
                          group="trajlake-ingest", partitions=(0, 1, 2, 3), **{"batch_max_events": BATCH, **kw})


def stored(lake, table: str = "events") -> Counter:
    return Counter(lake.read(table, columns=["event_id"]).column("event_id").to_pylist())


def markers(lake, topic: str, table: str) -> dict[int, int | None]:
    dt = DeltaTable(lake.uri(table))
    return {p: dt.transaction_version(marker_app_id("trajlake-ingest", topic, p)) for p in range(4)}


def log_ends(broker, topic) -> dict[int, int]:
    """The last offset of each partition, from the records themselves (tansu's end offsets are wrong)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)
    ends: dict[int, int] = {}
    for m in consumer:
        ends[m.partition] = max(m.offset, ends.get(m.partition, -1))
    consumer.close()
    return ends


def test_restart_after_kill_9_replays_at_most_one_batch_although_tables_were_idle(broker, topic, lake):
    every_type = list(stream(5, seed=41))  # every table gets rows, hence markers
    produce(broker.bootstrap_servers, topic, every_type)
    ingest_until_idle(config(broker, topic, lake), idle_s=1.5)
    calls_only = [e for e in stream(250, seed=42) if e["type"].startswith("llm.")]  # then tools, rewards... idle
    produce(broker.bootstrap_servers, topic, calls_only)
    sent = len(every_type) + len(calls_only)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", lake.root, "--bootstrap-servers",
         broker.bootstrap_servers, "--topic", topic, "--partitions", "0,1,2,3", "--batch-max-events", str(BATCH),
         "--batch-max-ms", "300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not lake.exists("events") or sum(stored(lake).values()) < sent:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the ingester did not store everything"
        time.sleep(0.2)
    proc.kill()
    assert proc.wait(30) == -9

    stats = ingest_until_idle(config(broker, topic, lake), idle_s=1.5)
    assert stats.replayed <= BATCH, f"replayed {stats.replayed} messages after a restart (batch size {BATCH})"
    assert stats.events == 0 and stats.consumed == stats.replayed
    for table in ("tool_calls", "rewards", "quarantine"):  # idle tables' markers kept up
        assert markers(lake, topic, table) == markers(lake, topic, "events"), table


class Crash(BaseException):
    """Stands in for kill -9 between two commits of one batch."""


def test_crash_between_events_and_typed_commits_leaves_no_typed_row_missing(broker, topic, lake, monkeypatch):
    sent = list(stream(30, seed=43))
    produce(broker.bootstrap_servers, topic, sent)
    commit = MarkedTable.commit

    def crash_before_llm_requests(self, rows, last_offsets, **kw):
        if self.name == "llm_requests" and rows.num_rows:
            raise Crash
        return commit(self, rows, last_offsets, **kw)

    monkeypatch.setattr(MarkedTable, "commit", crash_before_llm_requests)
    with pytest.raises(Crash):
        ingest_until_idle(config(broker, topic, lake, batch_max_events=10_000), idle_s=1.5)
    assert stored(lake) and not stored(lake, "llm_requests")  # events landed, llm_requests did not
    monkeypatch.setattr(MarkedTable, "commit", commit)

    stats = ingest_until_idle(config(broker, topic, lake), idle_s=1.5)
    assert stats.replayed > 0 and stats.events + stats.replayed == len(sent)
    assert max(stored(lake).values()) == 1 and set(stored(lake)) == {e["event_id"] for e in sent}
    for event_type, (name, _) in TYPED_TABLES.items():
        typed = stored(lake, name)
        assert sorted(typed.elements()) == sorted(e["event_id"] for e in sent if e["type"] == event_type), name


def test_events_markers_reach_the_log_end_when_the_last_batch_holds_only_duplicates_and_bad_input(
        broker, topic, lake):
    good = list(stream(10, seed=44))
    produce(broker.bootstrap_servers, topic, good)
    ingest_until_idle(config(broker, topic, lake), idle_s=1.5)
    bad = json_bytes(wire_event("reward", {"name": "r"}, rollout="r-44-0", seq=99))  # no value: invalid
    produce(broker.bootstrap_servers, topic, good[:40])
    produce(broker.bootstrap_servers, topic, [bad], key=b"r-44-0")
    stats = ingest_until_idle(config(broker, topic, lake), idle_s=1.5)
    assert (stats.events, stats.duplicates, stats.quarantined) == (0, 40, 1)
    ends = log_ends(broker, topic)
    assert {p: m for p, m in markers(lake, topic, "events").items() if p in ends} == ends


def json_bytes(event: dict) -> bytes:
    import json

    return json.dumps(event).encode()
