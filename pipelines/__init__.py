"""Batch pipelines over the lake, by job: ``datasets`` (selection, reward join, group advantages,
token-exact merging, versioned datasets, export), ``lineage`` (trace any id, OpenLineage events) and
``workbench`` (harness comparison, failure packets). The names most callers need are re-exported here,
imported on first use.

>>> from pipelines import BuildConfig, build_dataset, read_dataset  # doctest: +SKIP
>>> from pipelines.lineage.trace import lineage  # doctest: +SKIP
>>> result = build_dataset(lake, "nightly", BuildConfig(advantage="grpo"))  # doctest: +SKIP
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_MODULES = {
    "pipelines.datasets.build": ("BuildResult", "EmptyDataset", "build_dataset"),
    "pipelines.datasets.config": ("BuildConfig", "RewardRule", "Selection", "ToolCredit"),
    "pipelines.datasets.diff": ("DatasetDiff", "diff_versions"),
    "pipelines.datasets.export": ("ExportResult", "export_parquet"),
    "pipelines.datasets.outcomes": ("SuccessRule",),
    "pipelines.datasets.registry": ("DatasetNotFound", "get_manifest", "list_versions", "parse_ref", "read_dataset"),
    "pipelines.datasets.samples": ("CorruptTable",),
    "pipelines.datasets.selection": ("BadFilter",),
    "pipelines.datasets.sources": ("SourceMissing",),
    "pipelines.lineage.openlineage": ("run_event",),
    "pipelines.lineage.trace": ("AmbiguousId", "Lineage", "LineageNotFound"),
    "pipelines.workbench.compare": ("Arm", "CompareConfig", "CompareError", "Comparison", "compare"),
    "pipelines.workbench.failures": ("Extraction", "FailureConfig", "NothingSelected", "append_packets",
                                     "extract_failures", "write_jsonl"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load on first use: importing one stage (``pipelines.datasets.config``) does not import every stage."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
