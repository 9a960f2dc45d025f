"""The lake's identity: a random id written once into the lake (table ``lake_identity``).

Control events carry it, so a process that shares a broker with other lakes
can tell which events are about its own lake. The first process that asks
creates the table with one row; two that race both try to commit the
table's first version, the log's no-overwrite write lets one win, and both
then read the same row.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import write_deltalake
from deltalake.exceptions import DeltaError

from schemas.tables import TS
from store.lake import Lake

IDENTITY_TABLE = "lake_identity"

IDENTITY = pa.schema([pa.field("lake_id", pa.string(), nullable=False), pa.field("created_at", TS, nullable=False)])
"""The lake's one identity row."""


def lake_id(lake: Lake) -> str:
    """This lake's id, created on first use (idempotent and safe against concurrent first uses).

    >>> lake_id(Lake("/tmp/lake")) == lake_id(Lake("/tmp/lake"))  # doctest: +SKIP
    True
    """
    if not lake.exists(IDENTITY_TABLE):
        row = pa.Table.from_pylist([{"lake_id": str(uuid.uuid4()), "created_at": datetime.now(UTC)}], schema=IDENTITY)
        try:
            write_deltalake(lake.uri(IDENTITY_TABLE), row, mode="error", storage_options=dict(lake.storage_options))
        except (DeltaError, OSError):
            if not lake.exists(IDENTITY_TABLE):  # not a lost race: a real write error
                raise
    rows = lake.read(IDENTITY_TABLE).sort_by([("created_at", "ascending"), ("lake_id", "ascending")])
    return rows["lake_id"][0].as_py()
