"""The floor a build is measured against: a bare scan of the token columns it reads.

Reads every ``prompt_token_ids`` of ``llm_requests`` and every
``response_token_ids`` and ``logprobs`` of ``llm_responses`` (the current
Delta version) and sums them, so every value is decoded, once with Arrow
(the reader a build uses) and once with DuckDB's ``delta_scan``. Nothing is
selected, joined, merged or written: a build cannot be cheaper than this.
"""

from __future__ import annotations

import pyarrow.compute as pc

from store.lake import Lake
from store.sql import open_duckdb

TOKEN_COLUMNS = {"llm_requests": ["prompt_token_ids"], "llm_responses": ["response_token_ids", "logprobs"]}


def arrow_scan(lake: Lake) -> float:
    """Sum of every token id and logprob, read file by file with pyarrow.dataset."""
    total = 0.0
    for table, columns in TOKEN_COLUMNS.items():
        for batch in lake.dataset(table).to_batches(columns=columns):
            for column in columns:
                total += pc.sum(pc.list_flatten(batch.column(column))).as_py() or 0
    return total


def duckdb_scan(lake: Lake) -> float:
    """The same sums as one DuckDB query over ``delta_scan`` (all of DuckDB's threads)."""
    con = open_duckdb(lake)
    try:
        scans = []
        for table, columns in TOKEN_COLUMNS.items():
            uri = lake.uri(table).replace("'", "''")
            sums = " + ".join(f"coalesce(sum(list_sum({c})), 0)" for c in columns)
            scans.append(f"(SELECT {sums} FROM delta_scan('{uri}'))")
        return float(con.execute(f"SELECT {' + '.join(scans)}").fetchone()[0])
    finally:
        con.close()
