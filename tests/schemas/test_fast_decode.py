"""Guard: the msgspec mirror (schemas.fast) and the pydantic contract (schemas.events) stay in sync.

Same fields, required-ness, type families and bounds; the same verdict on
thousands of workload events and on every invalid case of the contract
tests; byte-identical ``events`` rows. The fast path may refuse more than the
contract (lax-only inputs then take the pydantic path), never less.
"""

from __future__ import annotations

import json
import types
import typing
from collections import namedtuple
from datetime import datetime, timezone
from typing import Any, Literal, get_args, get_origin

import annotated_types
import msgspec
import pytest
from pydantic import BaseModel
from test_wire_contract import (
    CASES, FLOAT_FIELDS, FREE_JSON_FIELDS, NON_FINITE, PAYLOADS, event, mutate, with_free_json, with_number,
)

import schemas.versions as versions
from ingest.batch import Batch
from ingest.dedupe import SeenEventIds
from devkit.workload import WorkloadConfig, generate_events
from schemas import events as contract
from schemas import fast
from schemas.errors import InvalidEvent
from schemas.fast_tokens import decode_batch_columnar
from schemas.versions import MAX_EVENT_BYTES, decode_event
from store.event_rows import KafkaCoordinates, events_table, typed_tables

STAMP = datetime(2026, 1, 1, tzinfo=timezone.utc)
Record = namedtuple("Record", "topic partition offset key value")

TS_IS_PARSED_AFTER_DECODING = {"ts": ("datetime", "str")}
"""The one deliberate difference: msgspec takes ``ts`` as text and ``schemas.fast`` parses it as pydantic does."""


# ------------------------------------------------------------------ structure


def unwrap(tp: Any) -> tuple[Any, bool, list]:
    """(bare type, accepts null, constraint metadata) of an annotation of either library."""
    optional, metadata = False, []
    while True:
        if get_origin(tp) is typing.Annotated:
            tp, *meta = get_args(tp)
            metadata += meta
        elif get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            assert len(args) == 1, f"unexpected union {tp}"
            optional, tp = optional or len(args) < len(get_args(tp)), args[0]
        else:
            return tp, optional, metadata


def family(tp: Any) -> tuple[str, bool, tuple]:
    """(type family, accepts null, literal values)."""
    tp, optional, _ = unwrap(tp)
    origin = get_origin(tp)
    if origin is Literal:
        return "literal", optional, tuple(sorted(get_args(tp)))
    if origin in (list, dict):
        return origin.__name__, optional, ()
    if isinstance(tp, type) and issubclass(tp, (BaseModel, msgspec.Struct)):
        return "object", optional, ()
    return ("any" if tp is Any else tp.__name__), optional, ()


BOUNDS = ("ge", "le", "min_length", "max_length")


def bounds_of_pydantic(info) -> dict[str, Any]:
    kinds = (annotated_types.Ge, annotated_types.Le, annotated_types.MinLen, annotated_types.MaxLen)
    return {name: getattr(m, name) for m in info.metadata if isinstance(m, kinds) for name in BOUNDS
            if hasattr(m, name)}


def bounds_of_msgspec(tp: Any) -> dict[str, Any]:
    return {name: getattr(meta, name) for meta in unwrap(tp)[2] for name in BOUNDS
            if getattr(meta, name, None) is not None}


def pydantic_fields(model: type[BaseModel]) -> dict[str, tuple]:
    return {name: (*family(info.annotation), info.is_required(), bounds_of_pydantic(info))
            for name, info in model.model_fields.items()}


def msgspec_fields(struct: type[msgspec.Struct]) -> dict[str, tuple]:
    return {f.name: (*family(f.type), f.required, bounds_of_msgspec(f.type)) for f in msgspec.structs.fields(struct)}


def pydantic_events() -> dict[str, type[BaseModel]]:
    union = get_args(get_args(contract.Event)[0])
    return {get_args(m.model_fields["type"].annotation)[0]: m for m in union}


@pytest.mark.parametrize("event_type", contract.EVENT_TYPES)
def test_every_envelope_field_is_mirrored(event_type):
    model, struct = pydantic_events()[event_type], fast.EVENT_STRUCTS[event_type]
    ours, theirs = pydantic_fields(model), msgspec_fields(struct)
    assert ours.pop("type")[:3] == ("literal", False, (event_type,))
    assert struct.__struct_config__.tag == event_type and struct.type == event_type
    for name, (want, got) in TS_IS_PARSED_AFTER_DECODING.items():
        assert ours.pop(name)[0] == want and theirs.pop(name)[0] == got
    assert ours == theirs


