"""The lake's table and view names, without their schemas (``schemas.tables``): cheap to import, so the
CLI and readers that only name a table do not load pyarrow. ``schemas.tables`` is the catalogue."""

from __future__ import annotations

EVENTS_TABLE = "events"
QUARANTINE_TABLE = "quarantine"
LLM_REQUESTS_TABLE = "llm_requests"
LLM_RESPONSES_TABLE = "llm_responses"
TOOL_CALLS_TABLE = "tool_calls"
TOOL_RESULTS_TABLE = "tool_results"
REWARDS_TABLE = "rewards"
ROLLOUT_STARTS_TABLE = "rollout_starts"
ROLLOUT_ENDS_TABLE = "rollout_ends"
LLM_CALLS_VIEW = "llm_calls"
LLM_CALL_PROMPTS_VIEW = "llm_call_prompts"
LLM_CALL_MESSAGES_VIEW = "llm_call_messages"
TOOL_STEPS_VIEW = "tool_steps"
ROLLOUTS_VIEW = "rollouts"
DATASET_VERSIONS_TABLE = "dataset_versions"
DATASET_LINEAGE_TABLE = "dataset_lineage"
FAILURE_PACKETS_TABLE = "failure_packets"
TRAIN_RUNS_TABLE = "train_runs"
CHECKPOINTS_TABLE = "checkpoints"
TRAIN_LEASES_TABLE = "train_leases"
RUNS_TABLE = "runs"
FORGET_AUDIT_TABLE = "forget_audit"
LAKE_IDENTITY_TABLE = "lake_identity"
COMPACTED_LLM_CALLS_TABLE = "compacted_llm_calls"
COMPACTED_ROLLOUTS_TABLE = "compacted_rollouts"
COMPACTED_TOOL_STEPS_TABLE = "compacted_tool_steps"
COMPACTION_MARKS_TABLE = "compaction_marks"

INGESTED_TABLE_NAMES: tuple[str, ...] = (EVENTS_TABLE, QUARANTINE_TABLE, ROLLOUT_STARTS_TABLE, ROLLOUT_ENDS_TABLE,
                                        LLM_REQUESTS_TABLE, LLM_RESPONSES_TABLE, TOOL_CALLS_TABLE, TOOL_RESULTS_TABLE,
                                        REWARDS_TABLE)
"""The names of ``schemas.tables.INGESTED_TABLES``: every table the ingester writes."""

ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    LLM_REQUESTS_TABLE: ("extends_call_id", "extends_tokens", "extends_messages", "extends_tools"),
}
"""Nullable columns added to an ingested table after lakes were written without them (tests/fixtures/lake-v1):
the ingester adds them to such a table when it opens it, and SQL reads them as NULL until then
(``store.sql.create_table_view``); add a column here (and to the table's schema in ``schemas.tables``) when you
add one to an ingested table."""

DATASETS_FOLDER = "datasets"
DATASETS_PREFIX = f"{DATASETS_FOLDER}/"


def dataset_table(name: str) -> str:
    """The table of dataset ``name``: ``datasets/<name>``.

    >>> dataset_table("nightly")
    'datasets/nightly'
    """
    return f"{DATASETS_PREFIX}{name}"
