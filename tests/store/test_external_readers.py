"""The lake is plain Delta (protocol 1/2, no table features): other engines read it as it is.

README's deployment section promises this; Polars is tested here against the S3-compatible server. Spark and
Trino read the same protocol but are not installable here (README marks them untested).
"""

from __future__ import annotations

import polars as pl
from deltalake import DeltaTable

from store.lake import list_tables
from tests.pipelines.conftest import LakeRows
from tests.pipelines.datasets.test_build import agent


def test_every_table_is_protocol_1_2_and_polars_reads_it_from_s3(s3_lake, s3_env):
    rows = LakeRows(s3_lake)
    agent(rows, "r1", "t1", 1.0, split=True)
    agent(rows, "r2", "t1", 0.0)
    rows.flush()
    tables = list_tables(s3_lake)
    assert {"llm_requests", "llm_responses", "rewards"} <= set(tables), tables
    options = {k: v for k, v in s3_env.items() if k in {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
                                                         "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"}}
    for table in tables:
        protocol = DeltaTable(s3_lake.uri(table), storage_options=options).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), table
        assert not protocol.reader_features and not protocol.writer_features, table
        frame = pl.read_delta(s3_lake.uri(table), storage_options=options)
        assert frame.height == s3_lake.read(table).num_rows, table
