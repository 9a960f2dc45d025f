"""The Arrow schemas of the ingested tables hold every contract field, token arrays typed."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas.events import EVENT_TYPES, PAYLOAD_MODELS, Harness
from schemas.tables import EVENTS, INGESTED_TABLES, SAMPLES, TYPED_TABLES

ENVELOPE_COLUMNS = ["event_id", "ts", "tenant", "task_id", "rollout_id", "attempt", "seq",
                    "span_id", "parent_span_id", *(f"harness_{name}" for name in Harness.model_fields)]
TOKEN_COLUMNS = {"prompt_token_ids", "response_token_ids", "token_ids", "input_ids"}
LOGPROB_COLUMNS = {"logprobs", "old_logprobs"}


def test_every_event_type_has_a_typed_table():
    assert set(TYPED_TABLES) == set(EVENT_TYPES)


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_a_typed_table_has_a_column_for_every_payload_and_envelope_field(event_type):
    _, schema = TYPED_TABLES[event_type]
    missing = [f for f in [*ENVELOPE_COLUMNS, *PAYLOAD_MODELS[event_type].model_fields] if f not in schema.names]
    assert missing == []


def test_the_events_table_keeps_type_version_and_payload():
    assert {"type", "schema_version", "payload", *ENVELOPE_COLUMNS} <= set(EVENTS.names)


@pytest.mark.parametrize("name", [*INGESTED_TABLES, "samples"])
def test_token_ids_are_int32_lists_and_logprobs_float32_lists(name):
    schema = SAMPLES if name == "samples" else INGESTED_TABLES[name]
    for field in schema:
        if field.name in TOKEN_COLUMNS:
            assert field.type == pa.list_(pa.int32()), field.name
        if field.name in LOGPROB_COLUMNS:
            assert field.type == pa.list_(pa.float32()), field.name
    assert not any(pa.types.is_string(f.type) for f in schema if f.name in TOKEN_COLUMNS | LOGPROB_COLUMNS)


def test_integer_columns_are_as_wide_as_the_contract_allows():
    # the contract caps seq at 2**63-1 and attempt, steps, upstream_retries at 2**31-1
    _, ends = TYPED_TABLES["rollout.finished"]
    _, responses = TYPED_TABLES["llm.response"]
    assert EVENTS.field("seq").type == pa.int64()
    assert EVENTS.field("attempt").type == pa.int32()
    assert ends.field("steps").type == pa.int32()
    assert responses.field("upstream_retries").type == pa.int32()
