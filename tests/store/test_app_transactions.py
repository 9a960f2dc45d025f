import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from store.app_transactions import AppTransactions, ingest_positions
from store.commit import marker_app_id
from store.storage import arrow_filesystem


def commit(lake, txns: dict[str, int]) -> None:
    write_deltalake(lake.uri("t"), pa.table({"a": [1]}), mode="append", storage_options=dict(lake.storage_options),
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id=a, version=v)
                                                                         for a, v in txns.items()]))


def test_versions_follow_the_new_log_entries_as_deltas_own_replay_does(lake):
    commit(lake, {"a": 1})
    txns = AppTransactions(lake, "t")
    assert txns.versions(lake.table("t"), ["a", "b"]) == {"a": 1, "b": None}
    commit(lake, {"b": 5})
    commit(lake, {"a": 2, "c": 9})
    delta = lake.table("t")
    assert txns.versions(delta, ["a", "b", "c"]) == {"a": 2, "b": 5, "c": 9}
    assert {a: delta.transaction_version(a) for a in "abc"} == {"a": 2, "b": 5, "c": 9}


@pytest.fixture(params=["local", "s3"])
def any_lake(request):
    return request.getfixturevalue("lake" if request.param == "local" else "s3_lake")


def test_log_entries_gone_are_read_again_from_the_checkpoint(any_lake):
    lake = any_lake
    commit(lake, {"a": 1})
    txns = AppTransactions(lake, "t")
    txns.versions(lake.table("t"), ["a"])
    commit(lake, {"a": 2})
    commit(lake, {"a": 3})
    delta = lake.table("t")
    delta.create_checkpoint()
    filesystem, root = arrow_filesystem(lake.root, lake.storage_options)
    filesystem.delete_file(f"{root}/t/_delta_log/{1:020d}.json")  # as forget drops entries older than its delete
    assert txns.versions(delta, ["a"]) == {"a": 3}


def test_ingest_positions_as_of_a_version_from_the_checkpoint_and_the_commits_after(any_lake):
    """The furthest offset per (topic, partition) over consumer groups (a group may hold ':'), as of a version:
    through a checkpoint, past it, and never a marker committed after that version."""
    lake = any_lake
    commit(lake, {marker_app_id("g:1", "events", 0): 40, marker_app_id("g2", "events", 0): 7, "other": 99})  # v0
    commit(lake, {marker_app_id("g2", "events", 1): 3})  # v1
    lake.table("t").create_checkpoint()
    commit(lake, {marker_app_id("g:1", "events", 0): 5})  # v2: --recover rewound the partition, new log
    commit(lake, {marker_app_id("g:1", "events", 0): 9})  # v3
    assert ingest_positions(lake, "t", 0) == {("events", 0): 40}
    assert ingest_positions(lake, "t", 1) == {("events", 0): 40, ("events", 1): 3}
    assert ingest_positions(lake, "t", 2) == {("events", 0): 7, ("events", 1): 3}
    assert ingest_positions(lake, "t", 3) == {("events", 0): 9, ("events", 1): 3}


def test_ingest_positions_past_a_checkpoint_newer_than_the_version(lake):
    """The ingester checkpoints every 100 versions, and log cleanup drops entries older than 30 days: a refresh whose
    pinned version is below the newest checkpoint must still find the markers (an older checkpoint, or the entries)."""
    for offset in range(3):
        commit(lake, {marker_app_id("g", "events", 0): offset})  # v0..v2
    lake.table("t").create_checkpoint()  # checkpoint at v2
    commit(lake, {marker_app_id("g", "events", 0): 3})  # v3: the refresh pins this version
    commit(lake, {marker_app_id("g", "events", 0): 4})  # v4: the ingester commits on while the refresh reads
    lake.table("t").create_checkpoint()  # ... and checkpoints (v4 > pinned v3)
    filesystem, root = arrow_filesystem(lake.root, lake.storage_options)
    for version in (0, 1):  # expired entries removed by log cleanup (or dropped by a forget)
        filesystem.delete_file(f"{root}/t/_delta_log/{version:020d}.json")
    assert ingest_positions(lake, "t", 3) == {("events", 0): 3}


def test_ingest_positions_from_the_newest_checkpoint_at_or_before_the_version(lake, monkeypatch):
    """Same race without cleanup: every log entry from version 0 is read (one GET each on S3)."""
    for offset in range(30):
        commit(lake, {marker_app_id("g", "events", 0): offset})  # v0..v29
    lake.table("t").create_checkpoint()  # v29
    commit(lake, {marker_app_id("g", "events", 0): 30})  # v30: pinned
    commit(lake, {marker_app_id("g", "events", 0): 31})  # v31
    lake.table("t").create_checkpoint()  # v31 > pinned
    reads = []
    read_file = type(lake).read_file

    def counting(self, path):
        reads.append(path)
        return read_file(self, path)

    monkeypatch.setattr(type(lake), "read_file", counting)
    assert ingest_positions(lake, "t", 30) == {("events", 0): 30}
    assert len([p for p in reads if p.endswith(".json")]) <= 2, len(reads)
