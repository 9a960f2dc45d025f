"""Batch pipelines over the lake, by job: ``datasets`` (selection, reward join, group advantages,
token-exact merging, versioned datasets, export), ``lineage`` (trace any id, OpenLineage events) and
``workbench`` (harness comparison, failure packets). The names most callers need are re-exported here,
imported on first use.

>>> from pipelines import BuildConfig, build_dataset, read_dataset  # doctest: +SKIP
>>> from pipelines.lineage.trace import lineage  # doctest: +SKIP
>>> result = build_dataset(lake, "nightly", BuildConfig(advantage="grpo"))  # doctest: +SKIP
"""

from __future__ import annotations

from schemas.lazy import lazy_exports

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
__getattr__, __all__ = lazy_exports(__name__, _MODULES)
