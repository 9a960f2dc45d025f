"""The lake's catalogue: every Delta table's name and Arrow schema, and the SQL views over them.

Read this page to learn the lake. One root (a folder, or an ``s3://`` prefix)
holds one Delta table per folder. ``CATALOGUE`` at the end lists them with
what a row is, the row's key and the module that writes it; the writers stay
with their packages, but a table is named only here: code says
``EVENTS_TABLE``, never ``"events"``, and ``store.lake.Lake`` refuses to write
a table that is not catalogued.

The ingester appends ``events`` (every valid event: the source of truth; the
typed tables can be rebuilt from it), ``quarantine`` (invalid input with its
reason) and one typed table per event kind. Request/response and start/finish
halves arrive at different times (hours apart for a rollout), so the typed
tables are append-only and the joined shapes users query (``llm_calls``,
``tool_steps``, ``rollouts``: ``VIEWS``) are SQL views over them
(``store/views.sql``). Dataset builds write ``datasets/<name>`` (one Delta
version per build) with ``dataset_versions`` and ``dataset_lineage``; the
trainer writes ``train_runs``, ``train_leases`` and ``checkpoints``; the
scheduler ``runs``; forget ``forget_audit``.

Token ids are list<int32> and logprobs list<float32>, never JSON strings;
scalar summaries (token counts, latency, status, reward) sit beside them so
analytics never decode token arrays. Free-form JSON values (messages, tool
arguments, metadata) are JSON strings. Times are UTC microseconds (``TS``).

The tables are a public format: a user's lake written by an older trajlake
must stay readable (``tests/fixtures/lake-v1`` pins one). Adding a nullable
column is fine; renaming a table or a column, or changing a type, is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from schemas.table_names import (  # the names alone, light to import; re-exported here with their schemas
    CHECKPOINTS_TABLE,
    COMPACTED_LLM_CALLS_TABLE,
    COMPACTED_ROLLOUTS_TABLE,
    COMPACTED_TOOL_STEPS_TABLE,
    COMPACTION_MARKS_TABLE,
    DATASETS_PREFIX,
    DATASET_LINEAGE_TABLE,
    DATASET_VERSIONS_TABLE,
    EVENTS_TABLE,
    FAILURE_PACKETS_TABLE,
    FORGET_AUDIT_TABLE,
    LAKE_IDENTITY_TABLE,
    LLM_CALLS_VIEW,
    LLM_CALL_MESSAGES_VIEW,
    LLM_CALL_PROMPTS_VIEW,
    LLM_REQUESTS_TABLE,
    LLM_RESPONSES_TABLE,
    QUARANTINE_TABLE,
    REWARDS_TABLE,
    ROLLOUTS_VIEW,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
    RUNS_TABLE,
    TOOL_CALLS_TABLE,
    TOOL_RESULTS_TABLE,
    TOOL_STEPS_VIEW,
    TRAIN_LEASES_TABLE,
    TRAIN_RUNS_TABLE,
    dataset_table,
)

TS = pa.timestamp("us", tz="UTC")
"""Every time column: UTC, microseconds."""
TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())

KAFKA_FIELDS = [
    pa.field("kafka_topic", pa.string(), nullable=False),
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
]

# ---- Ingested tables (ingest.ingester; the typed ones also store.rebuild) ----

# Columns every typed table shares: who, where in the rollout, which harness.
KEY_FIELDS = [
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("ts", TS, nullable=False),
    pa.field("tenant", pa.string(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("rollout_id", pa.string(), nullable=False),
    pa.field("attempt", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("span_id", pa.string()),
    pa.field("parent_span_id", pa.string()),
    pa.field("harness_name", pa.string()),
    pa.field("harness_version", pa.string()),
    pa.field("harness_config_hash", pa.string()),
]

EVENTS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("type", pa.string(), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("payload", pa.string(), nullable=False),
        pa.field("token_ids", TOKENS),
        pa.field("logprobs", LOGPROBS),
        *KAFKA_FIELDS,
        pa.field("ingested_at", TS, nullable=False),
    ]
)
"""Every valid event. ``payload`` is the payload JSON without its token arrays,
which live in ``token_ids`` (prompt ids of llm.request, response ids of
llm.response) and ``logprobs``, so the log itself is token-exact."""

QUARANTINE = pa.schema(
    [
        pa.field("raw", pa.binary(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("field", pa.string(), nullable=False),
        pa.field("event_id", pa.string()),
        pa.field("kafka_key", pa.binary()),
        *KAFKA_FIELDS,
        pa.field("quarantined_at", TS, nullable=False),
    ]
)
"""Input that failed validation: the raw bytes, kept whole, and why."""

LLM_REQUESTS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("model", pa.string()),
        pa.field("messages", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("tools", pa.string()),
        pa.field("params", pa.string()),
        pa.field("prompt_token_ids", TOKENS),
        pa.field("n_prompt_tokens", pa.int32()),
        pa.field("tokenizer", pa.string()),
        pa.field("chat_template_hash", pa.string()),
        pa.field("idempotency_key", pa.string()),
        *KAFKA_FIELDS,
        pa.field("extends_call_id", pa.string()),
        pa.field("extends_tokens", pa.int32()),
        pa.field("extends_messages", pa.int32()),
        pa.field("extends_tools", pa.bool_()),
    ]
)
"""``prompt_token_ids`` holds the ids as sent: the whole prompt, or with a prefix reference
(``extends_call_id``, ``extends_tokens``; NULL in files written before they existed) only the ids
after the shared prefix. ``n_prompt_tokens`` is always the FULL prompt's length (``extends_tokens`` +
the new ids), so token analytics stay right; the full ids come from the ``llm_call_prompts`` view.
Likewise ``messages`` holds only the messages after the first ``extends_messages`` of the referenced
call's, and ``tools`` is NULL when ``extends_tools``: the full ones come from ``llm_call_messages``."""

