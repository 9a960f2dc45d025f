"""The wire contract refuses bad events with an error that names the field and the problem."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pytest

from schemas.errors import InvalidEvent
from schemas.events import EVENT_ADAPTER, EVENT_TYPES, LlmResponseEvent, RewardEvent
from schemas.fast import decode_batch
from schemas.versions import MAX_EVENT_BYTES, decode_event, validate_event

ENVELOPE = {
    "event_id": "e-1", "schema_version": 1, "ts": "2026-01-01T00:00:00Z", "tenant": "acme",
    "task_id": "t-1", "rollout_id": "r-1", "attempt": 0, "seq": 7, "span_id": "s-1", "parent_span_id": None,
    "harness": {"name": "agent", "version": "1.0", "config_hash": "sha256:ab"},
}
PAYLOADS = {
    "rollout.started": {"group_id": "g", "policy_version": "p-1", "metadata": {"k": 1}},
    "rollout.finished": {"status": "succeeded", "reason": None, "steps": 3},
    "llm.request": {"call_id": "c-1", "model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "params": {"temperature": 1.0}, "prompt_token_ids": [1, 2, 3], "tokenizer": "tok",
                    "chat_template_hash": "h", "idempotency_key": "k"},
    "llm.response": {"call_id": "c-1", "text": "ok", "response_token_ids": [4, 5], "logprobs": [-0.1, -2.0],
                     "token_source": "engine", "latency_ms": 12.5, "upstream_retries": 1},
    "tool.call": {"call_id": "tc-1", "name": "search", "arguments": {"q": "x"}},
    "tool.result": {"call_id": "tc-1", "name": "search", "result": [1, 2], "duration_ms": 3.0,
                    "state_changed": True},
    "reward": {"name": "correctness", "value": 0.5, "source": "verifier"},
}


def event(event_type: str = "reward", **changes) -> dict:
    raw = {**copy.deepcopy(ENVELOPE), "type": event_type, "payload": copy.deepcopy(PAYLOADS[event_type])}
    raw.update(changes)
    return raw


def refused(raw: dict | bytes) -> InvalidEvent:
    data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    with pytest.raises(InvalidEvent) as exc:
        decode_event(data)
    assert str(exc.value).startswith(f"{exc.value.field}: ")
    return exc.value


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_every_event_type_round_trips(event_type):
    raw = event(event_type)
    decoded = decode_event(json.dumps(raw).encode())
    assert decoded.type == event_type
    again = json.loads(json.dumps(decoded.model_dump(mode="json")))
    assert decode_event(json.dumps(again)) == decoded
    for field, value in raw["payload"].items():
        assert again["payload"][field] == value


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_valid_events_pass_the_strict_json_path_too(event_type):
    # The ingester's fast path: pydantic strict JSON validation, no json.loads.
    data = json.dumps(event(event_type, ts="2026-01-01t00:00:00.5z"))
    assert EVENT_ADAPTER.validate_json(data, strict=True) == decode_event(data)


def test_the_fast_path_and_the_full_path_agree(monkeypatch):
    raws = [event(t) for t in EVENT_TYPES] + [event(ts="2026-06-01T12:00:00+05:00", attempt=3)]
    full = [validate_event(raw) for raw in raws]  # json.loads + lax validation, no fast path
    served = []
    real = EVENT_ADAPTER.validate_json

    def spy(*args, **kwargs):
        served.append(real(*args, **kwargs))
        return served[-1]

    monkeypatch.setattr(EVENT_ADAPTER, "validate_json", spy)
    assert [decode_event(json.dumps(raw)) for raw in raws] == full
    assert served == full  # every one was answered by the fast path


def test_timestamps_are_normalised_to_utc_and_optional_fields_defaulted():
    raw = event(ts="2026-01-01T02:30:00.250+02:30")
    for optional in ("tenant", "attempt", "span_id", "parent_span_id", "harness"):
        raw.pop(optional)
    decoded = decode_event(json.dumps(raw))
    assert decoded.ts.isoformat() == "2026-01-01T00:00:00.250000+00:00"
    assert (decoded.tenant, decoded.attempt, decoded.harness) == ("default", 0, None)


def test_unknown_fields_are_ignored_so_optional_additions_need_no_version_bump():
    raw = event("llm.response", future_field={"x": 1})
    raw["payload"]["engine_kv_cache_hit"] = 0.5
    assert isinstance(decode_event(json.dumps(raw)), LlmResponseEvent)


def mutate(path: str, value) -> Callable[[dict], None]:
    """Set (or with value=KeyError, delete) a dotted path."""
    *parents, last = path.split(".")

    def apply(raw: dict) -> None:
        target = raw
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value

    return apply


CASES = [
    # wrong types
    ("reward", "seq", "3", "seq"),
    ("reward", "seq", 1.5, "seq"),
    ("reward", "attempt", True, "attempt"),
    ("reward", "attempt", -1, "attempt"),
    ("reward", "attempt", 2**31, "attempt"),
    ("reward", "seq", 2**63, "seq"),
    ("rollout.finished", "payload.steps", 2**31, "payload.steps"),
    ("llm.response", "payload.upstream_retries", 2**31, "payload.upstream_retries"),
    ("reward", "event_id", 12, "event_id"),
    ("reward", "tenant", "", "tenant"),
    ("reward", "harness", "agent-1.0", "harness"),
    ("reward", "harness.version", None, "harness.version"),
    ("reward", "payload", "value=1", "payload"),
    ("reward", "payload.value", "0.5", "payload.value"),
    ("reward", "payload.value", True, "payload.value"),
    ("llm.request", "payload.prompt_token_ids", "1 2 3", "payload.prompt_token_ids"),
    ("llm.request", "payload.prompt_token_ids", ["1", "2"], "payload.prompt_token_ids.0"),
    ("llm.request", "payload.prompt_token_ids", [1, 2.5], "payload.prompt_token_ids.1"),
    ("llm.request", "payload.prompt_token_ids", [1, True], "payload.prompt_token_ids.1"),
    ("llm.request", "payload.prompt_token_ids", [1, -2], "payload.prompt_token_ids"),
    ("llm.request", "payload.prompt_token_ids", [2**31], "payload.prompt_token_ids"),
    ("llm.request", "payload.messages", {"role": "user"}, "payload.messages"),
    ("llm.response", "payload.response_token_ids", ["4", "5"], "payload.response_token_ids.0"),
    ("llm.response", "payload.logprobs", ["-0.1", "-2.0"], "payload.logprobs.0"),
    ("llm.response", "payload.token_source", "vllm", "payload.token_source"),
    ("llm.response", "payload.upstream_retries", "1", "payload.upstream_retries"),
    ("llm.response", "payload.latency_ms", -1, "payload.latency_ms"),
    ("rollout.finished", "payload.status", "done", "payload.status"),
    ("rollout.finished", "payload.steps", "3", "payload.steps"),
    ("rollout.started", "payload.metadata", [1, 2], "payload.metadata"),
    ("tool.result", "payload.state_changed", "maybe", "payload.state_changed"),
    ("tool.result", "payload.duration_ms", "3 ms", "payload.duration_ms"),
    # missing fields
    ("reward", "event_id", KeyError, "event_id"),
    ("reward", "ts", KeyError, "ts"),
    ("reward", "task_id", KeyError, "task_id"),
    ("reward", "rollout_id", KeyError, "rollout_id"),
    ("reward", "seq", KeyError, "seq"),
    ("reward", "payload", KeyError, "payload"),
    ("reward", "payload.name", KeyError, "payload.name"),
    ("reward", "payload.value", KeyError, "payload.value"),
    ("llm.request", "payload.call_id", KeyError, "payload.call_id"),
    ("tool.call", "payload.name", KeyError, "payload.name"),
    ("rollout.finished", "payload.status", KeyError, "payload.status"),
    # type and version
    ("reward", "type", "reward.v2", "type"),
    ("reward", "type", KeyError, "type"),
    ("reward", "type", ["reward"], "type"),
    ("reward", "schema_version", 2, "schema_version"),
    ("reward", "schema_version", 0, "schema_version"),
    ("reward", "schema_version", -1, "schema_version"),
    ("reward", "schema_version", "1", "schema_version"),
    ("reward", "schema_version", 1.0, "schema_version"),
    ("reward", "schema_version", True, "schema_version"),
    ("reward", "schema_version", None, "schema_version"),
    ("reward", "schema_version", KeyError, "schema_version"),
    # timestamps
    ("reward", "ts", "2026-01-01T00:00:00", "ts"),
    ("reward", "ts", "2026-01-01", "ts"),
    ("reward", "ts", 1767225600, "ts"),
    ("reward", "ts", "1767225600", "ts"),
    ("reward", "ts", "yesterday", "ts"),
    ("reward", "ts", "2026-13-01T00:00:00Z", "ts"),
]


@pytest.mark.parametrize(("event_type", "path", "value", "field"), CASES,
                         ids=[f"{c[0]}:{c[1]}={c[2]!r}"[:60] for c in CASES])
def test_invalid_field_is_named(event_type, path, value, field):
    raw = event(event_type)
    mutate(path, value)(raw)
    error = refused(raw)
    assert error.field == field
    assert error.problem


def test_schema_version_errors_say_what_to_do():
    assert "upgrade trajlake" in refused(event(schema_version=2)).problem
    assert "never a valid version" in refused(event(schema_version=0)).problem
    assert "must be an integer" in refused(event(schema_version=True)).problem


def test_logprobs_must_match_the_response_tokens():
    raw = event("llm.response")
    raw["payload"]["logprobs"] = [-0.1]
    error = refused(raw)
    assert error.field == "payload"
    assert "logprobs has 1 entries but response_token_ids has 2" in error.problem


def test_engine_tokens_need_token_ids():
    raw = event("llm.response")
    raw["payload"].update(response_token_ids=None, logprobs=None)
    assert "needs response_token_ids" in refused(raw).problem
    raw["payload"]["token_source"] = "none"
    assert decode_event(json.dumps(raw)).payload.response_token_ids is None


NON_FINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400")
FLOAT_FIELDS = [  # (event type, the field's text in the event's JSON, the field the error names)
    ("reward", b'"value": 0.5', b'"value": %s', "payload.value"),
    ("llm.response", b'"logprobs": [-0.1, -2.0]', b'"logprobs": [-0.1, %s]', "payload.logprobs.1"),
    ("llm.response", b'"latency_ms": 12.5', b'"latency_ms": %s', "payload.latency_ms"),
    ("tool.result", b'"duration_ms": 3.0', b'"duration_ms": %s', "payload.duration_ms"),
]


def with_number(event_type: str, text: bytes, template: bytes, literal: bytes) -> bytes:
    data = json.dumps(event(event_type)).encode()
    assert text in data
    return data.replace(text, template % literal)


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize(("event_type", "text", "template", "field"), FLOAT_FIELDS, ids=[f[3] for f in FLOAT_FIELDS])
def test_non_finite_numbers_are_refused_naming_the_field(event_type, text, template, field, literal):
    error = refused(with_number(event_type, text, template, literal))
    assert (error.field, error.problem) == (field, "Input should be a finite number")


FREE_JSON_FIELDS = [  # (event type, a free-form value holding the literal as %s, the field the error names)
    ("rollout.started", "metadata", b'{"k": [1, %s]}', "payload.metadata.k.1"),
    ("llm.request", "messages", b'[{"role": "user", "content": "hi", "x": %s}]', "payload.messages.0.x"),
    ("llm.request", "tools", b'[{"type": "function", "weight": %s}]', "payload.tools.0.weight"),
    ("llm.request", "params", b'{"temperature": %s}', "payload.params.temperature"),
    ("llm.response", "tool_calls", b'[{"id": "a", "arguments": {"x": %s}}]', "payload.tool_calls.0.arguments.x"),
    ("llm.response", "usage", b'{"cost": %s}', "payload.usage.cost"),
    ("tool.call", "arguments", b'{"q": {"n": %s}}', "payload.arguments.q.n"),
    ("tool.result", "result", b'%s', "payload.result"),
]
NOT_JSON = "NaN and Infinity are not JSON: send a finite number (or null)"


def with_free_json(event_type: str, name: str, template: bytes, literal: bytes) -> bytes:
    raw = event(event_type)
    raw["payload"][name] = "@VALUE@"
    return json.dumps(raw).encode().replace(b'"@VALUE@"', template % literal)


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize(("event_type", "name", "template", "field"), FREE_JSON_FIELDS,
                         ids=[f[3] for f in FREE_JSON_FIELDS])
def test_non_finite_numbers_inside_free_form_values_are_refused_naming_the_place(
        event_type, name, template, field, literal):
    data = with_free_json(event_type, name, template, literal)
    error = refused(data)  # the pydantic fast path (validate_json) and the full path alike
    assert (error.field, error.problem) == (field, NOT_JSON)
    with pytest.raises(InvalidEvent) as exc:  # dicts built in Python (gateway batches, OTLP spans)
        validate_event(json.loads(data))
    assert (exc.value.field, exc.value.problem) == (field, NOT_JSON)
    assert decode_batch([data]) == [None]  # msgspec refuses; the contract above decides


@pytest.mark.parametrize(("data", "problem"), [
    (b"[1, 2]", "must be a JSON object, got list"),
    (b'"reward"', "must be a JSON object, got str"),
    (b"42", "must be a JSON object, got int"),
    (b"null", "must be a JSON object, got NoneType"),
    (b'{"type": "reward",', "not valid JSON"),
    (b"", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_non_objects_and_malformed_json_are_refused(data, problem):
    error = refused(data)
    assert error.field == "(event)" and problem in error.problem


def test_oversized_events_are_refused_before_parsing():
    big = event("tool.result")
    big["payload"]["result"] = "x" * MAX_EVENT_BYTES
    error = refused(big)
    assert error.field == "(event)" and f"exceeds the {MAX_EVENT_BYTES}-byte limit" in error.problem
    assert decode_event(json.dumps(event()).encode(), max_bytes=400)
    with pytest.raises(InvalidEvent, match="exceeds the 100-byte limit"):
        decode_event(json.dumps(event()).encode(), max_bytes=100)


def test_several_problems_are_counted_after_the_first():
    raw = event()
    del raw["task_id"]
    raw["seq"] = "x"
    raw["payload"]["value"] = "y"
    error = refused(raw)
    assert error.field == "task_id"
    assert "(and 2 more: seq:" in error.problem and "payload.value:" in error.problem


def test_validate_event_refuses_non_dicts_and_leaves_the_input_alone():
    with pytest.raises(InvalidEvent, match="must be a JSON object, got list"):
        validate_event([("type", "reward")])
    raw = event()
    before = copy.deepcopy(raw)
    assert isinstance(validate_event(raw), RewardEvent)
    assert raw == before


def test_deeply_nested_json_is_an_invalid_event_not_a_crash():
    with pytest.raises(InvalidEvent, match="nested too deeply"):
        decode_event("[" * 100_000)


def test_a_timestamp_that_overflows_in_utc_is_an_invalid_event():
    assert refused(json.dumps(event(ts="0001-01-01T00:00:00+01:00")).encode()).field == "ts"


def nested_event(depth: int) -> bytes:
    """A tool.call nested ``depth`` levels deep in all (the event itself is level 1)."""
    inner = depth - 2  # the event and its payload
    marker = '"arguments": {"q": "x"}'
    data = json.dumps(event("tool.call"))
    assert marker in data
    return data.replace(marker, '"arguments": ' + "[" * inner + "]" * inner).encode()


def test_the_documented_nesting_limits_hold():
    """EVENTS.md: 500 levels are read (fast path too), 1,000 are refused naming the problem."""
    assert decode_event(nested_event(500)).payload.arguments is not None
    assert decode_batch([nested_event(500)])[0] is not None
    for depth in (1_000, 100_000):
        error = refused(nested_event(depth))
        assert (error.field, error.problem) == ("(event)", "JSON nested too deeply")
