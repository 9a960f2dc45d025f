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


def test_ingest_positions_below_the_newest_checkpoint_probes_the_interval_without_listing(lake, monkeypatch):
    """A checkpoint landing while a refresh runs: the ingester's checkpoints sit at multiples of the interval, which
    are probed; the log folder (a 30-day log holds ~1M objects: 1,000+ LIST pages) is listed only when none is there."""
    import store.app_transactions as app_transactions

    for offset in range(5):
        commit(lake, {marker_app_id("g", "events", 0): offset})  # v0..v4
    lake.table("t").create_checkpoint()  # v4: a multiple of the interval (2)
    commit(lake, {marker_app_id("g", "events", 0): 5})  # v5: pinned by the refresh
    commit(lake, {marker_app_id("g", "events", 0): 6})  # v6
    lake.table("t").create_checkpoint()  # v6 > pinned
    listed, real = [], app_transactions._checkpoint_versions
    monkeypatch.setattr(app_transactions, "_checkpoint_versions",
                        lambda lake, log: listed.append(log) or real(lake, log))
    assert ingest_positions(lake, "t", 5, interval=2) == {("events", 0): 5}
    assert listed == []
    assert ingest_positions(lake, "t", 5, interval=4) == {("events", 0): 5}  # probes 4, 0: v4 found
    assert ingest_positions(lake, "t", 5, interval=3) == {("events", 0): 5}  # probes 3, 0: none, the list finds v4
    assert listed == ["t/_delta_log"]


def test_ingest_positions_inside_a_forget_cannot_be_told(lake):
    """forget deletes, checkpoints its last version and drops the entries and checkpoints before it: a version after
    its delete and before that checkpoint has neither a checkpoint at or before it nor entry 0 (None, not "no cap");
    from the forget's checkpoint on, the markers read again."""
    from store.forget import _drop_log_history

    for offset in range(3):
        commit(lake, {marker_app_id("g", "events", 0): offset})  # v0..v2
    lake.table("t").create_checkpoint()  # v2: the ingester's own
    lake.table("t").delete("a = 1")  # v3: the forget's delete
    commit(lake, {marker_app_id("g", "events", 0): 3})  # v4
    _drop_log_history(lake, "t", through=2)  # checkpoint v4, entries and checkpoint through v2 gone
    assert ingest_positions(lake, "t", 3) is None
    assert ingest_positions(lake, "t", 4) == {("events", 0): 3}


def test_a_log_cleaned_up_below_the_version_is_not_read_entry_by_entry(lake, monkeypatch):
    """No checkpoint at or below the version and entry 0 gone: None after the first group of reads, not one read per
    version (on a 30-day object-store log ~100k GETs; review4)."""
    from store import app_transactions
    from store.lake import Lake

    for offset in range(40):
        commit(lake, {marker_app_id("g", "events", 0): offset})
    filesystem, root = arrow_filesystem(lake.root, lake.storage_options)
    filesystem.delete_file(f"{root}/t/_delta_log/{0:020d}.json")
    reads, real = [], Lake.read_file
    monkeypatch.setattr(Lake, "read_file", lambda self, path: reads.append(path) or real(self, path))
    assert ingest_positions(lake, "t", 39) is None
    assert len([p for p in reads if p.endswith(".json")]) <= app_transactions.ENTRY_READERS
