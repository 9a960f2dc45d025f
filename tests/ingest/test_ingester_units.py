"""Unit tests of the ingester's parts, with fake Kafka records (no broker)."""

import json
from collections import namedtuple

import pytest
from ingester_support import stream, wire_event

from ingest.batch import Batch
from ingest.dedupe import SeenEventIds
from ingest.ingester import IngesterConfig
from ingest.rejected import RejectedInput
from schemas.tables import EVENTS
from store.commit import MarkedTable

Record = namedtuple("Record", "topic partition offset key value")


def records(messages, partition=0, start=0):
    return [Record("t", partition, start + i, b"k", m if isinstance(m, bytes) or m is None else json.dumps(m).encode())
            for i, m in enumerate(messages)]


def test_first_copy_wins_and_a_replay_decides_the_same():
    seen = SeenEventIds(max_ids=10)
    assert not seen.is_duplicate(("a", "e1"), 0, 5)
    assert seen.is_duplicate(("a", "e1"), 0, 9)  # a producer retry
    assert not seen.is_duplicate(("a", "e1"), 0, 5)  # the original, replayed after a crash
    assert seen.is_duplicate(("a", "e1"), 1, 5)
    assert not seen.is_duplicate(("b", "e1"), 0, 7)  # another tenant's event with the same id
    assert seen.first_copy(("a", "e1")) == (0, 5)


def test_seen_ids_are_bounded_oldest_first():
    seen = SeenEventIds(max_ids=2)
    for i, event_id in enumerate(["a", "b", "c"]):
        seen.is_duplicate(("t", event_id), 0, i)
    assert len(seen) == 2
    assert not seen.is_duplicate(("t", "a"), 0, 99)  # evicted: the bound is documented
    with pytest.raises(ValueError, match="max_ids"):
        SeenEventIds(max_ids=0)


def test_seen_ids_load_from_the_events_table(lake):
    events = list(stream(1, seed=9))
    batch = Batch()
    batch.add(records(events, partition=2))
    decoded = batch.decode(SeenEventIds(), max_event_bytes=10_000)
    MarkedTable(lake, "events", EVENTS, group="g", topic="t").commit(decoded.events, decoded.last_offsets,
                                                                     refresh_offsets=0)
    seen = SeenEventIds()
    assert seen.load(lake, topic="t", partitions=[2]) == len(events)
    assert seen.is_duplicate(("acme", events[0]["event_id"]), 2, 1000)
    assert seen.load(lake, topic="t", partitions=[0]) == 0


def test_batch_decode_sorts_good_duplicate_and_bad():
    good = list(stream(1, seed=10))
    batch = Batch()
    batch.add(records([*good, good[0], b"{", None, wire_event("reward", {"name": "r"}, rollout="x", seq=0)], start=7))
    assert len(batch) == len(good) + 4 and batch.bytes > 0
    decoded = batch.decode(SeenEventIds(), max_event_bytes=10_000)
    assert decoded.events.column("event_id").to_pylist() == [e["event_id"] for e in good]
    assert decoded.duplicates == 1
    assert [r.field for r in decoded.rejected] == ["(event)", "(event)", "payload.value"]
    assert decoded.rejected[2].event_id is not None and decoded.rejected[1].raw == b""
    assert decoded.last_offsets == {0: 7 + len(good) + 3}


def test_oversized_event_is_rejected_whole_without_parsing():
    big = json.dumps(wire_event("reward", {"name": "r", "value": 1.0, "source": "x" * 5000}, rollout="x", seq=0)).encode()
    batch = Batch()
    batch.add(records([big]))
    (rejected,) = batch.decode(SeenEventIds(), max_event_bytes=1000).rejected
    assert rejected.raw == big and "exceeds the 1000-byte limit" in rejected.reason and rejected.event_id is None


def test_an_input_its_producer_rejected_is_quarantined_with_the_producers_reason():
    key, value = RejectedInput("acme", "r-1", "(span)", "unsupported operation 'embeddings'", {"span_id": "a1"}).record()
    forged = json.dumps({"trajlake_rejected": {"field": 3}}).encode()  # not an envelope: validated as an event
    batch = Batch()
    batch.add([Record("t", 0, 0, key, value), *records([forged], start=1)])
    decoded = batch.decode(SeenEventIds(), max_event_bytes=100_000)
    (kept, other) = decoded.rejected
    assert (kept.field, kept.raw, kept.key) == ("(span)", value, b"r-1")
    assert "rejected by the producer: unsupported operation 'embeddings'" in kept.reason
    assert other.field != "(span)" and "producer" not in other.reason


def test_dead_letter_topic_defaults_to_topic_dot_dlq():
    assert IngesterConfig(lake="l", bootstrap_servers="b", topic="ev").dead_letter_topic == "ev.dlq"
    assert IngesterConfig(lake="l", bootstrap_servers="b", dlq_topic="").dead_letter_topic == ""


