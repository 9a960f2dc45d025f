"""Events -> rows of the ``events`` table -> rows of the typed tables.

One code path: the ingester turns each valid ``Event`` into an ``events`` row
(``events_table``), and the typed tables are derived from those rows
(``typed_tables``), the same function ``trajlake rebuild`` uses, so ingest and
rebuild can never disagree. The events row keeps the payload as JSON *without*
its token arrays; the arrays live in the ``token_ids`` / ``logprobs`` columns
(list<int32> / list<float32>), so the log is token-exact and compact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic_core import from_json, to_json

from schemas.events import Event
from schemas.tables import EVENTS, KAFKA_FIELDS, KEY_FIELDS, LOGPROBS, QUARANTINE, TOKENS, TYPED_TABLES

TOKEN_FIELDS: dict[str, tuple[str, str | None]] = {
    "llm.request": ("prompt_token_ids", None),
    "llm.response": ("response_token_ids", "logprobs"),
}
"""Event type -> (payload field moved to ``token_ids``, field moved to ``logprobs``)."""

JSON_COLUMNS = frozenset({"messages", "tools", "params", "tool_calls", "usage", "arguments", "result", "metadata"})
"""Free-form payload values, stored as JSON text (NULL when absent or null)."""

_SHARED = {f.name for f in KEY_FIELDS} | {f.name for f in KAFKA_FIELDS}
_TOKEN_COLUMNS = {"prompt_token_ids", "response_token_ids", "logprobs"}
_COUNT_COLUMNS = {"n_prompt_tokens": "token_ids", "n_response_tokens": "token_ids"}


@dataclass(frozen=True)
class KafkaCoordinates:
    """Where a message came from: the events row's provenance."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Rejected:
    """An input that failed validation, with its reason (one ``quarantine`` row)."""

    raw: bytes
    field: str
    reason: str
    key: bytes | None
    coordinates: KafkaCoordinates
    event_id: str | None = None


def events_table(
    events: Sequence[Event], coordinates: Sequence[KafkaCoordinates], *, ingested_at: datetime | None = None
) -> pa.Table:
    """Rows of the ``events`` table, one per event, in the given order.

    >>> events_table([event], [KafkaCoordinates("trajlake.events", 0, 41)])  # doctest: +SKIP
    """
    if len(events) != len(coordinates):
        raise ValueError(f"{len(events)} events but {len(coordinates)} coordinates: pass one per event")
    cols: dict[str, list[Any]] = {f.name: [] for f in EVENTS}
    for event, where in zip(events, coordinates):
        _append_envelope(cols, event)
        ids_field, logprobs_field = TOKEN_FIELDS.get(event.type, (None, None))
        excluded = {ids_field, logprobs_field} - {None}
        cols["payload"].append(event.payload.model_dump_json(exclude=excluded or None))
        cols["token_ids"].append(getattr(event.payload, ids_field) if ids_field else None)
        cols["logprobs"].append(getattr(event.payload, logprobs_field) if logprobs_field else None)
        cols["kafka_topic"].append(where.topic)
        cols["kafka_partition"].append(where.partition)
        cols["kafka_offset"].append(where.offset)
    stamp = ingested_at or datetime.now(timezone.utc)
    cols["ingested_at"] = [stamp] * len(events)
    return pa.table({f.name: pa.array(cols[f.name], type=f.type) for f in EVENTS}, schema=EVENTS)


def _append_envelope(cols: dict[str, list[Any]], event: Event) -> None:
    harness = event.harness
    cols["event_id"].append(event.event_id)
    cols["ts"].append(event.ts)
    cols["tenant"].append(event.tenant)
    cols["task_id"].append(event.task_id)
    cols["rollout_id"].append(event.rollout_id)
    cols["attempt"].append(event.attempt)
    cols["seq"].append(event.seq)
    cols["span_id"].append(event.span_id)
    cols["parent_span_id"].append(event.parent_span_id)
    cols["harness_name"].append(harness.name if harness else None)
    cols["harness_version"].append(harness.version if harness else None)
    cols["harness_config_hash"].append(harness.config_hash if harness else None)
    cols["type"].append(event.type)
    cols["schema_version"].append(event.schema_version)


def typed_tables(events: pa.Table) -> dict[str, pa.Table]:
    """Derive the typed tables' rows from ``events`` rows: table name -> rows.

    Only tables that get at least one row appear. Key and Kafka columns are
    copied column-wise; payload fields come from the row's ``payload`` JSON;
    token columns are the events row's ``token_ids`` / ``logprobs``.
    """
    out: dict[str, pa.Table] = {}
    types = events.column("type")
    for event_type in pc.unique(types).to_pylist():
        table_name, schema = TYPED_TABLES[event_type]
        needed = [c for c in events.column_names if c in _SHARED or c == "payload" or
                  (c in ("token_ids", "logprobs") and event_type in TOKEN_FIELDS)]  # copy no token lists in vain
        rows = events.select(needed).filter(pc.equal(types, event_type))
        out[table_name] = _typed_rows(rows, schema)
    return out


def _typed_rows(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    payloads = [from_json(p) for p in rows.column("payload").to_pylist()]
    columns: list[pa.ChunkedArray | pa.Array] = []
    for f in schema:
        if f.name in _SHARED:
            columns.append(rows.column(f.name))
        elif f.name in _TOKEN_COLUMNS:
            source = "logprobs" if f.name == "logprobs" else "token_ids"
            columns.append(rows.column(source).cast(LOGPROBS if source == "logprobs" else TOKENS))
        elif f.name in _COUNT_COLUMNS:
            columns.append(pc.list_value_length(rows.column(_COUNT_COLUMNS[f.name])).cast(pa.int32()))
        else:
            values = pa.array([_payload_value(p, f.name) for p in payloads], type=f.type)
            if f.name == "group_id":  # the GRPO group defaults to the task
                values = pc.coalesce(values, rows.column("task_id").combine_chunks())
            columns.append(values)
    return pa.Table.from_arrays(columns, schema=schema)


def _payload_value(payload: dict[str, Any], name: str) -> Any:
    value = payload.get(name)
    if value is None or name not in JSON_COLUMNS:
        return value
    return to_json(value).decode()  # compact, UTF-8 kept as is


def quarantine_table(rejected: Sequence[Rejected], *, quarantined_at: datetime | None = None) -> pa.Table:
    """Rows of the ``quarantine`` table: raw bytes kept whole, the reason, the coordinates."""
    stamp = quarantined_at or datetime.now(timezone.utc)
    cols = {
        "raw": [r.raw for r in rejected],
        "reason": [r.reason for r in rejected],
        "field": [r.field for r in rejected],
        "event_id": [r.event_id for r in rejected],
        "kafka_key": [r.key for r in rejected],
        "kafka_topic": [r.coordinates.topic for r in rejected],
        "kafka_partition": [r.coordinates.partition for r in rejected],
        "kafka_offset": [r.coordinates.offset for r in rejected],
        "quarantined_at": [stamp] * len(rejected),
    }
    return pa.table({f.name: pa.array(cols[f.name], type=f.type) for f in QUARANTINE}, schema=QUARANTINE)
