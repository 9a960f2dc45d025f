"""The emitter with an in-memory sink: delivery, spooling while down, ordered replay, drops, durability."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone

from gateway_helpers import memory_emitter, wait_for

from ingest.spool import Spool
from schemas.events import RewardEvent


def reward(i: int, rollout: str = "r1") -> RewardEvent:
    return RewardEvent(
        event_id=f"e{i}", type="reward", schema_version=1, ts=datetime.now(timezone.utc), tenant="acme",
        task_id="t", rollout_id=rollout, seq=i, payload={"name": "score", "value": float(i)},
    )


def ids(sink) -> list[str]:
    return [json.loads(v)["event_id"] for _, v in sink.records]


def test_events_reach_the_sink_keyed_by_rollout(tmp_path):
    emitter, sink = memory_emitter(tmp_path)
    emitter.start()
    emitter.submit(lambda: [reward(0), reward(1, rollout="r2")])
    wait_for(lambda: len(sink.records) == 2)
    emitter.close()
    assert [k for k, _ in sink.records] == [b"r1", b"r2"] and emitter.produced == 2 and emitter.spooled == 0


def test_broker_down_spools_then_replays_everything_once_in_order(tmp_path):
    emitter, sink = memory_emitter(tmp_path)
    sink.down = True
    emitter.start()
    for i in range(20):
        emitter.submit(lambda i=i: [reward(i)])
    wait_for(lambda: emitter.spooled == 20, what="20 spooled events")
    assert sink.records == [] and not emitter.broker_up and emitter.spool.depth_records == 20
    sink.down = False
    for i in range(20, 25):
        emitter.submit(lambda i=i: [reward(i)])
    wait_for(lambda: len(sink.records) == 25, what="replay")
    wait_for(lambda: emitter.spool.depth_records == 0, what="empty spool")
    emitter.close()
    assert ids(sink) == [f"e{i}" for i in range(25)]
    assert emitter.broker_up and emitter.replayed >= 20


def test_spool_survives_a_restart_of_the_emitter(tmp_path):
    emitter, sink = memory_emitter(tmp_path)
    sink.down = True
    emitter.start()
    emitter.submit(lambda: [reward(i) for i in range(5)])
    wait_for(lambda: emitter.spooled == 5)
    emitter.close()
    again, sink2 = memory_emitter(tmp_path)
    assert again.spool.depth_records == 5
    again.start()
    wait_for(lambda: len(sink2.records) == 5)
    again.close()
    assert ids(sink2) == [f"e{i}" for i in range(5)]


def test_full_spool_drops_newest_loudly_and_counts(tmp_path, caplog):
    emitter, sink = memory_emitter(tmp_path, max_bytes=2000)
    sink.down = True
    emitter.start()
    for i in range(30):
        emitter.submit(lambda i=i: [reward(i)])
    wait_for(lambda: emitter.spooled + emitter.dropped == 30)
    emitter.close()
    assert emitter.dropped > 0 and emitter.spool_full
    assert "SPOOL FULL" in caplog.text
    kept = [json.loads(r.value)["event_id"] for r in Spool(tmp_path / "spool", max_bytes=2000).read(max_records=99)]
    assert kept
    assert kept == [f"e{i}" for i in range(len(kept))]  # the oldest are kept, the newest dropped


def test_on_durable_reports_delivery_and_drops(tmp_path):
    emitter, sink = memory_emitter(tmp_path, max_bytes=600)
    emitter.start()
    results: list[bool] = []
    done = threading.Event()
    emitter.submit(lambda: [reward(0)], on_durable=lambda ok: (results.append(ok), done.set()))
    assert done.wait(10) and results == [True]
    sink.down = True
    done.clear()
    emitter.submit(lambda: [reward(i) for i in range(1, 20)], on_durable=lambda ok: (results.append(ok), done.set()))
    assert done.wait(10) and results == [True, False]
    emitter.close()


def test_a_failing_job_is_counted_and_does_not_stop_the_thread(tmp_path, caplog):
    emitter, sink = memory_emitter(tmp_path)
    emitter.start()

    def broken():
        raise ValueError("bad answer")

    emitter.submit(broken)
    emitter.submit(lambda: [reward(1)])
    wait_for(lambda: len(sink.records) == 1)
    emitter.close()
    assert emitter.invalid == 1 and "event build failed" in caplog.text


def test_a_job_that_fails_to_build_is_not_reported_durable(tmp_path):
    """A caller waiting for durability was told True for a job whose events were never built (review3: the HTTP
    answer said "accepted"); the other jobs of the same pass are delivered and reported as before."""
    emitter, sink = memory_emitter(tmp_path)
    results: dict[str, bool] = {}

    def broken():
        raise ValueError("bad answer")

    emitter.submit(broken, on_durable=lambda ok: results.update(broken=ok))
    emitter.submit(lambda: [reward(1)], on_durable=lambda ok: results.update(good=ok))
    emitter.start()  # both jobs taken in one pass
    wait_for(lambda: len(results) == 2)
    emitter.close()
    assert results == {"broken": False, "good": True} and ids(sink) == ["e1"]


def test_close_flushes_what_is_queued(tmp_path):
    emitter, sink = memory_emitter(tmp_path)
    emitter.start()
    for i in range(50):
        emitter.submit(lambda i=i: [reward(i)])
    emitter.close()
    assert len(sink.records) == 50
