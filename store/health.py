"""Can this process read the lake? One cheap probe for health checks and start-up errors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from store.lake import Lake, list_tables
from store.storage import store_problem
from schemas.errors import Unreachable


class LakeUnreachable(Unreachable, RuntimeError):
    """The lake's object store cannot be read: missing bucket, wrong endpoint or keys, store down."""


def check_bucket(uri: str, options: Mapping[str, str]) -> None:
    """Raise ``LakeUnreachable`` unless the bucket of ``s3://bucket/...`` exists and answers (with ``options``,
    the storage options of ``store.storage``)."""
    if (problem := store_problem(uri, options)) is not None:
        raise LakeUnreachable(f"{uri}: {problem}")


def check_lake(lake: Lake) -> list[str]:
    """The lake's table names; ``LakeUnreachable`` when its store cannot be listed, or when a local root is no folder
    (listing a missing folder finds 0 tables: a typo in TRAJLAKE_LAKE would pass). An empty lake is healthy."""
    if lake.is_local and not Path(lake.root.removeprefix("file://")).is_dir():
        raise LakeUnreachable(f"{lake.root} is not a folder (missing, or a file): check --lake / TRAJLAKE_LAKE")
    if lake.root.startswith(("s3://", "s3a://")):
        check_bucket(lake.root, lake.storage_options)
    try:
        return list_tables(lake)
    except (OSError, ValueError) as exc:
        raise LakeUnreachable(f"{lake.root}: cannot list the lake ({exc})") from None
