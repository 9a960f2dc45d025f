"""Token reads of a build: each source file decoded once (and never copied) while batches advance through sorted ids."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from pipelines.datasets.calls import DecodedFiles


def _table(lake, files: list[list[str]]):
    """A Delta table whose files hold the given rollout ids (one commit, so one file, each)."""
    for ids in files:
        write_deltalake(lake.uri("t"), pa.table({"rollout_id": ids, "value": [f"{i}!" for i in ids]}), mode="append")
    return lake.dataset("t", prune_on=["rollout_id"])


def test_a_range_gets_every_file_that_holds_it_whole(lake):
    files = DecodedFiles(_table(lake, [["a", "b", "c", "d"], ["c", "e", "f"], ["g"]]), ["rollout_id", "value"])
    first = files.read("a", "c")
    second = files.read("d", "f")
    third = files.read("g", "z")
    assert sorted(first["rollout_id"].to_pylist()) == ["a", "b", "c", "c", "d", "e", "f"]
    assert sorted(second["rollout_id"].to_pylist()) == ["a", "b", "c", "c", "d", "e", "f"]
    assert third.to_pylist() == [{"rollout_id": "g", "value": "g!"}]


def test_a_file_is_kept_only_while_a_later_range_can_need_it(lake):
    files = DecodedFiles(_table(lake, [["a", "m", "z"], ["b"]]), ["value"])
    files.read("a", "b")
    assert len(files._decoded) == 1  # the a..z file reaches past "b"; the file of "b" is done
    files.read("c", "z")
    assert files._decoded == {}


def test_an_empty_range_reads_nothing(lake):
    files = DecodedFiles(_table(lake, [["a", "b"]]), ["value"])
    assert files.read("x", "y").num_rows == 0
