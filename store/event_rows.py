"""Events -> rows of the ``events`` table -> rows of the typed tables.

One code path: the ingester turns each valid ``Event`` into an ``events`` row
(``events_table``), and the typed tables are derived from those rows
(``typed_tables``), the same function ``trajlake rebuild`` uses, so ingest and
rebuild can never disagree. The events row keeps the payload as JSON *without*
its token arrays; the arrays live in the ``token_ids`` / ``logprobs`` columns
(list<int32> / list<float32>), so the log is token-exact and compact.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic_core import to_json

from schemas.events import Event
from schemas.fast import FastEvent
from schemas.tables import EVENTS, KAFKA_FIELDS, KEY_FIELDS, LOGPROBS, QUARANTINE, TOKENS, TYPED_TABLES

TOKEN_FIELDS: dict[str, tuple[str, str | None]] = {
    "llm.request": ("prompt_token_ids", None),
    "llm.response": ("response_token_ids", "logprobs"),
}
"""Event type -> (payload field moved to ``token_ids``, field moved to ``logprobs``)."""

JSON_COLUMNS = frozenset({"messages", "tools", "params", "tool_calls", "usage", "arguments", "result", "metadata"})
"""Free-form payload values, stored as JSON text (NULL when absent or null)."""

_NO_TOKENS: tuple[None, None] = (None, None)
_ENVELOPE_COLUMNS = ("event_id", "ts", "tenant", "task_id", "rollout_id", "attempt", "seq", "span_id",
                     "parent_span_id", "type", "schema_version")
_JSON_NULL = msgspec.Raw(b"null")
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
    events: Sequence[Event | FastEvent], coordinates: Sequence[KafkaCoordinates], *, ingested_at: datetime | None = None,
    tokens: tuple[pa.Array, pa.Array] | None = None, ts: pa.Array | None = None,
) -> pa.Table:
    """Rows of the ``events`` table, one per event, in the given order.

    Takes pydantic ``Event``s and the ingester's msgspec ``FastEvent``s alike
    (same attribute names; their rows are byte-identical, which
    ``tests/schemas/test_fast_decode.py`` checks). Built column by column.
    ``tokens``: the ``token_ids`` and ``logprobs`` columns already built
    (``schemas.fast_tokens``); the events' own token fields are then not read. ``ts``: the ``ts`` column
    already built (``ColumnarBatch.timestamps``), likewise.

    >>> events_table([event], [KafkaCoordinates("trajlake.events", 0, 41)])  # doctest: +SKIP
    """
    if len(events) != len(coordinates):
        raise ValueError(f"{len(events)} events but {len(coordinates)} coordinates: pass one per event")
    harness = [e.harness for e in events]
    token_fields = [TOKEN_FIELDS.get(e.type, _NO_TOKENS) for e in events]
    stamp = ingested_at or datetime.now(timezone.utc)
    cols: dict[str, list[Any]] = {
        **{name: [getattr(e, name) for e in events] for name in _ENVELOPE_COLUMNS if name != "ts" or ts is None},
        **({"ts": ts} if ts is not None else {}),
        "harness_name": [h.name if h else None for h in harness],
        "harness_version": [h.version if h else None for h in harness],
        "harness_config_hash": [h.config_hash if h else None for h in harness],
        "payload": [_payload_json(e.payload, fields) for e, fields in zip(events, token_fields)],
        "token_ids": tokens[0] if tokens else [getattr(e.payload, ids) if ids else None
                                               for e, (ids, _) in zip(events, token_fields)],
        "logprobs": tokens[1] if tokens else [getattr(e.payload, lps) if lps else None
                                              for e, (_, lps) in zip(events, token_fields)],
        "kafka_topic": [c.topic for c in coordinates],
        "kafka_partition": [c.partition for c in coordinates],
        "kafka_offset": [c.offset for c in coordinates],
        "ingested_at": [stamp] * len(events),
    }
    return pa.table({f.name: _array(cols[f.name], f.type) for f in EVENTS}, schema=EVENTS)


def _array(values: list[Any] | pa.Array, type_: pa.DataType) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type=type_)


def _payload_json(payload: Any, token_fields: tuple[str | None, str | None]) -> str:
    """The payload as compact JSON without its token arrays (pydantic's serialiser either way)."""
    excluded = [f for f in token_fields if f]
    if isinstance(payload, msgspec.Struct):
        fields = msgspec.structs.asdict(payload)
        for name in excluded:
            del fields[name]
        return to_json(fields).decode()
    return payload.model_dump_json(exclude=set(excluded) or None)


def typed_tables(events: pa.Table) -> dict[str, pa.Table]:
    """Derive the typed tables' rows from ``events`` rows: table name -> rows.

    Only tables that get at least one row appear. Key and Kafka columns are
    copied column-wise; payload fields come from the row's ``payload`` JSON
    (read in one msgspec pass per type, free-form values kept as their JSON text);
    token columns are the events row's ``token_ids`` / ``logprobs``.
    """
    out: dict[str, pa.Table] = {}
    types = events.column("type")
    for event_type in pc.unique(types).to_pylist():
        table_name, schema = TYPED_TABLES[event_type]
        needed = [c for c in events.column_names if c in _SHARED or c == "payload" or
                  (c in ("token_ids", "logprobs") and event_type in TOKEN_FIELDS)]  # copy no token lists in vain
        rows = _rows_where(events.select(needed), pc.equal(types, event_type))
        out[table_name] = _typed_rows(rows, schema)
    return out


def _rows_where(rows: pa.Table, mask: pa.ChunkedArray) -> pa.Table:
    """``rows.filter(mask)``, with list columns (token arrays) filtered by ``_lists_where``; ``rows`` themselves
    when every row is kept (a batch of one event type: no copy)."""
    keep = mask.to_numpy(zero_copy_only=False)
    if keep.all():
        return rows
    columns = [_lists_where(c, keep) if pa.types.is_list(c.type) else c.filter(mask) for c in rows.columns]
    return pa.Table.from_arrays(columns, schema=rows.schema)


def _lists_where(column: pa.ChunkedArray, keep: np.ndarray) -> pa.ChunkedArray:
    """The lists of ``column`` where ``keep`` is true, values copied by one NumPy mask per chunk.

    Arrow's filter of a list column gathers the values through an 8-byte index per value (a 490-id token list:
    ~4 KB of fresh index memory); under the ingester's allocator settings (``ingest.allocators``: every buffer over
    128 KiB gets fresh pages) that was ~4 us of typed rows' ~11 per full_prompt event, against ~1.4 for a mask of one
    byte per value.
    """
    chunks, start = [], 0
    for chunk in column.chunks:
        chunks.append(_list_array_where(chunk, keep[start:start + len(chunk)]))
        start += len(chunk)
    return pa.chunked_array(chunks, type=column.type)


def _list_array_where(lists: pa.ListArray, keep: np.ndarray) -> pa.ListArray:
    offsets = lists.offsets.to_numpy()
    lengths = np.diff(offsets)
    values = lists.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    kept = np.zeros(int(keep.sum()) + 1, dtype=np.int32)
    np.cumsum(lengths[keep], out=kept[1:])
    nulls = pa.array(lists.is_null().to_numpy(zero_copy_only=False)[keep]) if lists.null_count else None
    return pa.ListArray.from_arrays(pa.array(kept), pa.array(values[np.repeat(keep, lengths)]), type=lists.type,
                                    mask=nulls)


def _typed_rows(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    payloads = _payload_decoder(schema).decode("[" + ",".join(rows.column("payload").to_pylist()) + "]")
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
            values = pa.array(_payload_values(payloads, f.name), type=f.type)
            if f.name == "group_id":  # the GRPO group defaults to the task
                values = pc.coalesce(values, rows.column("task_id").combine_chunks())
            columns.append(values)
    if "extends_tokens" in schema.names:  # n_prompt_tokens counts the FULL prompt: shared prefix + new ids
        n, shared = schema.get_field_index("n_prompt_tokens"), columns[schema.get_field_index("extends_tokens")]
        columns[n] = pc.add(columns[n], pc.coalesce(shared, 0)).cast(pa.int32())
    return pa.Table.from_arrays(columns, schema=schema)


@functools.cache
def _payload_decoder(schema: pa.Schema) -> msgspec.json.Decoder:
    """Reads a list of payload JSONs into Structs holding just this table's payload columns.

    Free-form values stay ``msgspec.Raw``: the payload JSON was written by
    pydantic's compact serialiser, so the raw slice is exactly what
    re-serialising the parsed value would give, without parsing it.
    """
    names = [f.name for f in schema if f.name not in _SHARED | _TOKEN_COLUMNS | _COUNT_COLUMNS.keys()]
    columns = msgspec.defstruct(
        "PayloadColumns", [(n, msgspec.Raw if n in JSON_COLUMNS else Any, None) for n in names], gc=False,
    )
    return msgspec.json.Decoder(list[columns])


def _payload_values(payloads: list[Any], name: str) -> list[Any]:
    values = [getattr(p, name) for p in payloads]
    if name not in JSON_COLUMNS:
        return values
    return [None if v is None or v == _JSON_NULL else bytes(v).decode() for v in values]  # NULL, not "null"


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