def test_input_the_contract_cannot_process_is_quarantined_not_raised():
    deep = wire_event("tool.call", {"call_id": "c", "name": "n", "arguments": "X"}, rollout="x", seq=0)
    deep = json.dumps(deep).replace('"X"', "[" * 5000 + "]" * 5000).encode()
    old = wire_event("reward", {"name": "r", "value": 1.0}, rollout="x", seq=1)
    old["ts"] = "0001-01-01T00:00:00+01:00"  # before year 1 once in UTC
    batch = Batch()
    batch.add(records([deep, old, b"\xef\xbb\xbf{}", json.dumps(old).encode().replace(b'"r"', b'"\xff"')]))
    decoded = batch.decode(SeenEventIds(), max_event_bytes=100_000)
    assert decoded.events.num_rows == 0
    reasons = [r.reason for r in decoded.rejected]
    assert "nested too deeply" in reasons[0] and "out of range" in reasons[1]
    assert all(r.field for r in decoded.rejected) and len(reasons) == 4


def test_a_replay_below_the_marker_is_checked_against_what_the_lake_holds():
    events = list(stream(1, seed=11))
    first = Batch()
    first.add(records(events, start=100))
    seen = SeenEventIds()
    first.decode(seen, max_event_bytes=100_000)  # what the lake holds: these events at 100, 101, ...
    marker = {0: 100 + len(events) - 1}

    replay = Batch()
    replay.add(records([*events, events[0]], start=100))  # the same messages, then a retry above the marker
    decoded = replay.decode(seen, max_event_bytes=100_000, replayed_through=marker)
    assert decoded.unheld == [] and decoded.events.num_rows == len(events) and decoded.duplicates == 1

    strangers = list(stream(1, seed=12))  # a log that went backwards: other events at the same offsets
    changed = Batch()
    changed.add(records(strangers, start=100))
    decoded = changed.decode(seen, max_event_bytes=100_000, replayed_through=marker)
    assert decoded.events.num_rows == 0
    assert [(u.offset, u.event_id) for u in decoded.unheld] == [(100 + i, e["event_id"])
                                                                for i, e in enumerate(strangers)]


def test_an_out_of_range_fetch_is_checked_against_the_log(lake):
    from ingest.consumer import AssignmentFlag, OutOfRange
    from ingest.ingester import _Loop, _Tables
    from ingest.log_check import LogWentBackwards

    class Guard:
        def __init__(self, problems):
            self.problems = problems

        def recheck(self, partitions):
            return self.problems

    class Consumer:
        refetched: list[int] = []

        def refetch(self, partitions):
            self.refetched.extend(partitions)

    def loop(guard, consumer=None) -> _Loop:
        config = IngesterConfig(lake=lake.root, bootstrap_servers="unused", topic="t")
        made = _Loop(config, lake, _Tables(lake, group="g", topic="t"), consumer, None, AssignmentFlag(), None, None)
        made.guard = guard
        return made

    out_of_range = OutOfRange([0])
    consumer = Consumer()
    loop(Guard({}), consumer)._out_of_range(out_of_range)  # the log still holds what was read (tansu's end offsets)
    assert consumer.refetched == [0]  # fetched again from where it was, never reset
    with pytest.raises(LogWentBackwards, match="partition 0: marker 499"):
        loop(Guard({0: "marker 499, but the log holds no record at offset 499"}))._out_of_range(out_of_range)



class FakeProbe:
    """Serves records from a dict, and nothing at the offsets in ``silent`` (a slow broker)."""

    def __init__(self, log: dict[int, bytes], silent: set[int] = frozenset()):
        self.log, self.silent = log, silent

    def read(self, offsets):
        out = {}
        for p, wanted in offsets.items():
            at = min(self.log, default=None) if wanted is None else wanted
            out[p] = None if at in self.silent or at not in self.log else (at, self.log[at], None)
        return out

    def end_offsets(self, partitions):
        return {p: max(self.log, default=-1) + 1 for p in partitions}


def test_a_record_the_broker_does_not_serve_is_no_false_alarm():
    from ingest.log_check import LogGuard, LogUnverifiable

    lake = {0: b"a", 1: b"b", 2: b"c"}  # what the lake holds, per offset of partition 0
    lake_has = lambda p, o, value, key: lake.get(o) == value  # noqa: E731

    same_log_slow = LogGuard(FakeProbe({0: b"a", 1: b"b", 2: b"c"}, silent={2}), topic="t", group="g",
                             lake_has=lake_has)
    with pytest.raises(LogUnverifiable):  # tansu on S3 after a restart: nothing yet at the marker
        same_log_slow.check_markers({0: 2})

    restarted = LogGuard(FakeProbe({0: b"x"}), topic="t", group="g", lake_has=lake_has)
    assert "is not the one the lake holds" in restarted.check_markers({0: 2})[0]
    emptied = LogGuard(FakeProbe({}), topic="t", group="g", lake_has=lake_has)
    assert "the log is empty" in emptied.check_markers({0: 2})[0]

    same_log = LogGuard(FakeProbe({0: b"a", 1: b"b", 2: b"c"}), topic="t", group="g", lake_has=lake_has)
    assert same_log.check_markers({0: 2}) == {}
    same_log.probe.log[2] = b"z"  # the log changed under a running ingester
    assert "changed since it was read" in same_log.recheck([0])[0]