LLM_RESPONSES = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("tool_calls", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("response_token_ids", TOKENS),
        pa.field("logprobs", LOGPROBS),
        pa.field("n_response_tokens", pa.int32()),
        pa.field("token_source", pa.string(), nullable=False),
        pa.field("usage", pa.string()),
        pa.field("latency_ms", pa.float64()),
        pa.field("upstream_retries", pa.int32(), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("error", pa.string()),
        *KAFKA_FIELDS,
    ]
)

TOOL_CALLS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("arguments", pa.string()),
        *KAFKA_FIELDS,
    ]
)

TOOL_RESULTS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("result", pa.string()),
        pa.field("error", pa.string()),
        pa.field("duration_ms", pa.float64()),
        pa.field("state_changed", pa.bool_()),
        *KAFKA_FIELDS,
    ]
)

REWARDS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("source", pa.string()),
        *KAFKA_FIELDS,
    ]
)

ROLLOUT_STARTS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("metadata", pa.string()),
        *KAFKA_FIELDS,
    ]
)
"""``group_id`` is filled with the task_id when the producer sent none."""

ROLLOUT_ENDS = pa.schema(
    [
        *KEY_FIELDS,
        pa.field("status", pa.string(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("steps", pa.int32()),
        *KAFKA_FIELDS,
    ]
)

TYPED_TABLES: dict[str, tuple[str, pa.Schema]] = {
    "rollout.started": (ROLLOUT_STARTS_TABLE, ROLLOUT_STARTS),
    "rollout.finished": (ROLLOUT_ENDS_TABLE, ROLLOUT_ENDS),
    "llm.request": (LLM_REQUESTS_TABLE, LLM_REQUESTS),
    "llm.response": (LLM_RESPONSES_TABLE, LLM_RESPONSES),
    "tool.call": (TOOL_CALLS_TABLE, TOOL_CALLS),
    "tool.result": (TOOL_RESULTS_TABLE, TOOL_RESULTS),
    "reward": (REWARDS_TABLE, REWARDS),
}
"""Event type -> (table name, schema) of the typed table it lands in."""

# Columns added to an ingested table since lakes were written without them: ``schemas.table_names.ADDED_COLUMNS``.

INGESTED_TABLES: dict[str, pa.Schema] = {
    EVENTS_TABLE: EVENTS,
    QUARANTINE_TABLE: QUARANTINE,
    **{name: schema for name, schema in TYPED_TABLES.values()},
}
"""Every table the ingester writes, by name."""

# ---- Views (store.sql: joined at query time over the typed tables, store/views.sql) ----


VIEWS: dict[str, str] = {
    LLM_CALLS_VIEW: "one LLM call: its request joined with its response (token-exact); key tenant, rollout_id, call_id",
    TOOL_STEPS_VIEW: "one tool call joined with its result; key tenant, rollout_id, call_id",
    ROLLOUTS_VIEW: "one rollout: start, end, status, rewards and call/token/tool counts; key tenant, rollout_id",
    LLM_CALL_PROMPTS_VIEW: "one LLM call with its full prompt ids, prefix references resolved; key tenant, "
                           "rollout_id, call_id",
    LLM_CALL_MESSAGES_VIEW: "one LLM call with its full messages and tools (JSON), references resolved; key "
                            "tenant, rollout_id, call_id",
}
"""The joined views every SQL connection has, beside one view per table: name -> what a row is."""

# ---- Pre-joined tables (store.prejoin, written by `trajlake compact`: what the views compute, stored) ----

_CALL_KEY = ("tenant", "rollout_id", "call_id")


def _loose(f: pa.Field) -> pa.Field:
    """``f`` nullable unless it is a call key (a call seen only by one half has the other's columns NULL)."""
    return f if f.name in _CALL_KEY else f.with_nullable(True)


_REQUEST_COLUMNS = ("tenant", "task_id", "rollout_id", "attempt", "seq", "call_id", "span_id", "parent_span_id",
                    "harness_name", "harness_version", "harness_config_hash", "model", "messages", "prompt", "tools",
                    "params", "prompt_token_ids", "n_prompt_tokens", "tokenizer", "chat_template_hash",
                    "idempotency_key", "extends_call_id", "extends_tokens")
_RESPONSE_COLUMNS = ("text", "tool_calls", "finish_reason", "response_token_ids", "logprobs", "n_response_tokens",
                     "token_source", "usage", "latency_ms", "upstream_retries", "policy_version", "error")

COMPACTED_LLM_CALLS = pa.schema(
    [
        *(_loose(LLM_REQUESTS.field(name)) for name in _REQUEST_COLUMNS),
        *(_loose(LLM_RESPONSES.field(name)) for name in _RESPONSE_COLUMNS),
        pa.field("has_response", pa.bool_()),
        pa.field("requested_at", TS),
        pa.field("responded_at", TS),
        pa.field("request_event_id", pa.string()),
        pa.field("response_event_id", pa.string()),
        pa.field("response_seq", pa.int64()),
    ]
)
"""The ``llm_calls`` view's columns, in its order, computed once."""

_CALL_COLUMNS = ("tenant", "task_id", "rollout_id", "attempt", "seq", "call_id", "span_id", "parent_span_id",
                 "harness_name", "harness_version", "harness_config_hash", "name", "arguments")
_RESULT_COLUMNS = ("result", "error", "duration_ms", "state_changed")

COMPACTED_TOOL_STEPS = pa.schema(
    [
        *(_loose(TOOL_CALLS.field(name)) for name in _CALL_COLUMNS),
        *(_loose(TOOL_RESULTS.field(name)) for name in _RESULT_COLUMNS),
        pa.field("has_result", pa.bool_()),
        pa.field("called_at", TS),
        pa.field("returned_at", TS),
        pa.field("call_event_id", pa.string()),
        pa.field("result_event_id", pa.string()),
        pa.field("result_seq", pa.int64()),
    ]
)
"""The ``tool_steps`` view's columns, in its order, computed once."""

REWARD_ENTRY = pa.struct([("name", pa.string()), ("value", pa.float64()), ("source", pa.string()), ("ts", TS)])

COMPACTED_ROLLOUTS = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("harness_name", pa.string()),
        pa.field("harness_version", pa.string()),
        pa.field("harness_config_hash", pa.string()),
        pa.field("policy_version", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("status", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("steps", pa.int32()),
        pa.field("n_llm_calls", pa.int64()),
        pa.field("n_llm_errors", pa.int64()),
        pa.field("n_tool_calls", pa.int64()),
        pa.field("n_tool_errors", pa.int64()),
        pa.field("n_prompt_tokens", pa.int64()),
        pa.field("n_response_tokens", pa.int64()),
        pa.field("llm_latency_ms", pa.float64()),
        pa.field("reward", pa.float64()),
        pa.field("n_rewards", pa.int64()),
        pa.field("rewards", pa.list_(REWARD_ENTRY)),
        pa.field("first_event_at", TS),
        pa.field("last_event_at", TS),
    ]
)
"""The ``rollouts`` view's columns, in its order, computed once per rollout."""

COMPACTION_MARKS = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("source_version", pa.int64(), nullable=False),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("compacted_at", TS, nullable=False),
    ]
)
"""What the pre-joined tables cover: per typed source table, its Delta version (-1: not written yet) and, per
Kafka partition, the highest offset folded in (rows of a partition arrive in offset order: the ingester commits
them so); a source without rows has one row with the partition columns NULL. Rewritten whole after both tables;
empty (or absent) means nothing is covered."""

