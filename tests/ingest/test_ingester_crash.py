"""Crash safety: kill -9 the ingester at random points of a 50,000-event stream; nothing lost, nothing twice."""

import random
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from ingester_support import produce

from devkit.workload import WorkloadConfig, generate_events
from store.sql import connect

KILLS = 5


def start_ingester(broker, topic, lake, *extra: str) -> subprocess.Popen:
    """``trajlake ingest`` in static mode (no group join to wait for; offsets live in Delta)."""
    return subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", lake.root, "--bootstrap-servers",
         broker.bootstrap_servers, "--topic", topic, "--partitions", "0,1,2,3", "--batch-max-events", "2000",
         "--batch-max-ms", "300", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def events_version(lake) -> int:
    return lake.version("events") or -1


def wait_for_progress(lake, proc: subprocess.Popen, since: int, *, timeout_s: float = 90) -> None:
    """Block until the ingester committed a new events version (so a kill lands mid-stream, not mid-start)."""
    deadline = time.monotonic() + timeout_s
    while events_version(lake) <= since + 1:  # +1: the first start creates the empty table
        if proc.poll() is not None:
            raise AssertionError(f"ingester exited early: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("ingester made no progress")
        time.sleep(0.05)


@pytest.mark.slow
def test_kill_9_at_random_points_stores_each_event_exactly_once(broker, topic, lake):
    sent = list(generate_events(WorkloadConfig(tasks=210, rollouts_per_task=10, seed=11, min_calls=2, max_calls=8,
                                               max_context_tokens=256)))
    assert len(sent) >= 50_000
    chunks = [sent[i:i + 2500] for i in range(0, len(sent), 2500)]
    rng = random.Random(2026)
    for kill in range(KILLS):
        # Each ingester gets its share of the stream produced while it runs, so it always has events left to commit
        # and the kill lands mid-stream (one producer for the whole stream let a fast ingester catch up with it, and
        # a restart then had nothing to commit: "no progress").
        share = chunks[kill * len(chunks) // KILLS:(kill + 1) * len(chunks) // KILLS]
        producer = threading.Thread(target=lambda share=share: [
            produce(broker.bootstrap_servers, topic, c) or time.sleep(0.3) for c in share])
        producer.start()
        proc = start_ingester(broker, topic, lake)
        wait_for_progress(lake, proc, events_version(lake))
        time.sleep(rng.uniform(0.0, 1.5))  # a random point: mid-poll, mid-decode or mid-commit
        proc.kill()
        assert proc.wait(30) == -9
        producer.join()
    final = start_ingester(broker, topic, lake, "--stop-after-idle-s", "3")
    assert final.wait(240) == 0, final.stderr.read().decode()[-2000:]

    con = connect(lake)
    stored = con.sql("SELECT event_id, type, kafka_partition, kafka_offset FROM events").fetchall()
    by_id = Counter(row[0] for row in stored)
    assert max(by_id.values()) == 1, "an event was stored twice"
    assert set(by_id) == {e["event_id"] for e in sent}, "an event was lost"
    assert len({(p, o) for _, _, p, o in stored}) == len(stored)

    types = Counter(row[1] for row in stored)
    for table, event_type in [("llm_requests", "llm.request"), ("llm_responses", "llm.response"),
                              ("tool_calls", "tool.call"), ("tool_results", "tool.result"), ("rewards", "reward"),
                              ("rollout_starts", "rollout.started"), ("rollout_ends", "rollout.finished")]:
        rows, distinct = con.sql(f"SELECT count(*), count(DISTINCT event_id) FROM {table}").fetchone()
        assert rows == distinct == types[event_type], table

    first_copy = {}
    for e in sent:
        first_copy.setdefault(e["event_id"], e)
    tokens = con.sql("SELECT event_id, prompt_token_ids FROM llm_requests").fetchall()
    assert all(ids == first_copy[eid]["payload"]["prompt_token_ids"] for eid, ids in tokens)
    assert con.sql("SELECT count(*) FROM quarantine").fetchone()[0] == 0
