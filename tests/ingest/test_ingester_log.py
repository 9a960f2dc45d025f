"""A log that went backwards is never skipped: broker restarted (memory storage), topic recreated.

The ingester refuses loudly (``LogWentBackwards``, exit code 3), writes nothing of the new log, and
``--recover`` then stores every event exactly once, old and new.
"""

import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from ingester_support import produce, stream
from kafka.admin import KafkaAdminClient

from devkit.broker import EmbeddedBroker
from ingest.consumer import AssignmentFlag, open_consumer
from ingest.ingester import IngesterConfig, IngestStats, ingest_until_idle, run_ingester
from ingest.log_check import LogWentBackwards
from schemas.tables import TYPED_TABLES
from store.compact import compact
from tests.store.test_prejoin import answers, raw_answers

PARTITIONS = (0, 1, 2, 3)


@pytest.fixture
def restartable() -> EmbeddedBroker:
    """A broker of its own (memory storage), restarted on the same port by ``restart``."""
    with EmbeddedBroker() as b:
        yield b


def restart(broker: EmbeddedBroker, topic: str) -> None:
    broker.kill()
    broker.start()
    broker.create_topic(topic, partitions=len(PARTITIONS))


def config(broker, topic, lake, **kw) -> IngesterConfig:
    return IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group="g",
                          partitions=PARTITIONS, batch_max_ms=300, **kw)


def stored(lake, table: str = "events") -> Counter:
    return Counter(lake.read(table, columns=["event_id"]).column("event_id").to_pylist())


def assert_exactly_once(lake, sent: list[dict]) -> None:
    ids = stored(lake)
    assert max(ids.values()) == 1, "an event was stored twice"
    assert set(ids) == {e["event_id"] for e in sent}, "an event was lost (or one not sent was stored)"
    for event_type, (name, _) in TYPED_TABLES.items():
        typed = stored(lake, name)
        assert sorted(typed.elements()) == sorted({e["event_id"] for e in sent if e["type"] == event_type}), name


def wait_for(condition, *, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_broker_restarted_under_a_running_ingester_is_refused_then_recovered(restartable, lake):
    topic = "events"
    restartable.create_topic(topic, partitions=len(PARTITIONS))
    before = list(stream(30, seed=21))
    produce(restartable.bootstrap_servers, topic, before)
    latest: dict[str, IngestStats] = {}
    outcome: dict[str, BaseException] = {}

    def ingest() -> None:
        try:
            run_ingester(config(restartable, topic, lake), threading.Event(),
                         on_progress=lambda st: latest.update(stats=st))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    ingester = threading.Thread(target=ingest, daemon=True)
    ingester.start()
    wait_for(lambda: "stats" in latest and latest["stats"].events == len(before), what="the first events stored")

    restart(restartable, topic)  # memory storage: the log starts again at offset 0
    after = list(stream(40, seed=22)) + before[:20]  # new events, and some old ones sent again
    produce(restartable.bootstrap_servers, topic, after)
    ingester.join(120)
    assert not ingester.is_alive(), "the ingester kept running on a log that went backwards"
    error = outcome.get("error")
    assert isinstance(error, LogWentBackwards), repr(error)
    assert f"topic {topic!r}" in str(error) and "marker" in str(error) and "--recover" in str(error)
    assert set(stored(lake)) == {e["event_id"] for e in before}, "something of the new log was written"

    stats = ingest_until_idle(config(restartable, topic, lake, recover=True), idle_s=2)
    assert stats.recovered_partitions == PARTITIONS
    assert_exactly_once(lake, before + after)
    assert stats.duplicates == 20 and stats.events == len(after) - 20
    assert stats.consumed == stats.events + stats.duplicates + stats.quarantined + stats.replayed

    later = list(stream(5, seed=23))  # and the ingester runs normally on the new log afterwards
    produce(restartable.bootstrap_servers, topic, later)
    again = ingest_until_idle(config(restartable, topic, lake), idle_s=2)
    assert again.events == len(later) and again.recovered_partitions == ()
    assert_exactly_once(lake, before + after + later)


def ingest_cli(broker, topic, lake, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", lake.root, "--bootstrap-servers",
         broker.bootstrap_servers, "--topic", topic, "--group", "g", "--partitions", "0,1,2,3",
         "--stop-after-idle-s", "2", *extra],
        capture_output=True, text=True, timeout=180,
    )


