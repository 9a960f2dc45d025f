from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

import store.commit
from schemas.tables import EVENTS, EVENTS_TABLE, QUARANTINE
from store.commit import CommitContention, MarkedTable, OffsetConflict, marker_app_id, resume_offsets
from store.event_rows import KafkaCoordinates, Rejected, quarantine_table


def rows(partition: int, offsets) -> pa.Table:
    return quarantine_table([Rejected(b"x", "f", "r", None, KafkaCoordinates("t", partition, o)) for o in offsets])


def table(lake, name="quarantine") -> MarkedTable:
    return MarkedTable(lake, name, QUARANTINE, group="g", topic="t")


def offsets(lake, name="quarantine"):
    return sorted(zip(*(lake.read(name, columns=["kafka_partition", "kafka_offset"]).to_pydict().values())))


def test_commit_writes_rows_and_markers_in_one_version(lake):
    t = table(lake)
    t.load([0, 1])
    assert t.commit(pa.concat_tables([rows(0, [0, 1]), rows(1, [5])]), {0: 1, 1: 5}, refresh_offsets=0) == 3
    assert lake.version("quarantine") == 1  # 0 = creation
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 1
    assert lake.marker("quarantine", marker_app_id("g", "t", 1)) == 5


def test_replayed_rows_at_or_below_the_marker_are_skipped(lake):
    first = table(lake)
    first.load([0])
    first.commit(rows(0, [0, 1, 2]), {0: 2}, refresh_offsets=0)
    again = table(lake)  # a restarted ingester replays offsets 1..4
    again.load([0])
    assert again.commit(rows(0, [1, 2, 3, 4]), {0: 4}, refresh_offsets=0) == 2
    assert offsets(lake) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]


def test_an_idle_table_commits_markers_only_when_they_trail(lake):
    t = table(lake)
    t.load([0])
    assert t.commit(rows(0, []), {0: 10}, refresh_offsets=100) == 0  # no marker yet: stale, committed
    version = lake.version("quarantine")
    t.commit(rows(0, []), {0: 60}, refresh_offsets=100)
    assert lake.version("quarantine") == version  # trails by 50 <= 100: skipped
    t.commit(rows(0, []), {0: 200}, refresh_offsets=100)
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 200


def test_markers_moved_by_another_writer_are_a_conflict(lake):
    mine, theirs = table(lake), table(lake)
    mine.load([0])
    theirs.load([0])
    theirs.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0)
    with pytest.raises(OffsetConflict, match="re-seeking"):
        mine.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0)
    assert offsets(lake) == [(0, 0), (0, 1)]


def test_resume_is_the_smallest_marker_plus_one(lake):
    a, b = table(lake, "quarantine"), MarkedTable(lake, EVENTS_TABLE, EVENTS, group="g", topic="t")
    assert resume_offsets([a, b], [0, 1]) == {0: None, 1: None}
    a.commit(rows(0, []), {0: 9, 1: 3}, refresh_offsets=0)
    b.commit(EVENTS.empty_table(), {0: 4}, refresh_offsets=0)
    assert resume_offsets([a, b], [0, 1]) == {0: 5, 1: None}


def deleting_first(monkeypatch, lake, *, times: int) -> list[int]:
    """Make the next ``times`` appends lose to a real concurrent delete (committed just before each).

    Someone else's rows (partition 7) are stored first; each delete removes one
    of them, rewriting a file that the append's snapshot holds: a real conflict.
    """
    lake.append("quarantine", rows(7, range(times)), schema=QUARANTINE)
    real, calls = store.commit.write_deltalake, []

    def write(*args, **kwargs):
        calls.append(1)
        if len(calls) <= times:
            lake.table("quarantine").delete(f"kafka_partition = 7 AND kafka_offset = {len(calls) - 1}")
        return real(*args, **kwargs)

    monkeypatch.setattr(store.commit, "write_deltalake", write)
    monkeypatch.setattr(store.commit, "RETRY_BACKOFF_S", 0.0)
    return calls


def test_a_commit_that_loses_to_a_concurrent_delete_is_retried(lake, monkeypatch):
    t = table(lake)
    t.load([0])
    t.commit(rows(0, [0]), {0: 0}, refresh_offsets=0)
    calls = deleting_first(monkeypatch, lake, times=2)
    assert t.commit(rows(0, [0, 1, 2]), {0: 2}, refresh_offsets=0) == 2  # offset 0 is already in
    assert len(calls) == 3 and t.retries == 2
    assert offsets(lake) == [(0, 0), (0, 1), (0, 2)]  # nothing lost, nothing doubled; theirs deleted
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 2


def test_a_commit_that_keeps_losing_gives_up_with_nothing_written(lake, monkeypatch):
    t = table(lake)
    t.load([0])
    deleting_first(monkeypatch, lake, times=3)
    monkeypatch.setattr(store.commit, "COMMIT_ATTEMPTS", 3)
    with pytest.raises(CommitContention, match="3 commit attempts.*restart the ingester"):
        t.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0)
    assert offsets(lake) == []
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) is None


