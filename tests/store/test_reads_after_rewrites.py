"""After delta-rs rewrites files (forget, retention, compact's z-order) every reader sees the catalogue's types."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from schemas.tables import INGESTED_TABLES
from store.compact import Z_ORDER_COLUMNS, compact
from store.forget import ForgetRequest, forget
from store.lake import Lake
from store.rebuild import rebuild_typed_tables
from store.retention import RetentionPolicy, apply_retention
from store.sql import run_query
from store.tenant_sql import open_tenant_sandbox, take_snapshot
from tests.store.lake_builder import sample_rollout, write_events

LATER = datetime(2100, 1, 1, tzinfo=timezone.utc)  # every sample event is older than a day by then


def type_text(data_type: pa.DataType) -> str:
    """A type as text without what DuckDB names differently (list item names, the UTC zone's alias)."""
    return re.sub(r"list<[^:<>]+: ", "list<", str(data_type)).replace("Etc/UTC", "UTC")


def rewritten(lake: Lake, how: str) -> Lake:
    for i in range(3):
        write_events(lake, sample_rollout(f"a{i}", tenant="acme") + sample_rollout(f"b{i}", tenant="bravo"))
    if how.startswith("forget"):  # a DELETE that rewrites every file
        forget(lake, ForgetRequest(tenant="bravo", reason="test"))
    if how == "retention":
        assert apply_retention(lake, RetentionPolicy.parse({"bravo": 1}), clock=lambda: LATER)
    if how.endswith("z-order"):
        assert {c.table: c.z_order for c in compact(lake, full=True)}["events"] == Z_ORDER_COLUMNS
    return lake


@pytest.mark.parametrize("how", ["forget", "retention", "z-order", "forget+z-order"])
def test_every_reader_sees_catalogue_types_after_rewrites(lake: Lake, how: str) -> None:
    rewritten(lake, how)
    file_types = {str(f.physical_schema.field("tenant").type) for f in lake.dataset("events").get_fragments()}
    if how in ("forget", "retention"):  # what delta-rs 1.6 writes (z-order writes string again): what the read path is for
        assert "string_view" in file_types
    for name, schema in INGESTED_TABLES.items():
        if lake.exists(name):
            assert lake.read(name).schema.equals(schema), name
            assert pl.read_delta(lake.uri(name)).schema == pl.from_arrow(schema.empty_table()).schema, name
            duck = run_query(lake, f'SELECT * FROM "{name}" LIMIT 1').schema  # DuckDB's view of the table
            assert [(f.name, type_text(f.type)) for f in duck] == [(f.name, type_text(f.type)) for f in schema], name
    acme = lake.read("events", columns=["rollout_id", "tenant"], filter=pc.field("tenant") == "acme")
    assert set(acme.column("tenant").to_pylist()) == {"acme"} and acme.num_rows == 33
    deleted = how != "z-order"
    assert run_query(lake, "SELECT count(*) AS n FROM rollouts WHERE tenant = 'bravo'").to_pylist()[0]["n"] == (
        0 if deleted else 3)
    with open_tenant_sandbox(take_snapshot(lake), "acme") as sandbox:
        page = sandbox.query("SELECT DISTINCT tenant FROM llm_calls", limit=10)
        assert page.table.column("tenant").to_pylist() == ["acme"]
        page = sandbox.query("SELECT count(*) AS n FROM llm_requests WHERE rollout_id = 'a1'", limit=10)
        assert page.table.to_pylist() == [{"n": 2}]
    assert rebuild_typed_tables(lake)["rollout_starts"] == (3 if deleted else 6)
