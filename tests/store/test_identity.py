"""The lake's identity: created once, the same answer for every process that asks first at the same time."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from schemas.tables import LAKE_IDENTITY_TABLE
from store.identity import lake_id
from store.lake import Lake


def race(lake: Lake) -> set[str]:
    """Six first uses at once; the ids they answered."""
    start = threading.Barrier(6)

    def ask(_: int) -> str:
        start.wait()  # every thread finds no identity table, then all try to create it
        return lake_id(Lake(lake.root))

    with ThreadPoolExecutor(6) as pool:
        return set(pool.map(ask, range(6)))


def test_concurrent_first_uses_agree_on_one_id(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    ids = race(lake)
    assert len(ids) == 1 and lake.read(LAKE_IDENTITY_TABLE).num_rows == 1
    assert lake_id(lake) == ids.pop()
    assert lake_id(Lake(str(tmp_path / "other"))) != lake_id(lake)


def test_on_the_object_store_too(s3_lake):
    ids = race(s3_lake)
    assert len(ids) == 1 and s3_lake.read(LAKE_IDENTITY_TABLE).num_rows == 1
