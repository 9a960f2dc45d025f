"""``Lake.dataset`` / ``scan`` / ``read``: the one read path over a table's files."""

from __future__ import annotations

import pyarrow as pa
import pytest
import pyarrow.compute as pc
from deltalake import write_deltalake

from store.lake import Lake


def test_files_are_pruned_by_their_delta_statistics(lake: Lake) -> None:
    for ids in (["a", "b"], ["x", "y"], [None, "z"]):
        write_deltalake(lake.uri("t"), mode="append", data=pa.table({"rollout_id": pa.array(ids, pa.string()), "n": [1, 2]}))
    late = pc.field("rollout_id") >= "w"
    assert len(list(lake.dataset("t").get_fragments(filter=late))) == 3
    # the file holding a null has no guarantee: it is always read
    assert len(list(lake.dataset("t", prune_on=["rollout_id"]).get_fragments(filter=late))) == 2
    assert sorted(lake.read("t", filter=late).column("rollout_id").to_pylist()) == ["x", "y", "z"]


def test_scan_projects_filters_and_reads_old_versions(lake: Lake) -> None:
    write_deltalake(lake.uri("t"), mode="append", data=pa.table({"k": ["a", "b"], "n": [1, 2]}))
    write_deltalake(lake.uri("t"), mode="append", data=pa.table({"k": ["c"], "n": [3]}))
    reader = lake.scan("t", columns=["n"], filter=pc.field("k") != "b", batch_rows=1)
    assert reader.schema == pa.schema([pa.field("n", pa.int64())])
    assert sorted(reader.read_all().column("n").to_pylist()) == [1, 3]
    assert lake.read("t", version=0).num_rows == 2


def test_version_loads_the_log_once(lake: Lake, monkeypatch) -> None:
    """``DeltaTable.is_deltatable`` is itself a full load of the log (on an object store ~200 requests for a table 96
    commits past its checkpoint): ``version`` opens the table once, and a missing table is None."""
    from deltalake import DeltaTable

    write_deltalake(lake.uri("t"), pa.table({"a": [1]}))
    write_deltalake(lake.uri("t"), pa.table({"a": [2]}), mode="append")
    monkeypatch.setattr(DeltaTable, "is_deltatable", staticmethod(lambda *a, **k: pytest.fail("loaded twice")))
    assert lake.version("t") == 1
    assert lake.version("missing") is None
