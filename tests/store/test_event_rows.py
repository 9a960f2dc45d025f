import json

import pyarrow as pa
import pytest

from schemas.tables import EVENTS, QUARANTINE, TYPED_TABLES
from schemas.versions import validate_event
from store.event_rows import KafkaCoordinates, Rejected, events_table, quarantine_table, typed_tables

PAYLOADS = {
    "rollout.started": {"metadata": {"k": [1, 2]}},
    "rollout.finished": {"status": "failed", "reason": "timeout", "steps": 3},
    "llm.request": {"call_id": "c1", "messages": [{"role": "user", "content": "héllo", "name": None}],
                    "prompt_token_ids": [0, 7, 2**31 - 1], "params": {"temperature": 0.5}},
    "llm.response": {"call_id": "c1", "text": "ok", "response_token_ids": [5, 6],
                     "logprobs": [-0.25, -1.5], "token_source": "engine", "latency_ms": 12.5},
    "tool.call": {"call_id": "t1", "name": "bash", "arguments": "ls -l"},
    "tool.result": {"call_id": "t1", "name": "bash", "result": {"out": "x"}, "state_changed": True},
    "reward": {"name": "pass", "value": 0.75, "source": "judge"},
}


def event(event_type: str, seq: int = 0, **payload):
    return validate_event({
        "event_id": f"e-{event_type}-{seq}", "type": event_type, "schema_version": 1, "ts": "2026-01-01T01:00:00+01:00",
        "task_id": "task", "rollout_id": "r", "seq": seq, "payload": {**PAYLOADS[event_type], **payload},
    })


def rows(*events):
    return events_table(list(events), [KafkaCoordinates("t", 2, 10 + i) for i in range(len(events))])


def test_events_rows_keep_tokens_in_columns_not_in_payload():
    table = rows(event("llm.request"), event("llm.response", 1))
    assert table.schema == EVENTS
    req, resp = table.to_pylist()
    assert req["token_ids"] == [0, 7, 2**31 - 1] and req["logprobs"] is None
    assert "prompt_token_ids" not in json.loads(req["payload"])
    assert resp["token_ids"] == [5, 6] and resp["logprobs"] == [-0.25, -1.5]
    assert {"response_token_ids", "logprobs"}.isdisjoint(json.loads(resp["payload"]))
    assert (req["kafka_topic"], req["kafka_partition"], req["kafka_offset"]) == ("t", 2, 10)
    assert req["ts"].isoformat() == "2026-01-01T00:00:00+00:00"


def test_every_type_derives_its_typed_row():
    table = rows(*(event(t, i) for i, t in enumerate(PAYLOADS)))
    derived = typed_tables(table)
    assert set(derived) == {name for name, _ in TYPED_TABLES.values()}
    for event_type, (name, schema) in TYPED_TABLES.items():
        assert derived[name].schema == schema
        assert derived[name].num_rows == 1, event_type
    req = derived["llm_requests"].to_pylist()[0]
    assert req["prompt_token_ids"] == [0, 7, 2**31 - 1] and req["n_prompt_tokens"] == 3
    assert json.loads(req["messages"]) == [{"role": "user", "content": "héllo", "name": None}]
    resp = derived["llm_responses"].to_pylist()[0]
    assert resp["response_token_ids"] == [5, 6] and resp["n_response_tokens"] == 2
    assert resp["logprobs"] == [-0.25, -1.5] and resp["latency_ms"] == 12.5
    assert json.loads(derived["tool_calls"].to_pylist()[0]["arguments"]) == "ls -l"
    assert derived["tool_results"].to_pylist()[0]["state_changed"] is True
    assert derived["rewards"].to_pylist()[0]["value"] == 0.75
    assert derived["rollout_ends"].to_pylist()[0]["steps"] == 3


def test_group_id_defaults_to_task_id():
    derived = typed_tables(rows(event("rollout.started", 0), event("rollout.started", 1, group_id="g")))
    assert derived["rollout_starts"].column("group_id").to_pylist() == ["task", "g"]


def test_absent_free_form_values_are_null_not_json_null():
    derived = typed_tables(rows(event("llm.request", prompt_token_ids=None, messages=None)))
    req = derived["llm_requests"].to_pylist()[0]
    assert req["messages"] is None and req["prompt_token_ids"] is None and req["n_prompt_tokens"] is None


def test_no_events_no_typed_rows():
    assert typed_tables(EVENTS.empty_table()) == {}


def test_mismatched_coordinates_refused():
    with pytest.raises(ValueError, match="one per event"):
        events_table([event("reward")], [])


def test_quarantine_rows_keep_raw_bytes_whole():
    raw = b"\xff" * 10_000
    table = quarantine_table([Rejected(raw, "(event)", "not valid JSON", b"k", KafkaCoordinates("t", 1, 3))])
    assert table.schema == QUARANTINE
    row = table.to_pylist()[0]
    assert row["raw"] == raw and row["kafka_key"] == b"k" and row["event_id"] is None
    assert isinstance(table.column("quarantined_at").type, pa.TimestampType)


def test_typed_rows_from_events_read_back_in_chunks_match_arrows_filter():
    """``typed_tables`` filters token lists with NumPy (``_rows_where``): on events in several chunks, one a slice
    with its list offsets not starting at 0, with null and empty lists, it gives what Arrow's own filter gives."""
    from store.event_rows import _rows_where
    import pyarrow.compute as pc

    table = rows(*(event(t, seq=i) for i, t in enumerate([*PAYLOADS, "llm.request", "llm.response"])))
    token_ids = table.column("token_ids").to_pylist()
    token_ids[0], token_ids[-1] = [], None
    table = table.set_column(table.schema.get_field_index("token_ids"), EVENTS.field("token_ids"),
                             pa.array(token_ids, EVENTS.field("token_ids").type))
    chunked = pa.concat_tables([table.slice(0, 3), table.slice(3, 1), table.slice(4)])
    assert chunked.column("token_ids").num_chunks == 3 and chunked.column("token_ids").chunk(2).offset == 4
    for event_type in [*PAYLOADS, "none"]:
        mask = pc.equal(chunked.column("type"), event_type)
        assert _rows_where(chunked, mask).equals(chunked.filter(mask))
    only_requests = chunked.filter(pc.equal(chunked.column("type"), "llm.request"))
    assert _rows_where(only_requests, pc.equal(only_requests.column("type"), "llm.request")).equals(only_requests)
    for name, typed in typed_tables(chunked).items():
        assert typed.equals(typed_tables(table)[name])