# ---- Datasets (pipelines.datasets, pipelines.workbench) ----



SAMPLES = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("start_reason", pa.string(), nullable=False),
        pa.field("call_ids", pa.list_(pa.string()), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("tokenizer", pa.string()),
        pa.field("input_ids", TOKENS, nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("old_logprobs", LOGPROBS, nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("token_weight", pa.float32(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("n_trained_tokens", pa.int32(), nullable=False),
    ]
)
"""One merged training sample (table ``datasets/<name>``, ``dataset_table``).

``loss_mask`` is 1 on tokens the loss covers (the sampled response tokens; the
observation tokens in observation-prediction datasets). ``old_logprobs`` holds
the engine's logprob on masked positions and 0 elsewhere. ``advantage`` is the
rollout's; ``token_weight`` is the rollout-level token mean 1 / (R x T_r), so
sum(token_weight x loss_mask) over the dataset is 1. ``start_reason`` says why
this sample began: ``first`` or the mismatch class that prevented merging
(``chat_template``, ``retokenization``, ``truncation``, ``other``).
"""

DATASET_VERSIONS = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("created_at", TS, nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),
        pa.field("n_rollouts", pa.int64(), nullable=False),
        pa.field("n_tokens", pa.int64(), nullable=False),
        pa.field("n_trained_tokens", pa.int64(), nullable=False),
        pa.field("code_version", pa.string()),
        pa.field("manifest", pa.string(), nullable=False),
    ]
)
"""``manifest`` is the full JSON manifest (config, source table versions, counts, merge statistics)."""

DATASET_LINEAGE = pa.schema(
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
"""``call_event_ids``: the llm.request/response events the rollout's samples used; ``reward_event_ids``: its rewards."""

FAILURE_PACKETS = pa.schema(
    [
        pa.field("extraction_id", pa.string(), nullable=False),
        pa.field("packet_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("harness_name", pa.string()),
        pa.field("harness_version", pa.string()),
        pa.field("harness_config_hash", pa.string()),
        pa.field("status", pa.string()),
        pa.field("failing_tool", pa.string()),
        pa.field("error_signature", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("rollouts", pa.int32(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("rollout_id", pa.string()),
        pa.field("packet", pa.string(), nullable=False),
        pa.field("extracted_at", TS, nullable=False),
    ]
)
"""``packet`` is the packet's canonical JSON. ``task_id``/``rollout_id`` are set for rollout packets, NULL
for clusters; ``extracted_at`` (when the rows were written) is the only wall-clock value and lives outside
the packets."""

# ---- Trainer (trainer.records, trainer.leases) ----

TRAIN_RUNS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("dataset_version", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("host", pa.string(), nullable=False),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("ts", TS, nullable=False),
    ]
)
"""``status`` changes as ``trainer.records.RUN_TRANSITIONS`` allows. ``step``: the optimizer step the run
starts from (started) or stopped at (finished/failed; -1: failed before it started)."""

CHECKPOINTS = pa.schema(
    [
        pa.field("checkpoint_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("dataset_version", pa.int64(), nullable=False),
        pa.field("base_model", pa.string(), nullable=False),
        pa.field("parent_checkpoint_id", pa.string()),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("config", pa.string(), nullable=False),
        pa.field("code_version", pa.string(), nullable=False),
        pa.field("metrics", pa.string(), nullable=False),
        pa.field("ds_path", pa.string(), nullable=False),
        pa.field("hf_path", pa.string(), nullable=False),
        pa.field("tokenizer", pa.string(), nullable=False),
        pa.field("world_size", pa.int32(), nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),
        pa.field("n_tokens", pa.int64(), nullable=False),
        pa.field("steps", pa.int64(), nullable=False),
        pa.field("created_at", TS, nullable=False),
    ]
)
"""``config`` and ``metrics`` are JSON objects (TrainConfig + DeepSpeed config; final loss, eval loss,
tokens/s...). The ``checkpoint_id`` equals the ``run_id`` that produced it."""

TRAIN_LEASES = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("dataset_version", pa.int64(), nullable=False),
        pa.field("claim", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("run_dir", pa.string(), nullable=False),
        pa.field("lease_until", TS),
        pa.field("recorded_at", TS, nullable=False),
    ]
)
"""``lease_until`` null: released. Each claim is a Delta app transaction ``train:<dataset>@<version>``."""

# ---- The lake's own bookkeeping (store.runs, store.forget, store.identity) ----

RUNS = pa.schema(
    [
        pa.field("job", pa.string(), nullable=False),
        pa.field("window_key", pa.string(), nullable=False),
        pa.field("window_start", TS, nullable=False),
        pa.field("window_end", TS, nullable=False),
        pa.field("trigger", pa.string(), nullable=False),
        pa.field("claim", pa.int64(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("started_at", TS, nullable=False),
        pa.field("ended_at", TS),
        pa.field("lease_until", TS),
        pa.field("retry_at", TS),
        pa.field("dataset_version", pa.int64()),
        pa.field("checkpoint", pa.string()),
        pa.field("results", pa.string()),
        pa.field("error", pa.string()),
        pa.field("recorded_at", TS, nullable=False),
    ]
)
"""``status``: running, failed, succeeded, gave_up; a run's current state is its row with the highest
``claim``, then ``recorded_at`` (see ``store.runs``)."""

FORGET_AUDIT = pa.schema(
    [
        pa.field("forget_id", pa.string(), nullable=False),
        pa.field("requested_at", TS, nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("tenant", pa.string()),
        pa.field("rollouts", pa.list_(pa.string()), nullable=False),
        pa.field("user_sha256", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("table", pa.string(), nullable=False),
        pa.field("rows_deleted", pa.int64(), nullable=False),
        pa.field("files_vacuumed", pa.int64(), nullable=False),
        pa.field("version_before", pa.int64()),
        pa.field("version_after", pa.int64()),
        pa.field("dataset_versions_marked", pa.list_(pa.int64()), nullable=False),
        pa.field("finished_at", TS, nullable=False),
    ]
)
"""``table`` is empty when the lake had none. The user id is kept only as a SHA-256 so the audit itself
holds no user id."""

LAKE_IDENTITY = pa.schema(
    [pa.field("lake_id", pa.string(), nullable=False), pa.field("created_at", TS, nullable=False)]
)
"""Control events carry ``lake_id``, so processes sharing a broker can tell their own lake's events."""


# ---- The catalogue ----


@dataclass(frozen=True)
class LakeTable:
    """One lake table: its name (folder under the lake root), columns, what a row is, its key, its writer."""

    name: str
    schema: pa.Schema
    row: str
    key: tuple[str, ...]
    writer: str


def _typed(name: str, schema: pa.Schema, row: str) -> LakeTable:
    return LakeTable(name, schema, row, ("tenant", "event_id"), "ingest.ingester (rebuilt by store.rebuild)")


CATALOGUE: dict[str, LakeTable] = {t.name: t for t in (
    LakeTable(EVENTS_TABLE, EVENTS, "one valid event, token arrays in columns, with its Kafka position",
          ("tenant", "event_id"), "ingest.ingester"),
    LakeTable(QUARANTINE_TABLE, QUARANTINE, "one invalid Kafka message: its raw bytes and why it was refused",
          ("kafka_topic", "kafka_partition", "kafka_offset"), "ingest.ingester"),
    _typed(ROLLOUT_STARTS_TABLE, ROLLOUT_STARTS, "one rollout.started event (group, policy, metadata)"),
    _typed(ROLLOUT_ENDS_TABLE, ROLLOUT_ENDS, "one rollout.finished event (status, reason, steps)"),
    _typed(LLM_REQUESTS_TABLE, LLM_REQUESTS, "one llm.request event: messages and exact prompt token ids"),
    _typed(LLM_RESPONSES_TABLE, LLM_RESPONSES, "one llm.response event: text, sampled token ids, logprobs"),
    _typed(TOOL_CALLS_TABLE, TOOL_CALLS, "one tool.call event"),
    _typed(TOOL_RESULTS_TABLE, TOOL_RESULTS, "one tool.result event"),
    _typed(REWARDS_TABLE, REWARDS, "one reward event (several per rollout, late ones too)"),
    LakeTable(dataset_table("<name>"), SAMPLES, "one merged training sample; one Delta version per build",
          ("sample_id",), "pipelines.datasets.build"),
    LakeTable(DATASET_VERSIONS_TABLE, DATASET_VERSIONS, "one built dataset version with its manifest",
          ("dataset", "version"), "pipelines.datasets.registry"),
    LakeTable(DATASET_LINEAGE_TABLE, DATASET_LINEAGE, "one rollout used by a dataset version: the events it used",
          ("dataset", "version", "rollout_id"), "pipelines.datasets.registry"),
    LakeTable(FAILURE_PACKETS_TABLE, FAILURE_PACKETS, "one failure packet (a rollout or a cluster) of an extraction",
          ("extraction_id", "packet_id"), "pipelines.workbench.failures"),
    LakeTable(TRAIN_RUNS_TABLE, TRAIN_RUNS, "one status change of a training run; the newest row is its state",
          ("run_id", "ts"), "trainer.records"),
    LakeTable(CHECKPOINTS_TABLE, CHECKPOINTS, "one trained checkpoint and the dataset version it came from",
          ("checkpoint_id",), "trainer.records"),
    LakeTable(TRAIN_LEASES_TABLE, TRAIN_LEASES, "one claim, renewal or release of a dataset version's training lease",
          ("dataset", "dataset_version", "claim", "recorded_at"), "trainer.leases"),
    LakeTable(RUNS_TABLE, RUNS, "one state change of a scheduled job's run for one window",
          ("job", "window_key", "claim", "recorded_at"), "store.runs (the scheduler)"),
    LakeTable(FORGET_AUDIT_TABLE, FORGET_AUDIT, "one table a forget request went through, with the rows it deleted",
          ("forget_id", "table"), "store.forget"),
    LakeTable(LAKE_IDENTITY_TABLE, LAKE_IDENTITY, "the lake's one identity row, written on first use",
          ("lake_id",), "store.identity"),
    LakeTable(COMPACTED_LLM_CALLS_TABLE, COMPACTED_LLM_CALLS, "one LLM call as the llm_calls view shows it, "
          "compacted (derived: as of compaction_marks)", _CALL_KEY, "store.prejoin (trajlake compact)"),
    LakeTable(COMPACTED_TOOL_STEPS_TABLE, COMPACTED_TOOL_STEPS, "one tool step as the tool_steps view shows it, "
          "compacted (derived: as of compaction_marks)", _CALL_KEY, "store.prejoin (trajlake compact)"),
    LakeTable(COMPACTED_ROLLOUTS_TABLE, COMPACTED_ROLLOUTS, "one rollout as the rollouts view shows it, compacted "
          "(derived: as of compaction_marks)", ("tenant", "rollout_id"),
          "store.prejoin (trajlake compact)"),
    LakeTable(COMPACTION_MARKS_TABLE, COMPACTION_MARKS, "the Delta version of one typed table and the highest "
          "Kafka offset of its partition that the compacted tables cover", ("source", "kafka_topic", "kafka_partition"),
          "store.prejoin (trajlake compact)"),
)}
"""Every table of the lake by name; ``datasets/<name>`` stands for each dataset's table."""


def catalogued(table: str) -> bool:
    """Whether ``table`` names a catalogued table (``datasets/<name>`` for any one-level name).

    >>> catalogued("events"), catalogued("datasets/nightly"), catalogued("scores")
    (True, True, False)
    """
    if table.startswith(DATASETS_PREFIX):
        name = table.removeprefix(DATASETS_PREFIX)
        return bool(name) and "/" not in name
    return table in CATALOGUE
