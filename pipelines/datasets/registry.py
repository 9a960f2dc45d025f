"""Dataset versions: the ``dataset_versions`` registry, lineage rows, reading back.

Each build overwrites ``datasets/NAME`` in one Delta commit, so the table's
version history is the dataset's history and any past version is read by
time travel. The registry (one row per build, manifest as JSON) and
``dataset_lineage`` (one row per rollout per version: the events it used) are
appended after the dataset commit; a version is official once its registry
row exists.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.datasets.config import DATASET_NAME
from store.lake import Lake
from schemas.errors import InputError, NotFound

REGISTRY_TABLE = "dataset_versions"
LINEAGE_TABLE = "dataset_lineage"

REGISTRY = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),
        pa.field("n_rollouts", pa.int64(), nullable=False),
        pa.field("n_tokens", pa.int64(), nullable=False),
        pa.field("n_trained_tokens", pa.int64(), nullable=False),
        pa.field("code_version", pa.string()),
        pa.field("manifest", pa.string(), nullable=False),
    ]
)
"""One row per dataset version; ``manifest`` is the full JSON manifest."""

LINEAGE = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("n_samples", pa.int32(), nullable=False),
        pa.field("call_event_ids", pa.list_(pa.string()), nullable=False),
        pa.field("reward_event_ids", pa.list_(pa.string()), nullable=False),
    ]
)
"""Which events of each rollout a dataset version used (llm.request/response, reward)."""


class DatasetNotFound(NotFound):
    """No such dataset or version in the registry."""


def dataset_table(name: str) -> str:
    return f"datasets/{name}"


def check_name(name: str) -> str:
    if not DATASET_NAME.match(name):
        raise InputError(f"dataset name {name!r}: use letters, digits, '_', '-', '.' (at most 128, no '/')")
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@VERSION`` -> (name, version or None for latest)."""
    match = re.fullmatch(r"(.+?)(?:@(\d+))?", ref.strip())
    if not match:
        raise InputError(f"dataset reference {ref!r}: write NAME or NAME@VERSION")
    return check_name(match.group(1)), int(match.group(2)) if match.group(2) else None


def record_version(lake: Lake, manifest: dict[str, Any], lineage: pa.Table) -> None:
    """Append the lineage rows (``LINEAGE`` minus dataset/version), then the registry row.

    The registry row is the commit point of a build.
    """
    n = lineage.num_rows
    lineage = lineage.append_column("dataset", pa.array([manifest["dataset"]] * n, pa.string()))
    lineage = lineage.append_column("version", pa.array([manifest["version"]] * n, pa.int64()))
    lake.append(LINEAGE_TABLE, lineage.select(LINEAGE.names), schema=LINEAGE)
    counts = manifest["counts"]
    row = {
        "dataset": manifest["dataset"],
        "version": manifest["version"],
        "content_hash": manifest["content_hash"],
        "created_at": datetime.fromisoformat(manifest["built_at"]),
        "n_samples": counts["samples"],
        "n_rollouts": counts["rollouts"]["in_dataset"],
        "n_tokens": counts["tokens"],
        "n_trained_tokens": counts["trained_tokens"],
        "code_version": manifest.get("code_version"),
        "manifest": json.dumps(manifest, sort_keys=True),
    }
    lake.append(REGISTRY_TABLE, pa.Table.from_pylist([row], schema=REGISTRY), schema=REGISTRY)


def list_versions(lake: Lake, name: str | None = None) -> pa.Table:
    """Registry rows (without manifests), newest last; all datasets or one."""
    if not lake.exists(REGISTRY_TABLE):
        return REGISTRY.empty_table().drop_columns(["manifest"])
    table = lake.read(REGISTRY_TABLE, columns=[f.name for f in REGISTRY if f.name != "manifest"])
    if name is not None:
        table = table.filter(pc.equal(table["dataset"], name))
    return table.sort_by([("dataset", "ascending"), ("version", "ascending")])


def get_manifest(lake: Lake, name: str, version: int | None = None) -> dict[str, Any]:
    """The manifest of one version (latest when ``version`` is None)."""
    if not lake.exists(REGISTRY_TABLE):
        raise DatasetNotFound(f"no dataset has been built in lake {lake.root!r} yet: run trajlake build-dataset NAME")
    table = lake.read(REGISTRY_TABLE, columns=["dataset", "version", "manifest"])
    table = table.filter(pc.equal(table["dataset"], name))
    if version is not None:
        table = table.filter(pc.equal(table["version"], version))
    if table.num_rows == 0:
        known = sorted(set(list_versions(lake, name)["version"].to_pylist()))
        raise DatasetNotFound(
            f"dataset {name!r}{'' if version is None else f' version {version}'} is not in the registry"
            + (f"; its versions are {known}" if known else ": run trajlake datasets list to see what exists")
        )
    latest = table.sort_by([("version", "descending")])
    return json.loads(latest["manifest"][0].as_py())


def read_dataset(lake: Lake, name: str, version: int | None = None, *, columns: list[str] | None = None) -> pa.Table:
    """The sample rows of a registered dataset version (latest when None).

    >>> read_dataset(Lake("./lake"), "nightly", 3, columns=["rollout_id", "advantage"])  # doctest: +SKIP
    """
    manifest = get_manifest(lake, name, version)
    return lake.read(dataset_table(name), version=manifest["version"], columns=columns)


def lineage_rows(lake: Lake, name: str, version: int) -> pa.Table:
    """The ``dataset_lineage`` rows of one version."""
    table = lake.read(LINEAGE_TABLE)
    mask = pc.and_(pc.equal(table["dataset"], name), pc.equal(table["version"], version))
    return table.filter(mask).sort_by("rollout_id")
