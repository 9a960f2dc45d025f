"""Dataset pipelines: selection, reward join, group advantages, token-exact
merging, versioned datasets with manifests, lineage and export.

>>> from pipelines import BuildConfig, build_dataset, read_dataset, lineage  # doctest: +SKIP
>>> result = build_dataset(lake, "nightly", BuildConfig(advantage="grpo"))  # doctest: +SKIP
"""

from pipelines.build import BuildResult, EmptyDataset, build_dataset
from pipelines.compare import Arm, CompareConfig, CompareError, Comparison, compare
from pipelines.config import BuildConfig, RewardRule, Selection, ToolCredit
from pipelines.diff import DatasetDiff, diff_versions
from pipelines.export import ExportResult, export_parquet
from pipelines.failures import Extraction, FailureConfig, NothingSelected, append_packets, extract_failures, write_jsonl
from pipelines.outcomes import SuccessRule
from pipelines.lineage import AmbiguousId, Lineage, LineageNotFound, lineage
from pipelines.openlineage import run_event
from pipelines.registry import DatasetNotFound, get_manifest, list_versions, parse_ref, read_dataset
from pipelines.samples import CorruptTable
from pipelines.selection import BadFilter
from pipelines.sources import SourceMissing

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
    "lineage",
    "list_versions",
    "parse_ref",
    "read_dataset",
    "run_event",
]
