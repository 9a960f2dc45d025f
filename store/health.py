"""Can this process read the lake? One cheap probe for health checks and start-up errors."""

from __future__ import annotations

import pyarrow.fs as pafs

from store.lake import Lake
from store.storage import list_tables


class LakeUnreachable(RuntimeError):
    """The lake's object store cannot be read: missing bucket, wrong endpoint or keys, store down."""


_SETTINGS = "check AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and AWS_REGION"


def check_bucket(uri: str) -> None:
    """Raise ``LakeUnreachable`` unless the bucket of ``s3://bucket/...`` exists and answers."""
    bucket = uri.partition("://")[2].split("/", 1)[0]
    try:
        filesystem, _ = pafs.FileSystem.from_uri(f"s3://{bucket}/")
        missing = filesystem.get_file_info(bucket).type == pafs.FileType.NotFound
    except (OSError, ValueError) as exc:
        raise LakeUnreachable(f"{uri}: the object store does not answer ({exc}); {_SETTINGS}") from None
    if missing:
        raise LakeUnreachable(f"{uri}: bucket {bucket!r} does not exist; create it first ({_SETTINGS})")


def check_lake(lake: Lake) -> list[str]:
    """The lake's table names; ``LakeUnreachable`` when its store cannot be listed. An empty lake is healthy."""
    if lake.root.startswith(("s3://", "s3a://")):
        check_bucket(lake.root)
    try:
        return list_tables(lake)
    except (OSError, ValueError) as exc:
        raise LakeUnreachable(f"{lake.root}: cannot list the lake ({exc})") from None
