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

from schemas.tables import LAKE_IDENTITY, LAKE_IDENTITY_TABLE
from store.lake import Lake


def lake_id(lake: Lake) -> str:
    """This lake's id, created on first use (idempotent and safe against concurrent first uses).

    >>> lake_id(Lake("/tmp/lake")) == lake_id(Lake("/tmp/lake"))  # doctest: +SKIP
    True
    """
    if not lake.exists(LAKE_IDENTITY_TABLE):
        row = pa.Table.from_pylist([{"lake_id": str(uuid.uuid4()), "created_at": datetime.now(UTC)}],
                                   schema=LAKE_IDENTITY)
        try:
            write_deltalake(lake.write_uri(LAKE_IDENTITY_TABLE), row, mode="error",
                            storage_options=dict(lake.storage_options))
        except (DeltaError, OSError):
            if not lake.exists(LAKE_IDENTITY_TABLE):  # not a lost race: a real write error
                raise
    rows = lake.read(LAKE_IDENTITY_TABLE).sort_by([("created_at", "ascending"), ("lake_id", "ascending")])
    return rows["lake_id"][0].as_py()
