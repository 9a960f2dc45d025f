"""Arrow schemas of the lake's Delta tables.

The ingester appends: ``events`` (every valid event: the source of truth),
``quarantine`` (invalid input with its reason) and one typed table per event
kind. Request/response and start/finish halves arrive at different times
(hours apart for a rollout), so the typed tables are append-only and the
joined shapes users query (``llm_calls``, ``tool_steps``, ``rollouts``) are
SQL views over them (``store.sql``). Token ids are list<int32> and logprobs
list<float32>, never JSON strings; scalar summaries (token counts, latency,
status, reward) sit beside them so analytics never decode token arrays.
Free-form JSON values (messages, tool arguments, metadata) are JSON strings.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())

KAFKA_FIELDS = [
    pa.field("kafka_topic", pa.string(), nullable=False),
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
]

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
    ]
)

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
    "rollout.started": ("rollout_starts", ROLLOUT_STARTS),
    "rollout.finished": ("rollout_ends", ROLLOUT_ENDS),
    "llm.request": ("llm_requests", LLM_REQUESTS),
    "llm.response": ("llm_responses", LLM_RESPONSES),
    "tool.call": ("tool_calls", TOOL_CALLS),
    "tool.result": ("tool_results", TOOL_RESULTS),
    "reward": ("rewards", REWARDS),
}
"""Event type -> (table name, schema) of the typed table it lands in."""

INGESTED_TABLES: dict[str, pa.Schema] = {
    "events": EVENTS,
    "quarantine": QUARANTINE,
    **{name: schema for name, schema in TYPED_TABLES.values()},
}
"""Every table the ingester writes, by name."""

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
"""One merged training sample (table ``datasets/<name>``).

``loss_mask`` is 1 on tokens the loss covers (the sampled response tokens; the
observation tokens in observation-prediction datasets). ``old_logprobs`` holds
the engine's logprob on masked positions and 0 elsewhere. ``advantage`` is the
rollout's; ``token_weight`` is the rollout-level token mean 1 / (R x T_r), so
sum(token_weight x loss_mask) over the dataset is 1. ``start_reason`` says why
this sample began: ``first`` or the mismatch class that prevented merging
(``chat_template``, ``retokenization``, ``truncation``, ``other``).
"""