@pytest.mark.parametrize("new_log", ["shorter", "longer"])
def test_topic_deleted_and_recreated_is_refused_at_start_then_recovered(broker, topic, lake, new_log, tmp_path):
    before = list(stream(20, seed=31))
    produce(broker.bootstrap_servers, topic, before)
    assert ingest_cli(broker, topic, lake).returncode == 0
    compact(lake, vacuum_retention=None)  # pre-joined tables marked at the old log's offsets

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    admin.delete_topics([topic])
    admin.close()
    wait_for(lambda: _recreated(broker, topic), what="the topic to be recreated")
    after = list(stream(5 if new_log == "shorter" else 40, seed=32))
    after += before[-8:]  # ends with a spool's re-sends: a partition's new marker is then a duplicate
    produce(broker.bootstrap_servers, topic, after)

    refused = ingest_cli(broker, topic, lake)
    assert refused.returncode == 3, refused.stderr
    message = " ".join(refused.stderr.split())
    assert f"topic '{topic}'" in message and "partition" in message and "trajlake ingest --recover" in message
    assert "Traceback" not in refused.stderr
    assert set(stored(lake)) == {e["event_id"] for e in before}

    recovered = ingest_cli(broker, topic, lake, "--recover")
    assert recovered.returncode == 0, recovered.stderr
    assert_exactly_once(lake, before + after)
    # the new log's offsets start below the compaction marks: its rows still reach the views, and so do the rows
    # that arrive after the next compaction (which must not mark the old log's offsets)
    assert answers(lake) == raw_answers(lake, tmp_path)
    compact(lake, vacuum_retention=None)
    later = list(stream(3, seed=33))  # a normal start passes the check afterwards and ingests
    produce(broker.bootstrap_servers, topic, later)
    assert ingest_cli(broker, topic, lake).returncode == 0
    assert_exactly_once(lake, before + after + later)
    assert answers(lake) == raw_answers(lake, tmp_path)


def _recreated(broker, topic) -> bool:
    try:
        broker.create_topic(topic, partitions=len(PARTITIONS))
    except Exception:  # noqa: BLE001 - the deletion is still in progress
        return False
    return True


def test_broker_restarted_with_a_persistent_log_is_no_alarm_and_loses_nothing(s3_server, s3_lake):
    """tansu on s3:// storage keeps every record at its offset across SIGKILL (its end offsets are still wrong):
    the ingester must carry on, neither refusing nor skipping. The lake is on the same object store."""
    lake = s3_lake
    broker = EmbeddedBroker(storage_url=f"s3://{s3_server.new_bucket()}/", env=s3_server.env).start()
    topic = "events"
    try:
        broker.create_topic(topic, partitions=len(PARTITIONS))
        before, after = list(stream(30, seed=61)), list(stream(30, seed=62))
        produce(broker.bootstrap_servers, topic, before)
        latest: dict[str, IngestStats] = {}
        stop, outcome = threading.Event(), {}

        def ingest() -> None:
            try:
                run_ingester(config(broker, topic, lake), stop, on_progress=lambda st: latest.update(stats=st))
            except BaseException as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        ingester = threading.Thread(target=ingest, daemon=True)
        ingester.start()
        wait_for(lambda: "stats" in latest and latest["stats"].events == len(before), what="the first events")
        broker.kill()
        broker.start()
        produce(broker.bootstrap_servers, topic, after + before[:10])  # and a spool's re-sends
        wait_for(lambda: latest["stats"].events >= len(before) + len(after) or "error" in outcome,
                 what="the events sent after the restart", timeout_s=120)
        stop.set()
        ingester.join(60)
        assert "error" not in outcome, repr(outcome.get("error"))
        assert_exactly_once(lake, before + after)
    finally:
        broker.kill()


def test_the_consumer_never_resets_its_own_position(broker, topic):
    """An out-of-range fetch must reach the ingester as an error (``ingester._Loop._out_of_range``)."""
    consumer = open_consumer(broker.bootstrap_servers, topic, group=None, partitions=[0], flag=AssignmentFlag())
    try:
        assert consumer.config["auto.offset.reset"] == "error" and consumer.config["enable.auto.commit"] is False
    finally:
        consumer.close()
