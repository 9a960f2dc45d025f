"""The lake's identity: a random id written once into the lake (table ``lake_identity``).

Control events carry it, so a process that shares a broker with other lakes
can tell which events are about its own lake. The first process that asks
writes the table's one row as a claim (``store.claims``: an append carrying
the app transaction ``lake-identity -> 1``); of processes racing to do so
exactly one commits, and all of them then read that row. (A plain
``mode="error"`` write is not enough: delta-rs retries a lost first commit as
version 1, so two rows landed and processes disagreed.) A lake that holds
several rows (written before) answers the oldest, the same for every reader.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pyarrow as pa

from schemas.errors import Conflict
from schemas.tables import LAKE_IDENTITY, LAKE_IDENTITY_TABLE
from store.claims import ClaimLost, claims_table, commit_claim
from store.lake import Lake

_CLAIM_APP_ID = "lake-identity"
_RACES = 5
"""Commits lost to concurrent first uses before giving up."""


def lake_id(lake: Lake) -> str:
    """This lake's id, created on first use (idempotent and safe against concurrent first uses).

    >>> lake_id(Lake("/tmp/lake")) == lake_id(Lake("/tmp/lake"))  # doctest: +SKIP
    True
    """
    for _ in range(_RACES):
        rows = _rows(lake)
        if rows.num_rows:
            return rows.sort_by([("created_at", "ascending"), ("lake_id", "ascending")])["lake_id"][0].as_py()
        row = pa.Table.from_pylist([{"lake_id": str(uuid.uuid4()), "created_at": datetime.now(UTC)}],
                                   schema=LAKE_IDENTITY)
        try:
            commit_claim(claims_table(lake, LAKE_IDENTITY_TABLE, LAKE_IDENTITY), row, app_id=_CLAIM_APP_ID, claim=1)
        except ClaimLost:
            pass  # another process wrote the id first (read it), or created the table under this commit (again)
    raise Conflict(f"the lake's identity could not be recorded in {_RACES} tries (concurrent writers): try again")


def _rows(lake: Lake) -> pa.Table:
    return lake.read(LAKE_IDENTITY_TABLE) if lake.exists(LAKE_IDENTITY_TABLE) else LAKE_IDENTITY.empty_table()
