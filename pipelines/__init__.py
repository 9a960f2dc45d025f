"""Batch pipelines over the lake, by job: ``datasets`` (selection, reward join, group advantages,
token-exact merging, versioned datasets, export), ``lineage`` (trace any id, OpenLineage events) and
``workbench`` (harness comparison, failure packets). The names most callers need are re-exported here.

>>> from pipelines import BuildConfig, build_dataset, read_dataset  # doctest: +SKIP
>>> from pipelines.lineage.trace import lineage  # doctest: +SKIP
>>> result = build_dataset(lake, "nightly", BuildConfig(advantage="grpo"))  # doctest: +SKIP
"""

from pipelines.datasets.build import BuildResult, EmptyDataset, build_dataset
from pipelines.datasets.config import BuildConfig, RewardRule, Selection, ToolCredit
from pipelines.datasets.diff import DatasetDiff, diff_versions
from pipelines.datasets.export import ExportResult, export_parquet
from pipelines.datasets.outcomes import SuccessRule
from pipelines.datasets.registry import DatasetNotFound, get_manifest, list_versions, parse_ref, read_dataset
from pipelines.datasets.samples import CorruptTable
from pipelines.datasets.selection import BadFilter
from pipelines.datasets.sources import SourceMissing
from pipelines.lineage.openlineage import run_event
from pipelines.lineage.trace import AmbiguousId, Lineage, LineageNotFound
from pipelines.workbench.compare import Arm, CompareConfig, CompareError, Comparison, compare
from pipelines.workbench.failures import Extraction, FailureConfig, NothingSelected, append_packets, extract_failures, write_jsonl

__all__ = [
    "Arm",
    "CompareConfig",
    "CompareError",
    "Comparison",
    "Extraction",
    "FailureConfig",
    "NothingSelected",
    "SuccessRule",
    "append_packets",
    "compare",
    "extract_failures",
    "write_jsonl",
    "BadFilter",
    "BuildConfig",
    "BuildResult",
    "CorruptTable",
    "DatasetDiff",
    "DatasetNotFound",
    "EmptyDataset",
    "ExportResult",
    "Lineage",
    "LineageNotFound",
    "AmbiguousId",
    "RewardRule",
    "Selection",
    "SourceMissing",
    "ToolCredit",
    "build_dataset",
    "diff_versions",
    "export_parquet",
    "get_manifest",
    "list_versions",
    "parse_ref",
    "read_dataset",
    "run_event",
]
