"""Which dataset versions a tenant may see.

Dataset rows carry a tenant column, but a version's manifest (counts of
selected, dropped and degenerate rollouts, group statistics) and its
group-relative advantages are computed over every rollout the build
selected. So a version is visible to tenant T only when its build selected
T's rollouts alone: its manifest filters name exactly ``tenants: [T]``
(``trajlake build-dataset --tenant T``). Versions built over several tenants,
or over all, are visible to no tenant through the API.

A forget deletes rows from the dataset table and drops the table's history
before it (``store.forget``), so a version stays listed but its rows may no
longer be readable: ``read_version`` says where they are read, if anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from deltalake.exceptions import DeltaError

from schemas.tables import DATASET_VERSIONS_TABLE, dataset_table
from store.lake import Lake, TableMissing

History = Literal["kept", "forgotten_rows_removed", "vacuumed"]


@dataclass(frozen=True)
class VisibleVersion:
    """One registry row a tenant may see, with its parsed manifest."""

    dataset: str
    version: int
    row: dict[str, Any]
    """The registry row without the manifest column."""
    manifest: dict[str, Any]
    read_version: int | None = None
    """The Delta version its rows are read at: its own; the table's current one when a forget has since
    deleted rows from this newest build; None when a forget vacuumed its history (rows gone for good)."""

    @property
    def history(self) -> History:
        if self.read_version is None:
            return "vacuumed"
        return "kept" if self.read_version == self.version else "forgotten_rows_removed"


def built_for(manifest: dict[str, Any]) -> str | None:
    """The single tenant a version was built for, None when its build selected several or all."""
    tenants = (manifest.get("filters") or {}).get("tenants") or []
    return tenants[0] if len(tenants) == 1 and isinstance(tenants[0], str) else None


def visible_versions(lake: Lake, tenant: str) -> dict[str, list[VisibleVersion]]:
    """Dataset name -> the versions built for ``tenant`` only, oldest first."""
    if not lake.exists(DATASET_VERSIONS_TABLE):
        return {}
    rows = lake.read(DATASET_VERSIONS_TABLE).sort_by([("dataset", "ascending"), ("version", "ascending")]).to_pylist()
    newest = {row["dataset"]: row["version"] for row in rows}
    found: dict[str, list[VisibleVersion]] = {}
    for row in rows:
        manifest = json.loads(row.pop("manifest"))
        if built_for(manifest) == tenant:
            name, version = row["dataset"], row["version"]
            read_at = _read_version(lake, name, version, newest=newest[name])
            found.setdefault(name, []).append(VisibleVersion(name, version, row, manifest, read_at))
    return found


def _read_version(lake: Lake, name: str, version: int, *, newest: int) -> int | None:
    table = dataset_table(name)
    current = lake.version(table)
    if current is None:
        return None
    if _readable(lake, table, version, current):
        return version
    return current if version == newest else None


_READABLE: dict[tuple[str, str, int, int], bool] = {}
"""(lake, table, version, table's current version) -> whether that version can still be opened."""


def _readable(lake: Lake, table: str, version: int, current: int) -> bool:
    key = (lake.root, table, version, current)
    if key not in _READABLE:
        if len(_READABLE) > 10_000:
            _READABLE.clear()
        try:
            lake.table(table, version=version)
            _READABLE[key] = True
        except (TableMissing, DeltaError):
            _READABLE[key] = False
    return _READABLE[key]
