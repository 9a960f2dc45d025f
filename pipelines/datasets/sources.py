"""A consistent read of the source tables: each pinned at one Delta version.

The ingester keeps appending while a build runs; pinning every table at the
version seen when the build starts makes the build's inputs one snapshot, and
the versions go into the manifest so the build can be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from schemas.tables import (
    LLM_REQUESTS_TABLE,
    LLM_RESPONSES_TABLE,
    REWARDS_TABLE,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
)
from store.lake import Lake
from store.sql import create_table_view, lock_down, open_duckdb
from schemas.errors import NotFound

SOURCE_TABLES = (ROLLOUT_STARTS_TABLE, ROLLOUT_ENDS_TABLE, LLM_REQUESTS_TABLE, LLM_RESPONSES_TABLE, REWARDS_TABLE)
"""Physical tables a build reads (the joined SQL views are deliberately not used)."""


class SourceMissing(NotFound):
    """The lake lacks a table a build needs."""


@dataclass(frozen=True)
class Snapshot:
    """Source table name -> the Delta version the build reads."""

    versions: dict[str, int]

    @classmethod
    def pin(cls, lake: Lake, tables: tuple[str, ...] = SOURCE_TABLES) -> Snapshot:
        """Pin every table at its current version; raises ``SourceMissing`` naming the first absent one."""
        versions = {}
        for name in tables:
            version = lake.version(name)
            if version is None:
                raise SourceMissing(
                    f"lake {lake.root!r} has no {name!r} table: ingest rollouts first (trajlake ingest), "
                    "or point --lake / TRAJLAKE_LAKE at the right lake"
                )
            versions[name] = version
        return cls(versions)


def pinned_connection(lake: Lake, snapshot: Snapshot, *, memory_limit: str = "1GB") -> duckdb.DuckDBPyConnection:
    """DuckDB with one view per source table, each at its pinned version."""
    con = open_duckdb(lake)
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_external_file_cache = false")  # cached Parquet blocks grew RSS with the lake
    for name, version in snapshot.versions.items():
        uri = lake.uri(name).replace("'", "''")
        create_table_view(con, name, f"delta_scan('{uri}', version={int(version)})")
    lock_down(con, lake)  # a --where predicate may read nothing outside the lake and change no setting
    return con
