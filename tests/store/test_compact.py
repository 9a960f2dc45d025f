"""Compaction: fewer files, z-ordered, nothing lost while an ingester appends with markers."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from store.compact import compact, compact_table, vacuum
from store.lake import Lake

ROWS_PER_BATCH = 40
APP_ID = "ingester:g:trajlake.events:0"


def batch(first_offset: int) -> pa.Table:
    offsets = list(range(first_offset, first_offset + ROWS_PER_BATCH))
    return pa.table({
        "task_id": [f"task-{o % 7}" for o in offsets],
        "rollout_id": [f"r-{o % 13}" for o in offsets],
        "kafka_offset": pa.array(offsets, pa.int64()),
        "token_ids": pa.array([[o, o + 1] for o in offsets], pa.list_(pa.int32())),
    })


def append_batches(lake: Lake, table: str, start: int, count: int) -> int:
    """Append like the ingester: each batch with its last offset as the transaction marker."""
    offset = start
    for _ in range(count):
        lake.append(table, batch(offset), markers={APP_ID: offset + ROWS_PER_BATCH - 1})
        offset += ROWS_PER_BATCH
    return offset


def parquet_files(lake: Lake, table: str) -> list[Path]:
    return list(Path(lake.uri(table)).glob("*.parquet"))


def test_compaction_rewrites_small_files_and_vacuums_them(lake: Lake) -> None:
    append_batches(lake, "events", 0, 12)
    assert len(parquet_files(lake, "events")) == 12
    [result] = compact(lake, tables=["events"], vacuum_retention=timedelta(0), full=True)
    assert (result.files_removed, result.files_added, result.files_vacuumed) == (12, 1, 12)
    assert result.z_order == ("task_id", "rollout_id")
    assert len(parquet_files(lake, "events")) == 1
    assert lake.read("events").num_rows == 12 * ROWS_PER_BATCH
    assert lake.marker("events", APP_ID) == 12 * ROWS_PER_BATCH - 1


def test_a_second_run_rewrites_only_the_files_written_since(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    for half in range(2):  # two large appends: one large file once compacted
        lake.append("events", pa.concat_tables([batch(o) for o in range(half * 4_000, (half + 1) * 4_000, ROWS_PER_BATCH)]))
    [first] = compact(lake, tables=["events"], vacuum_retention=timedelta(0))
    assert (first.files_removed, first.files_added, first.z_order) == (2, 1, ())
    [big] = parquet_files(lake, "events")
    monkeypatch.setattr("store.compact.SMALL_FILE_BYTES", big.stat().st_size - 1)  # that file is now a full one
    end = append_batches(lake, "events", 8_000, 3)
    [second] = compact(lake, tables=["events"], vacuum_retention=timedelta(0))
    assert (second.files_removed, second.files_added) == (3, 1)
    assert big in parquet_files(lake, "events") and len(parquet_files(lake, "events")) == 2
    offsets = lake.read("events", columns=["kafka_offset"])["kafka_offset"].to_pylist()
    assert sorted(offsets) == list(range(end))
    assert lake.marker("events", APP_ID) == end - 1
    [nothing] = compact(lake, tables=["events"], vacuum_retention=None)  # the scheduler's frequent run
    assert (nothing.files_removed, nothing.version_after) == (0, nothing.version_before)  # no commit at all


@pytest.mark.parametrize("full", [False, True], ids=["incremental", "full"])
def test_compaction_during_ingestion_loses_nothing_and_keeps_markers(lake: Lake, full: bool) -> None:
    append_batches(lake, "events", 0, 5)
    done = threading.Event()
    written: list[int] = []

    def ingester() -> None:
        try:
            written.append(append_batches(lake, "events", 5 * ROWS_PER_BATCH, 25))
        finally:
            done.set()

    thread = threading.Thread(target=ingester)
    thread.start()
    rounds = 0
    while not done.is_set() or rounds < 2:
        compact_table(lake, "events", vacuum_retention=timedelta(0), full=full)
        rounds += 1
    thread.join()

    end = written[0]
    offsets = lake.read("events", columns=["kafka_offset"])["kafka_offset"].to_pylist()
    assert sorted(offsets) == list(range(end))  # every row once: nothing lost, nothing doubled
    assert lake.marker("events", APP_ID) == end - 1
    assert len(parquet_files(lake, "events")) == len(lake.table("events").file_uris())
    operations = [h["operation"] for h in reversed(lake.table("events").history())]
    first_optimize = operations.index("OPTIMIZE")
    assert "WRITE" in operations[first_optimize:]  # the two really overlapped


def test_compacted_files_keep_token_ids_plain_and_scalars_in_dictionaries(lake: Lake) -> None:
    """Not delta-rs's default (dictionary pages everywhere, which made token columns larger)."""
    append_batches(lake, "events", 0, 3)
    compact(lake, tables=["events"], vacuum_retention=timedelta(0))
    [file] = parquet_files(lake, "events")
    meta = pq.ParquetFile(file).metadata
    chunks = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c) for c in range(meta.num_columns)}
    token_ids, rollout_id = chunks["token_ids.list.element"], chunks["rollout_id"]
    assert token_ids.compression == rollout_id.compression == "ZSTD"
    assert not token_ids.has_dictionary_page and "RLE_DICTIONARY" not in token_ids.encodings
    assert rollout_id.has_dictionary_page


