"""``write_version`` encodes and observes batch n on helper threads while the caller makes batch n + 1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines.datasets.sample_files import write_version
from schemas.tables import SAMPLES, dataset_table
from store.lake import Lake
from tests.pipelines.datasets.test_content_hash import ROWS, samples_batch

TABLE = dataset_table("ds")


def numbered(n: int) -> list[pa.RecordBatch]:
    """``n`` one-row batches whose rollout_id says their position."""
    return [samples_batch([{**ROWS[0], "rollout_id": f"r{i:03d}"}]) for i in range(n)]


def test_rows_are_written_and_observed_in_order_while_the_next_batch_is_made(lake: Lake):
    batches = numbered(5)
    asked_for = [threading.Event() for _ in batches]
    observed, overlapped = [], []

    def observe(batch: pa.RecordBatch) -> None:
        i = int(batch.column("rollout_id")[0].as_py()[1:])
        if i + 1 < len(batches):  # batch i is still being observed when batch i + 1 is asked for
            overlapped.append(asked_for[i + 1].wait(timeout=1))
        observed.append(batch.column("rollout_id")[0].as_py())

    def made() -> Iterator[pa.RecordBatch]:
        for i, batch in enumerate(batches):
            asked_for[i].set()
            yield batch

    write_version(lake, TABLE, made(), schema=SAMPLES, observe=observe)
    expected = [f"r{i:03d}" for i in range(len(batches))]
    assert observed == expected
    assert lake.read(TABLE, columns=["rollout_id"])["rollout_id"].to_pylist() == expected
    assert overlapped == [True] * (len(batches) - 1)


def test_an_observer_that_fails_fails_the_write_and_leaves_no_file(lake: Lake):
    def fail_on_third(batch: pa.RecordBatch) -> None:
        if batch.column("rollout_id")[0].as_py() == "r002":
            raise ValueError("observer failed")

    with pytest.raises(ValueError, match="observer failed"):
        write_version(lake, TABLE, iter(numbered(6)), schema=SAMPLES, observe=fail_on_third)
    assert not lake.exists(TABLE)
    assert not list((Path(lake.root) / TABLE).glob("*.parquet"))


def test_a_batch_the_writer_rejects_fails_the_write_and_leaves_no_file(lake: Lake):
    batches = numbered(3)
    batches[1] = batches[1].rename_columns([f"x{i}" for i in range(batches[1].num_columns)])  # not SAMPLES

    with pytest.raises(ValueError):
        write_version(lake, TABLE, iter(batches), schema=SAMPLES)
    assert not lake.exists(TABLE)
    assert not list((Path(lake.root) / TABLE).glob("*.parquet"))