@pytest.mark.parametrize("event_type", contract.EVENT_TYPES)
def test_every_payload_field_is_mirrored(event_type):
    model = contract.PAYLOAD_MODELS[event_type]
    struct = msgspec.structs.fields(fast.EVENT_STRUCTS[event_type])
    payload = next(f.type for f in struct if f.name == "payload")
    assert list(pydantic_fields(model)) == list(msgspec_fields(payload))  # order too: the payload JSON follows it
    assert pydantic_fields(model) == msgspec_fields(payload)


def test_the_harness_is_mirrored():
    assert pydantic_fields(contract.Harness) == msgspec_fields(fast.Harness)


def test_a_field_missing_from_the_mirror_is_noticed():
    class Trimmed(msgspec.Struct, kw_only=True):
        name: str

    assert pydantic_fields(contract.Harness) != msgspec_fields(Trimmed)


# ------------------------------------------------------------------ behaviour


def pydantic_rows(values: list[bytes]) -> Any:
    decoded = [decode_event(v) for v in values]
    return events_table(decoded, coordinates(len(decoded)), ingested_at=STAMP)


def fast_rows(values: list[bytes]) -> Any:
    decoded = fast.decode_batch(values)
    assert None not in decoded
    return events_table(decoded, coordinates(len(decoded)), ingested_at=STAMP)


def coordinates(n: int) -> list[KafkaCoordinates]:
    return [KafkaCoordinates("t", i % 4, i) for i in range(n)]


@pytest.fixture(scope="module")
def workload() -> list[dict]:
    return list(generate_events(WorkloadConfig(tasks=8, rollouts_per_task=6, seed=11)))


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")], ids=["compact", "spaced"])
def test_workload_events_give_byte_identical_rows(workload, separators):
    assert len(workload) > 2000
    values = [json.dumps(e, separators=separators).encode() for e in workload]
    ours, theirs = fast_rows(values), pydantic_rows(values)
    assert ours.equals(theirs)
    assert ours.column("payload").to_pylist() == theirs.column("payload").to_pylist()
    for name, rows in typed_tables(ours).items():
        assert rows.equals(typed_tables(theirs)[name])


def test_events_without_their_defaults_give_the_same_rows(workload):
    """What the gateway and the SDK write (``omit_defaults``) reads back as the full events, on both paths."""
    full = [json.dumps(e).encode() for e in workload]
    short = [json.dumps(contract.omit_defaults(e)).encode() for e in workload]
    assert sum(map(len, short)) < sum(map(len, full))
    expected = pydantic_rows(full)
    assert fast_rows(short).equals(expected) and pydantic_rows(short).equals(expected)
    models = [decode_event(v) for v in full]
    dumped = [m.model_dump_json(exclude_defaults=True).encode() for m in models]
    assert [decode_event(v) for v in dumped] == models
    assert fast_rows(dumped).equals(expected)


def variants() -> list[dict]:
    """Valid events that probe formatting and parsing corners."""
    out = [event(t) for t in contract.EVENT_TYPES]
    edge = {
        "ts": ["2026-01-01t00:00:00.5z", "2026-06-01 12:00:00+05:30", "2026-01-01T00:00:00.1234567Z",
               "2026-01-01T23:59:59-00:00"],
        "payload.value": [1, -0.0, 1e20, 1.2345678901234567e-300, 2**70],
        "payload.latency_ms": [0, 1e16, 123456789012345678.0],
        "payload.params": [{"t": 1e22, "n": 2**80, "s": "é\u2028\x00\x1f\"\\/"}, {}],
        "payload.messages": [[{"role": "user", "content": "ünï\ncode 😀", "k": [None, True, 1.5e-7]}]],
        "payload.prompt_token_ids": [[0, 2**31 - 1], [], None],
        "payload.logprobs": [[-1, 0]],
        "payload.metadata": [{"nested": {"deep": [1, {"x": None}]}}],
        "payload.arguments": ["plain string", 3, None, [1, "a"]],
        "payload.result": [{"out": "x" * 10_000}, False],
        "harness": [None, {"name": "a", "version": "1"}],
        "seq": [0, 2**63 - 1],
        "attempt": [2**31 - 1],
    }
    for path, values in edge.items():
        event_type = next(t for t in contract.EVENT_TYPES if path.split(".")[-1] in (
            PAYLOADS[t] if path.startswith("payload.") else {"ts", "harness", "seq", "attempt"}))
        if path == "payload.latency_ms":
            event_type = "llm.response"
        elif path == "payload.logprobs":
            event_type = "llm.response"
        for value in values:
            raw = event(event_type)
            if path == "payload.logprobs":
                raw["payload"]["response_token_ids"] = [4, 5]
            mutate(path, value)(raw)
            out.append(raw)
    unknown = event("llm.response", future_field={"x": 1})
    unknown["payload"]["engine_kv_cache_hit"] = 0.5
    return out + [unknown]