def test_vacuum_apart_from_compaction(lake: Lake) -> None:
    append_batches(lake, "events", 0, 3)
    [result] = compact(lake, tables=["events"], vacuum_retention=None)
    assert (result.files_removed, result.files_vacuumed, len(parquet_files(lake, "events"))) == (3, 0, 4)
    assert vacuum(lake, retention=timedelta(0)) == {"events": 3}
    assert len(parquet_files(lake, "events")) == 1 and lake.read("events").num_rows == 3 * ROWS_PER_BATCH
    with pytest.raises(ValueError, match=">= 0"):
        vacuum(lake, retention=timedelta(hours=-1))


def test_default_retention_keeps_removed_files_for_older_readers(lake: Lake) -> None:
    append_batches(lake, "events", 0, 3)
    [result] = compact(lake, tables=["events"])
    assert result.files_vacuumed == 0
    assert lake.read("events", version=result.version_before).num_rows == 3 * ROWS_PER_BATCH


def test_table_without_trajectory_keys_is_compacted_without_z_order(lake: Lake) -> None:
    for i in range(3):
        write_deltalake(lake.uri("quarantine_like"), pa.table({"raw": [b"x" * i]}), mode="append")
    result = compact_table(lake, "quarantine_like", vacuum_retention=timedelta(0))
    assert result.z_order == () and result.files_added == 1
    assert lake.read("quarantine_like").num_rows == 3


def test_compact_all_tables_and_rejects_negative_retention(lake: Lake) -> None:
    append_batches(lake, "events", 0, 2)
    append_batches(lake, "datasets/nightly", 0, 2)
    assert sorted(r.table for r in compact(lake)) == ["datasets/nightly", "events"]
    with pytest.raises(ValueError, match=">= 0"):
        compact_table(lake, "events", vacuum_retention=timedelta(hours=-1))


def test_compact_cli_reports_each_table(lake: Lake) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import build_app

    append_batches(lake, "events", 0, 3)
    result = CliRunner().invoke(build_app(), ["compact", "--full", "--vacuum-hours", "0", "--lake", lake.root])
    assert result.exit_code == 0, result.output
    assert "events" in result.output and "task_id,rollout_id" in result.output
    assert len(parquet_files(lake, "events")) == 1
    empty = CliRunner().invoke(build_app(), ["compact", "--lake", lake.root + "-empty"])
    assert empty.exit_code == 0 and "no tables" in empty.output
