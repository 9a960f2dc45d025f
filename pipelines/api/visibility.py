"""Which dataset versions a tenant may see.

Dataset rows carry a tenant column, but a version's manifest (counts of
selected, dropped and degenerate rollouts, group statistics) and its
group-relative advantages are computed over every rollout the build
selected. So a version is visible to tenant T only when its build selected
T's rollouts alone: its manifest filters name exactly ``tenants: [T]``
(``trajlake build-dataset --tenant T``). Versions built over several tenants,
or over all, are visible to no tenant through the API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipelines.registry import REGISTRY_TABLE
from store.lake import Lake


@dataclass(frozen=True)
class VisibleVersion:
    """One registry row a tenant may see, with its parsed manifest."""

    dataset: str
    version: int
    row: dict[str, Any]
    """The registry row without the manifest column."""
    manifest: dict[str, Any]


def built_for(manifest: dict[str, Any]) -> str | None:
    """The single tenant a version was built for, None when its build selected several or all."""
    tenants = (manifest.get("filters") or {}).get("tenants") or []
    return tenants[0] if len(tenants) == 1 and isinstance(tenants[0], str) else None


def visible_versions(lake: Lake, tenant: str) -> dict[str, list[VisibleVersion]]:
    """Dataset name -> the versions built for ``tenant`` only, oldest first."""
    if not lake.exists(REGISTRY_TABLE):
        return {}
    found: dict[str, list[VisibleVersion]] = {}
    for row in lake.read(REGISTRY_TABLE).sort_by([("dataset", "ascending"), ("version", "ascending")]).to_pylist():
        manifest = json.loads(row.pop("manifest"))
        if built_for(manifest) == tenant:
            found.setdefault(row["dataset"], []).append(VisibleVersion(row["dataset"], row["version"], row, manifest))
    return found
