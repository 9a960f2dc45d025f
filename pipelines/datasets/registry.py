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
from schemas.tables import (
    DATASET_LINEAGE,
    DATASET_LINEAGE_TABLE,
    DATASET_VERSIONS,
    DATASET_VERSIONS_TABLE,
    dataset_table,
)
from store.lake import Lake
from schemas.errors import InputError, NotFound


class DatasetNotFound(NotFound):
    """No such dataset or version in the registry."""


MAX_VERSION = 2**63 - 1
"""The largest dataset version the registry can hold (``version`` is an int64 column)."""


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
    """Append the lineage rows (``DATASET_LINEAGE`` minus dataset/version), then the registry row.

    The registry row is the commit point of a build.
    """
    n = lineage.num_rows
    lineage = lineage.append_column("dataset", pa.array([manifest["dataset"]] * n, pa.string()))
    lineage = lineage.append_column("version", pa.array([manifest["version"]] * n, pa.int64()))
    lake.append(DATASET_LINEAGE_TABLE, lineage.select(DATASET_LINEAGE.names), schema=DATASET_LINEAGE)
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
    lake.append(DATASET_VERSIONS_TABLE, pa.Table.from_pylist([row], schema=DATASET_VERSIONS), schema=DATASET_VERSIONS)


def list_versions(lake: Lake, name: str | None = None) -> pa.Table:
    """Registry rows (without manifests), newest last; all datasets or one."""
    if not lake.exists(DATASET_VERSIONS_TABLE):
        return DATASET_VERSIONS.empty_table().drop_columns(["manifest"])
    table = lake.read(DATASET_VERSIONS_TABLE, columns=[f.name for f in DATASET_VERSIONS if f.name != "manifest"])
    if name is not None:
        table = table.filter(pc.equal(table["dataset"], name))
    return table.sort_by([("dataset", "ascending"), ("version", "ascending")])


def get_manifest(lake: Lake, name: str, version: int | None = None) -> dict[str, Any]:
    """The manifest of one version (latest when ``version`` is None)."""
    if not lake.exists(DATASET_VERSIONS_TABLE):
        raise DatasetNotFound(f"no dataset has been built in lake {lake.root!r} yet: run trajlake build-dataset NAME")
    table = lake.read(DATASET_VERSIONS_TABLE, columns=["dataset", "version", "manifest"])
    table = table.filter(pc.equal(table["dataset"], name))
    if version is not None:  # past int64, the column's type, no version exists (and pyarrow refuses to compare)
        table = table.filter(pc.equal(table["version"], version)) if version <= MAX_VERSION else table.slice(0, 0)
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
    table = lake.read(DATASET_LINEAGE_TABLE)
    mask = pc.and_(pc.equal(table["dataset"], name), pc.equal(table["version"], version))
    return table.filter(mask).sort_by("rollout_id")