def test_a_retried_commit_still_refuses_markers_another_writer_moved(lake, monkeypatch):
    mine, theirs = table(lake), table(lake)
    lake.append("quarantine", rows(7, [0]), schema=QUARANTINE)
    mine.load([0])
    theirs.load([0])
    real, calls = store.commit.write_deltalake, []

    def write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the delete makes "mine" retry; meanwhile "theirs" takes the partition over
            lake.table("quarantine").delete("kafka_partition = 7")
            monkeypatch.setattr(store.commit, "write_deltalake", real)
            theirs.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0)
        return real(*args, **kwargs)

    monkeypatch.setattr(store.commit, "write_deltalake", write)
    monkeypatch.setattr(store.commit, "RETRY_BACKOFF_S", 0.0)
    with pytest.raises(OffsetConflict):
        mine.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0)
    assert offsets(lake) == [(0, 0), (0, 1)]


def test_a_replay_that_ends_below_a_marker_does_not_move_it_back(lake):
    t = table(lake)
    t.load([0, 1])
    t.commit(rows(0, [0, 1, 2, 3]), {0: 3}, refresh_offsets=0)
    again = table(lake)  # restarted: another table's marker sent partition 0 back to offset 1
    again.load([0, 1])
    assert again.commit(pa.concat_tables([rows(0, [1, 2]), rows(1, [0])]), {0: 2, 1: 0}, refresh_offsets=0) == 1
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 3
    later = table(lake)
    later.load([0, 1])
    assert later.commit(rows(0, [3, 4]), {0: 4}, refresh_offsets=0) == 1
    assert offsets(lake) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0)]  # offset 3 once


def checkpoints(lake, name="quarantine") -> list[int]:
    log = Path(lake.uri(name)) / "_delta_log"
    return sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))


def test_a_table_reopened_after_its_commit_budget_still_sees_every_marker_and_conflict(lake, monkeypatch):
    monkeypatch.setattr(store.commit, "CADENCE", replace(store.commit.CADENCE, reopen_after_commits=3))
    t = table(lake)
    t.load([0])
    reopened = []
    monkeypatch.setattr(t, "_reopen", lambda real=t._reopen: reopened.append(t._table.version()) or real())
    for i in range(7):  # the 3rd and the 6th commit (versions 3 and 6) reopen the table
        assert t.commit(rows(0, [i]), {0: i}, refresh_offsets=0) == 1
    assert reopened == [3, 6]
    assert checkpoints(lake) == ([3, 6] if store.commit.CADENCE.own_checkpoint else [])
    assert offsets(lake) == [(0, i) for i in range(7)]
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 6
    other = table(lake)  # another owner moves the marker: the reopened snapshot must see it
    other.load([0])
    other.commit(rows(0, [7]), {0: 7}, refresh_offsets=0)
    with pytest.raises(OffsetConflict):
        t.commit(rows(0, [7, 8]), {0: 8}, refresh_offsets=0)


def test_a_table_reopens_from_the_interval_checkpoint_it_wrote(lake, monkeypatch):
    """The snapshot is dropped where a checkpoint was just written, whatever the commit budget: the reopen replays
    no log entry."""
    monkeypatch.setattr(store.commit, "DELTA_CHECKPOINT_INTERVAL", 4)
    monkeypatch.setattr(store.commit, "CADENCE", replace(store.commit.CADENCE, reopen_after_commits=1_000))
    t = table(lake)
    t.load([0])
    reopened = []
    monkeypatch.setattr(t, "_reopen", lambda real=t._reopen: reopened.append(t._table.version()) or real())
    for i in range(9):
        t.commit(rows(0, [i]), {0: i}, refresh_offsets=0)
    assert reopened == [4, 8] and checkpoints(lake) == [4, 8]
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 8


def test_the_ingesters_commits_write_no_checkpoint_between_the_tables_own(lake):
    """Checkpoints are kept for the log's retention (30 days): the ingester writes the table's own, every
    ``delta.checkpointInterval`` versions, and no more (store.commit.CADENCE)."""
    t = table(lake)
    t.load([0])
    for i in range(21):
        t.commit(rows(0, [i]), {0: i}, refresh_offsets=0)
    assert checkpoints(lake) == []
    assert offsets(lake) == [(0, i) for i in range(21)]


def test_commits_write_a_checkpoint_at_every_interval_one_table_at_a_time(lake, monkeypatch):
    monkeypatch.setattr(store.commit, "DELTA_CHECKPOINT_INTERVAL", 3)
    t = table(lake)
    t.load([0])
    for i in range(7):
        t.commit(rows(0, [i]), {0: i}, refresh_offsets=0)
    assert checkpoints(lake) == [3, 6]
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 6


def test_a_checkpoint_that_fails_after_its_commit_landed_fails_nothing(lake, monkeypatch):
    """The commit is in the log with its markers: raising would make the caller retry a batch already written
    (and count 0 rows); the next commit tries the checkpoint again."""
    from deltalake.exceptions import DeltaError

    monkeypatch.setattr(store.commit, "DELTA_CHECKPOINT_INTERVAL", 1)
    t = table(lake)
    t.load([0])

    def failing(self) -> None:
        raise DeltaError("object store unavailable")

    monkeypatch.setattr(type(t._table), "create_checkpoint", failing)
    assert t.commit(rows(0, [0, 1]), {0: 1}, refresh_offsets=0) == 2
    assert lake.marker("quarantine", marker_app_id("g", "t", 0)) == 1
    monkeypatch.undo()
    assert t.commit(rows(0, [2]), {0: 2}, refresh_offsets=0) == 1
    assert offsets(lake) == [(0, 0), (0, 1), (0, 2)]