@pytest.mark.parametrize("raw", variants(), ids=lambda r: r["type"])
def test_valid_corner_cases_read_the_same(raw):
    value = json.dumps(raw, ensure_ascii=False).encode()
    decode_event(value)  # the contract accepts it
    [decoded] = fast.decode_batch([value])
    assert decoded is not None, "the fast path should accept this valid, current event"
    assert fast_rows([value]).equals(pydantic_rows([value]))


def test_duplicate_keys_read_the_same():
    value = json.dumps(event("reward")).encode().replace(b'"seq": 7', b'"seq": 1, "seq": 7')
    assert b'"seq": 1, "seq": 7' in value
    assert fast_rows([value]).equals(pydantic_rows([value]))


def invalid_events() -> list[bytes]:
    out = []
    for event_type, path, value, _ in CASES:
        raw = event(event_type)
        mutate(path, value)(raw)
        out.append(json.dumps(raw).encode())
    mismatched = event("llm.response")
    mismatched["payload"]["logprobs"] = [-0.1]
    engine = event("llm.response")
    engine["payload"].update(response_token_ids=None, logprobs=None)
    big = event("tool.result")
    big["payload"]["result"] = "x" * MAX_EVENT_BYTES
    out += [json.dumps(mismatched).encode(), json.dumps(engine).encode(), json.dumps(big).encode()]
    out += [with_number(event_type, text, template, literal)
            for event_type, text, template, _ in FLOAT_FIELDS for literal in NON_FINITE]
    out += [with_free_json(event_type, name, template, literal)
            for event_type, name, template, _ in FREE_JSON_FIELDS for literal in (b"NaN", b"-Infinity")]
    out += [b"[1, 2]", b'"reward"', b"42", b"null", b'{"type": "reward",', b"", b"\xff\xfe{}"]
    out += [json.dumps(event("reward", harness={"name": "x" * 201, "version": "1"})).encode(),
            json.dumps(event("reward", task_id="t" * 501)).encode(),
            json.dumps(event("reward", ts="2026-01-01T25:00:00Z")).encode(),
            json.dumps(event("reward", ts="2026-01-01T00:00:00.Z")).encode()]
    # invalid UTF-8 where msgspec reads nothing (an unknown field): the contract refuses the whole text (review3)
    out += [json.dumps(event("reward", extra="\u00e9")).encode().replace(b"\\u00e9", b"\xff")]
    out += [json.dumps(event("reward", payload={"name": "n", "value": 1.0, "extra": "\u00e9"})).encode()
            .replace(b"\\u00e9", b"\xc3")]
    return out


@pytest.mark.parametrize("value", invalid_events(), ids=lambda v: v[:40].decode(errors="replace"))
def test_every_invalid_event_is_refused_by_both(value):
    with pytest.raises(InvalidEvent):
        decode_event(value)
    assert fast.decode_batch([value]) == [None]
    assert decode_batch_columnar([value]).events == [None]


def float_fields(model: type[BaseModel]) -> set[str]:
    """Fields of a payload model holding floats (a float, or a list of them)."""
    out = set()
    for name, info in model.model_fields.items():
        tp, _, _ = unwrap(info.annotation)
        if get_origin(tp) is list:
            tp = unwrap(get_args(tp)[0])[0]
        if tp is float:
            out.add(name)
    return out


def test_every_float_field_of_the_contract_is_tested_for_non_finite_numbers():
    """A float field added to the contract must join FLOAT_FIELDS, so both paths are shown to refuse NaN/Infinity."""
    contract_floats = {f"payload.{name}" for t, model in contract.PAYLOAD_MODELS.items() for name in float_fields(model)}
    tested = {field.rsplit(".", 1)[0] if field[-1].isdigit() else field for *_, field in FLOAT_FIELDS}
    assert contract_floats == tested


