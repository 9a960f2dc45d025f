"""After delta-rs rewrites files (DELETE as in forget/retention, compact, z-order) every reader sees the catalogue's types."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from schemas.tables import INGESTED_TABLES
from store.compact import compact
from store.lake import Lake
from store.rebuild import rebuild_typed_tables
from store.sql import run_query
from store.tenant_sql import open_tenant_sandbox, take_snapshot
from tests.store.lake_builder import sample_rollout, write_events


def rewritten(lake: Lake, how: str) -> Lake:
    for i in range(3):
        write_events(lake, sample_rollout(f"a{i}", tenant="acme") + sample_rollout(f"b{i}", tenant="bravo"))
    if how in ("delete", "delete+compact"):  # forget and retention delete like this
        for name in INGESTED_TABLES:
            if lake.exists(name):
                lake.table(name).delete("tenant = 'bravo'")  # rewrites every file
    if how in ("compact", "delete+compact"):
        compact(lake)  # z-order on task_id, rollout_id
    return lake


@pytest.mark.parametrize("how", ["delete", "compact", "delete+compact"])
def test_every_reader_sees_catalogue_types_after_rewrites(lake: Lake, how: str) -> None:
    rewritten(lake, how)
    file_types = {str(f.physical_schema.field("tenant").type) for f in lake.dataset("events").get_fragments()}
    if how == "delete":  # what delta-rs 1.6 writes (compaction writes string again): what the read path is for
        assert "string_view" in file_types
    for name, schema in INGESTED_TABLES.items():
        if lake.exists(name):
            assert lake.read(name).schema.equals(schema), name
    acme = lake.read("events", columns=["rollout_id", "tenant"], filter=pc.field("tenant") == "acme")
    assert set(acme.column("tenant").to_pylist()) == {"acme"} and acme.num_rows == 33
    assert run_query(lake, "SELECT count(*) AS n FROM rollouts WHERE tenant = 'bravo'").to_pylist()[0]["n"] == (
        0 if how.startswith("delete") else 3)
    with open_tenant_sandbox(take_snapshot(lake), "acme") as sandbox:
        page = sandbox.query("SELECT DISTINCT tenant FROM llm_calls", limit=10)
        assert page.table.column("tenant").to_pylist() == ["acme"]
        page = sandbox.query("SELECT count(*) AS n FROM llm_requests WHERE rollout_id = 'a1'", limit=10)
        assert page.table.to_pylist() == [{"n": 2}]
    assert rebuild_typed_tables(lake)["rollout_starts"] == (3 if how.startswith("delete") else 6)
