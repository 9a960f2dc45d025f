"""Storage options for object-store lakes, built from the environment.

Local lakes need none. An ``s3://`` lake reads the standard ``AWS_*``
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL`` for MinIO, ``AWS_ALLOW_HTTP`` for a plain-http endpoint)
and, unless a DynamoDB locking provider is configured, asks for conditional
puts (``aws_conditional_put=etag``): MinIO, R2 and S3 itself refuse to
overwrite an existing Delta log entry, which is what makes concurrent writers
(two schedulers, several ingesters) safe without an external lock.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow.fs as pafs

from store.lake import Lake

_OBJECT_STORE_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_")


def storage_options(root: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """deltalake storage options for the lake at ``root``.

    >>> storage_options("./lake", {"AWS_REGION": "eu-west-1"})
    {}
    >>> storage_options("s3://b/lake", {"AWS_REGION": "eu-west-1"})
    {'AWS_REGION': 'eu-west-1', 'aws_conditional_put': 'etag'}
    """
    if "://" not in root or root.startswith("file://"):
        return {}
    env = os.environ if env is None else env
    options = {key: value for key, value in env.items() if key.startswith(_OBJECT_STORE_PREFIXES)}
    if root.startswith(("s3://", "s3a://")) and "AWS_S3_LOCKING_PROVIDER" not in options:
        options.setdefault("aws_conditional_put", "etag")
    return options


def list_tables(lake: Lake) -> list[str]:
    """Names of the Delta tables in the lake, one folder level deep (``events``, ``datasets/nightly``)."""
    if lake.is_local:
        root = Path(lake.root.removeprefix("file://"))
        if not root.is_dir():
            return []
        return sorted(
            str(path.parent.relative_to(root))
            for pattern in ("*/_delta_log", "*/*/_delta_log")
            for path in root.glob(pattern)
            if path.is_dir()
        )
    filesystem, prefix = pafs.FileSystem.from_uri(lake.root)
    names: list[str] = []
    for parent in ("", *_child_dirs(filesystem, prefix)):
        for child in _child_dirs(filesystem, f"{prefix}/{parent}".rstrip("/")):
            name = f"{parent}/{child}".lstrip("/")
            if filesystem.get_file_info(f"{prefix}/{name}/_delta_log").type == pafs.FileType.Directory:
                names.append(name)
    return sorted(names)


def _child_dirs(filesystem: pafs.FileSystem, path: str) -> list[str]:
    selector = pafs.FileSelector(path, allow_not_found=True)
    return [
        info.base_name for info in filesystem.get_file_info(selector)
        if info.type == pafs.FileType.Directory and info.base_name != "_delta_log"
    ]