def test_every_free_form_field_of_the_contract_is_tested_for_non_finite_numbers():
    """A field taking any JSON (``Any`` inside) must join FREE_JSON_FIELDS: its NaN/Infinity are refused, not stored."""
    def free(annotation: Any) -> bool:
        return annotation is Any or any(free(a) for a in get_args(annotation))

    contract_free = {(t, name) for t, model in contract.PAYLOAD_MODELS.items()
                     for name, info in model.model_fields.items() if free(info.annotation)}
    assert contract_free == {(t, name) for t, name, *_ in FREE_JSON_FIELDS}


@pytest.mark.parametrize("change", [
    {"payload.state_changed": 1}, {"payload.state_changed": "true"}, {"payload.value": True},
    {"schema_version": 1.0},
], ids=str)
def test_lax_only_inputs_leave_the_fast_path_and_keep_the_contracts_verdict(change):
    event_type = "tool.result" if "payload.state_changed" in change else "reward"
    raw = event(event_type)
    for path, value in change.items():
        mutate(path, value)(raw)
    value = json.dumps(raw).encode()
    assert fast.decode_batch([value]) == [None]
    assert batch_outcome([value]) == contract_outcome([value])


def test_another_schema_version_takes_the_upgrade_chain(monkeypatch):
    monkeypatch.setattr(versions, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(versions.UPGRADES, 1, lambda raw: raw)
    value = json.dumps(event("reward")).encode()
    assert fast.decode_batch([value]) == [None]
    assert decode_event(value).schema_version == 2


def batch_outcome(values: list[bytes]) -> tuple[list[dict], list[tuple[str, str]]]:
    """What the ingester's batch decode makes of these values: events rows and quarantine reasons."""
    batch = Batch()
    batch.add(Record("t", 0, i, b"k", v) for i, v in enumerate(values))
    decoded = batch.decode(SeenEventIds(), max_event_bytes=MAX_EVENT_BYTES)
    rows = decoded.events.drop_columns(["ingested_at"]).to_pylist()
    return rows, [(r.field, r.reason) for r in decoded.rejected]


def contract_outcome(values: list[bytes]) -> tuple[list[dict], list[tuple[str, str]]]:
    """The same, decided by the pydantic contract alone."""
    good, where, reasons = [], [], []
    for i, v in enumerate(values):
        try:
            good.append(decode_event(v))
            where.append(KafkaCoordinates("t", 0, i))
        except InvalidEvent as exc:
            reasons.append((exc.field, str(exc)))
    return events_table(good, where).drop_columns(["ingested_at"]).to_pylist(), reasons


def test_a_mixed_batch_gives_the_contracts_rows_and_quarantine_reasons(workload):
    lax = event("tool.result")
    lax["payload"]["state_changed"] = 1
    unique = list({e["event_id"]: e for e in workload[:200]}.values())  # the workload replays some (dedupe's job)
    values = [json.dumps(e).encode() for e in unique] + invalid_events() + [json.dumps(lax).encode()]
    values = values[::2] + values[1::2]  # interleave valid and invalid
    rows, reasons = batch_outcome(values)
    assert (rows, reasons) == contract_outcome(values)
    assert len(reasons) == len(invalid_events())



def unreadable_events() -> list[bytes]:
    """Input the fast path must refuse without raising (the contract then decides, or the batch quarantines)."""
    base = json.dumps(event("tool.call")).encode()
    deep = json.dumps(event("tool.call", payload={"call_id": "c", "name": "n", "arguments": "X"}))
    return [
        b"\xef\xbb\xbf" + base, base + b" x", base.replace(b'"search"', b'"se\xff"'),
        base.replace(b'"search"', b'"\xc0\xaf"'), base.replace(b'"search"', b'"\\ud800"'),
        deep.replace('"X"', "[" * 5000 + "]" * 5000).encode(),
        json.dumps(event("reward", ts="0001-01-01T00:00:00+01:00")).encode(),
        json.dumps(event("reward", ts="9999-12-31T23:59:59-01:00")).encode(),
    ]


@pytest.mark.parametrize("value", unreadable_events(), ids=lambda v: v[:30].decode(errors="replace"))
def test_unreadable_input_is_refused_not_raised(value):
    assert fast.decode_batch([value]) == [None]
