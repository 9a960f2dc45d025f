"""Compare two dataset versions: content, config, sources, rollouts, rewards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipelines.datasets.registry import get_manifest, lineage_rows
from store.lake import Lake


@dataclass
class DatasetDiff:
    a: str
    b: str
    same_content: bool
    config_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Dotted config key -> (value in a, value in b)."""
    source_changes: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    count_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    rollouts_added: list[str] = field(default_factory=list)
    rollouts_removed: list[str] = field(default_factory=list)
    rewards_changed: list[str] = field(default_factory=list)
    """Rollouts in both whose reward changed (e.g. a late reward arrived)."""


def diff_versions(lake: Lake, a: tuple[str, int | None], b: tuple[str, int | None]) -> DatasetDiff:
    """What differs between dataset versions ``a`` and ``b`` (each (name, version or None for latest))."""
    ma, mb = get_manifest(lake, *a), get_manifest(lake, *b)
    la, lb = _rollouts(lake, ma), _rollouts(lake, mb)
    common = sorted(la.keys() & lb.keys())
    return DatasetDiff(
        a=f"{ma['dataset']}@{ma['version']}",
        b=f"{mb['dataset']}@{mb['version']}",
        same_content=ma["content_hash"] == mb["content_hash"],
        config_changes=_changes(_flatten(ma["config"]), _flatten(mb["config"])),
        source_changes=_changes(ma["sources"], mb["sources"]),
        count_changes=_changes(_flatten(ma["counts"]), _flatten(mb["counts"])),
        rollouts_added=sorted(lb.keys() - la.keys()),
        rollouts_removed=sorted(la.keys() - lb.keys()),
        rewards_changed=[r for r in common if la[r] != lb[r]],
    )


def _rollouts(lake: Lake, manifest: dict[str, Any]) -> dict[str, float]:
    rows: pa.Table = lineage_rows(lake, manifest["dataset"], manifest["version"])
    return dict(zip(rows["rollout_id"].to_pylist(), rows["reward"].to_pylist()))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _changes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
