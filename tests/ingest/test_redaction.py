"""Redaction rules hit what they should and nothing else; bad rule files fail at start-up with a clear error;
the ingester redacts what producers that bypass the gateway send (real broker, real Delta lake)."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ingest.batch import Batch
from ingest.dedupe import SeenEventIds
from ingest.ingester import IngesterConfig, ingest_until_idle
from ingest.redaction import (
    EVERY,
    RedactionConfigError,
    RedactionRule,
    Redactor,
    load_redactor,
    load_rules,
    marker,
    parse_field_path,
)
from schemas import fast
from schemas.versions import MAX_EVENT_BYTES, decode_event
from tests.ingest.ingester_support import produce, wire_event
from trajlake.cli import build_app

SECRET = "sk-live-4f9QzX81bTT0aLmWq2"
NEAR_MISS = "sk-live-4f9Qz"  # too short for the pattern
KEY_RULE = RedactionRule(name="api_key", pattern=r"sk-live-[A-Za-z0-9]{16,}")
MARK = "[REDACTED:api_key]"
Record = namedtuple("Record", "topic partition offset key value")


def event(event_type: str, payload: dict[str, Any], *, tenant: str = "acme"):
    doc = {"event_id": "e1", "type": event_type, "schema_version": 1, "ts": "2026-01-01T00:00:00Z",
           "tenant": tenant, "task_id": "t1", "rollout_id": "r1", "seq": 3, "payload": payload}
    return decode_event(json.dumps(doc).encode())


def request(messages: list[dict], *, tenant: str = "acme", **payload: Any):
    return event("llm.request", {"call_id": "c1", "model": "m", "messages": messages,
                                 "prompt_token_ids": [1, 2, 3], **payload}, tenant=tenant)


def response(text: str, **payload: Any):
    return event("llm.response", {"call_id": "c1", "text": text, "response_token_ids": [4, 5],
                                  "logprobs": [-0.1, -0.2], "token_source": "engine", **payload})


def dumped(e) -> str:
    return e.model_dump_json()


# ------------------------------------------------------------------ pattern rules: where they apply


def test_a_pattern_hits_message_contents_content_parts_and_history_tool_arguments():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"my key is {SECRET}, keep it"},
        {"role": "user", "content": [{"type": "text", "text": f"again {SECRET}"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "login", "arguments": json.dumps({"token": SECRET, "user": "bob"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f'{{"echo": "{SECRET}"}}'},
    ]
    out = Redactor([KEY_RULE]).redact(request(messages))
    got = out.payload.messages
    assert SECRET not in dumped(out)
    assert got[0] == messages[0]
    assert got[1]["content"] == f"my key is {MARK}, keep it"
    assert got[2]["content"] == [{"type": "text", "text": f"again {MARK}"}]
    assert json.loads(got[3]["tool_calls"][0]["function"]["arguments"]) == {"token": MARK, "user": "bob"}
    assert got[3]["tool_calls"][0]["id"] == "call_1" and got[4]["tool_call_id"] == "call_1"
    assert json.loads(got[4]["content"]) == {"echo": MARK}


@pytest.mark.parametrize(
    ("event_type", "payload", "where"),
    [
        ("llm.request", {"call_id": "c", "prompt": f"x {SECRET}"}, lambda p: p.prompt),
        ("llm.request", {"call_id": "c", "params": {"user": SECRET, "metadata": {"k": [SECRET]}}},
         lambda p: json.dumps(p.params)),
        ("llm.response", {"call_id": "c", "text": f"here: {SECRET}"}, lambda p: p.text),
        ("llm.response", {"call_id": "c", "error": f"401 for key {SECRET}"}, lambda p: p.error),
        ("llm.response", {"call_id": "c", "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "f", "arguments": json.dumps({"a": SECRET})}}]},
         lambda p: p.tool_calls[0]["function"]["arguments"]),
        ("tool.call", {"call_id": "c", "name": "bash", "arguments": {"cmd": f"curl -H {SECRET}", "n": 2}},
         lambda p: json.dumps(p.arguments)),
        ("tool.call", {"call_id": "c", "name": "bash", "arguments": json.dumps({"nested": {"deep": [SECRET]}})},
         lambda p: p.arguments),
        ("tool.result", {"call_id": "c", "name": "bash", "result": f"out {SECRET}"}, lambda p: p.result),
        ("tool.result", {"call_id": "c", "name": "bash", "result": [{"line": SECRET}]},
         lambda p: json.dumps(p.result)),
        ("tool.result", {"call_id": "c", "name": "bash", "error": f"denied {SECRET}"}, lambda p: p.error),
        ("rollout.started", {"metadata": {"env": {"vars": [f"KEY={SECRET}"]}}}, lambda p: json.dumps(p.metadata)),
        ("rollout.finished", {"status": "failed", "reason": f"leaked {SECRET}"}, lambda p: p.reason),
    ],
)
def test_a_pattern_hits_every_listed_free_text_field(event_type, payload, where):
    before = event(event_type, payload)
    after = Redactor([KEY_RULE]).redact(before)
    assert SECRET in where(before.payload)
    assert SECRET not in where(after.payload) and MARK in where(after.payload)
    assert SECRET not in dumped(after)


def test_a_pattern_leaves_everything_else_alone():
    messages = [{"role": "user", "content": f"short key {NEAR_MISS} only", "name": "bob"}]
    tools = [{"type": "function", "function": {"name": "f", "description": f"uses {SECRET}"}}]
    cases = [
        request(messages, tools=tools),  # tools: the developer's schemas, not scanned
        event("llm.request", {"call_id": SECRET, "model": SECRET, "idempotency_key": SECRET,
                              "tokenizer": SECRET}),
        event("tool.call", {"call_id": "c", "name": "bash", "arguments": {SECRET: 1, "n": 123456789012345678}}),
        event("reward", {"name": "pass", "value": 1.0, "source": SECRET}),
        event("rollout.started", {"group_id": SECRET, "policy_version": SECRET}),
        event("llm.response", {"call_id": "c", "text": "fine", "finish_reason": SECRET, "policy_version": SECRET,
                               "response_token_ids": [1], "token_source": "engine"}),
    ]
    redactor = Redactor([KEY_RULE])
    for before in cases:
        assert redactor.redact(before) is before, before.type


def test_structural_keys_inside_messages_are_not_scanned():
    rule = RedactionRule(name="word", pattern="user|call_9|function")
    messages = [{"role": "user", "content": "hi", "tool_call_id": "call_9"},
                {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function",
                                                      "function": {"name": "f", "arguments": "{}"}}]}]
    before = request(messages)
    assert Redactor([rule]).redact(before) is before


def test_a_string_that_only_looks_like_json_is_redacted_as_text():
    before = event("tool.result", {"call_id": "c", "name": "n", "result": f"{{not json {SECRET}"})
    assert Redactor([KEY_RULE]).redact(before).payload.result == f"{{not json {MARK}"


def test_nested_json_with_escapes_and_unicode_is_redacted_and_stays_valid_json():
    escaped = SECRET.replace("sk", "\\u0073\\u006b")  # the same secret, written with JSON escapes
    arguments = '{"ключ": "' + escaped + '", "emoji": "🔑"}'
    after = Redactor([KEY_RULE]).redact(event("tool.call", {"call_id": "c", "name": "n", "arguments": arguments}))
    assert json.loads(after.payload.arguments) == {"ключ": MARK, "emoji": "🔑"}


def test_unicode_patterns_and_neighbours():
    rule = RedactionRule(name="name", pattern="Zoë Ångström", ignore_case=True)
    before = request([{"role": "user", "content": "🔑zoë ångström🔑 and Zoe Angstrom"}])
    after = Redactor([rule]).redact(before)
    assert after.payload.messages[0]["content"] == "🔑[REDACTED:name]🔑 and Zoe Angstrom"


def test_several_rules_each_leave_their_own_marker():
    email = RedactionRule(name="email", pattern=r"[\w.+-]+@[\w-]+\.[\w.]+")
    after = Redactor([KEY_RULE, email]).redact(request([{"role": "user", "content": f"{SECRET} to a.b@c.io"}]))
    assert after.payload.messages[0]["content"] == f"{MARK} to [REDACTED:email]"


def test_inline_flags_and_the_requires_prefilter():
    inline = RedactionRule(name="word", pattern="(?i)hunter2")
    email = RedactionRule(name="email", pattern=r"[\w.+-]+@[\w-]+\.\w+", requires="@")
    lying = RedactionRule(name="x", pattern="secret", requires="@")  # requires skips strings without "@"
    after = Redactor([inline, email, lying]).redact(
        request([{"role": "user", "content": "HUNTER2 to a.b@c.io"}, {"role": "user", "content": "secret"}]))
    assert [m["content"] for m in after.payload.messages] == ["[REDACTED:word] to [REDACTED:email]", "secret"]


def test_redacting_twice_changes_nothing_more():
    redactor = Redactor([KEY_RULE, RedactionRule(name="email", field="metadata.email")])
    for before in (request([{"role": "user", "content": SECRET}]),
                   event("rollout.started", {"metadata": {"email": "a@b.io"}})):
        once = redactor.redact(before)
        assert once != before and redactor.redact(once) is once


def test_huge_strings():
    big = "lorem ipsum " * 150_000  # 1.8 MB: two of them and the secret stay under the 4 MiB event limit
    clean = request([{"role": "user", "content": big}])
    assert Redactor([KEY_RULE]).redact(clean) is clean
    dirty = Redactor([KEY_RULE]).redact(request([{"role": "user", "content": big + SECRET + " " + big}]))
    assert dirty.payload.messages[0]["content"] == big + MARK + " " + big


# ------------------------------------------------------------------ scoping


def test_tenant_scoped_rules_leave_other_tenants_identical_strings_alone():
    scoped = RedactionRule(name="api_key", pattern=KEY_RULE.pattern, tenants=["acme"])
    redactor = Redactor([scoped])
    globex = request([{"role": "user", "content": SECRET}], tenant="globex")
    assert redactor.redact(globex) is globex
    assert SECRET not in dumped(redactor.redact(request([{"role": "user", "content": SECRET}], tenant="acme")))


def test_event_scoped_rules_apply_to_those_types_only():
    rule = RedactionRule(name="api_key", pattern=KEY_RULE.pattern, events=["tool.result"])
    redactor = Redactor([rule])
    call = event("tool.call", {"call_id": "c", "name": "n", "arguments": SECRET})
    assert redactor.redact(call) is call
    assert redactor.redact(event("tool.result", {"call_id": "c", "name": "n", "result": SECRET})).payload.result == MARK


# ------------------------------------------------------------------ field rules


def test_field_rules_replace_whole_values_of_any_type():
    redactor = Redactor([
        RedactionRule(name="email", field="payload.metadata.user.email"),
        RedactionRule(name="api_key", field="arguments.api_key"),
        RedactionRule(name="who", field="messages[*].name"),
        RedactionRule(name="second", field="messages[1].content"),
    ])
    started = redactor.redact(event("rollout.started", {"metadata": {"user": {"email": "a@b.io", "id": 7},
                                                                      "email": "kept@b.io"}}))
    assert started.payload.metadata == {"user": {"email": "[REDACTED:email]", "id": 7}, "email": "kept@b.io"}
    as_dict = redactor.redact(event("tool.call", {"call_id": "c", "name": "n",
                                                  "arguments": {"api_key": {"v": 1}, "q": "x"}}))
    assert as_dict.payload.arguments == {"api_key": "[REDACTED:api_key]", "q": "x"}
    as_json = redactor.redact(event("tool.call", {"call_id": "c", "name": "n",
                                                  "arguments": json.dumps({"api_key": 42, "q": "x"})}))
    assert json.loads(as_json.payload.arguments) == {"api_key": "[REDACTED:api_key]", "q": "x"}
    chat = redactor.redact(request([{"role": "user", "content": "a", "name": "bob"},
                                    {"role": "user", "content": "b"}]))
    assert chat.payload.messages == [{"role": "user", "content": "a", "name": "[REDACTED:who]"},
                                     {"role": "user", "content": "[REDACTED:second]"}]


def test_field_rules_on_absent_paths_change_nothing():
    redactor = Redactor([RedactionRule(name="x", field="metadata.email"),
                         RedactionRule(name="y", field="messages[5].name"),
                         RedactionRule(name="z", field="arguments.key.deeper")])
    for before in (event("rollout.started", {"metadata": {"mail": "a@b.io"}}),
                   event("rollout.started", {"metadata": {"email": None}}),
                   request([{"role": "user", "content": "a", "name": "bob"}]),
                   event("tool.call", {"call_id": "c", "name": "n", "arguments": {"key": "flat"}}),
                   event("tool.call", {"call_id": "c", "name": "n", "arguments": "plain text"})):
        assert redactor.redact(before) is before


def test_parse_field_path():
    assert parse_field_path("payload.messages[*].tool_calls[0].function.arguments") == (
        "messages", EVERY, "tool_calls", 0, "function", "arguments")
    assert parse_field_path("prompt") == ("prompt",)


# ------------------------------------------------------------------ token ids


def test_redacted_prompt_text_drops_the_prompt_token_ids():
    after = Redactor([KEY_RULE]).redact(request([{"role": "user", "content": SECRET}], tokenizer="tok"))
    assert after.payload.prompt_token_ids is None and after.payload.tokenizer == "tok"


def test_redacted_response_text_drops_ids_and_logprobs_and_says_none():
    after = Redactor([KEY_RULE]).redact(response(f"the key is {SECRET}"))
    assert (after.payload.response_token_ids, after.payload.logprobs, after.payload.token_source) == (
        None, None, "none")
    assert decode_event(after.model_dump_json().encode()) == after  # still a valid event


def test_a_hit_outside_the_token_text_keeps_the_ids():
    redactor = Redactor([KEY_RULE])
    with_params = redactor.redact(request([{"role": "user", "content": "hi"}], params={"user": SECRET}))
    assert with_params.payload.params == {"user": MARK} and with_params.payload.prompt_token_ids == [1, 2, 3]
    with_error = redactor.redact(response("ok", error=f"upstream said {SECRET}"))
    assert with_error.payload.response_token_ids == [4, 5] and with_error.payload.token_source == "engine"


def test_later_calls_carrying_the_same_secret_are_redacted_the_same_way():
    redactor = Redactor([KEY_RULE])
    first = [{"role": "user", "content": f"use {SECRET}"}]
    later = first + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    a, b = redactor.redact(request(first)), redactor.redact(request(later))
    assert a.payload.messages == b.payload.messages[:1]
    assert a.payload.prompt_token_ids is None and b.payload.prompt_token_ids is None


def test_a_messages_reference_keeps_positions_and_survives_dropped_ids():
    """``messages[N]`` names the N-th of the call's full messages, also when a reference stores only the later
    ones; a hit in those drops the prompt ids and their prefix reference, not the messages reference."""
    redactor = Redactor([KEY_RULE, RedactionRule(name="first", field="messages[0].content"),
                         RedactionRule(name="third", field="messages[2].content")])
    shared = dict(extends_call_id="c0", extends_tokens=3, extends_messages=1, extends_tools=True)
    later = redactor.redact(request([{"role": "assistant", "content": "ok"}, {"role": "user", "content": SECRET}],
                                    **shared))
    assert later.payload.messages == [{"role": "assistant", "content": "ok"}, {"role": "user", "content": marker("third")}]
    assert later.payload.prompt_token_ids is None and later.payload.extends_tokens is None
    assert (later.payload.extends_call_id, later.payload.extends_messages, later.payload.extends_tools) == ("c0", 1, True)
    ids_only = redactor.redact(request([{"role": "user", "content": SECRET}], extends_call_id="c0", extends_tokens=3))
    assert ids_only.payload.extends_call_id is None and ids_only.payload.extends_tokens is None


def test_the_fast_decode_structs_are_redacted_like_the_pydantic_events():
    redactor = Redactor([KEY_RULE, RedactionRule(name="who", field="messages[*].name")])
    for before in (request([{"role": "user", "content": SECRET, "name": "bob"}]), response(SECRET),
                   event("tool.call", {"call_id": "c", "name": "n", "arguments": {"k": SECRET}})):
        [as_struct] = fast.decode_batch([before.model_dump_json().encode()])
        want, got = redactor.redact(before), redactor.redact(as_struct)
        assert isinstance(got, msgspec.Struct)
        assert msgspec.to_builtins(got.payload) == want.payload.model_dump(mode="json")


# ------------------------------------------------------------------ raw text (quarantine)


def test_redact_raw_replaces_matches_and_keeps_undecodable_bytes():
    redactor = Redactor([RedactionRule(name="api_key", pattern=KEY_RULE.pattern, tenants=["acme"])])
    raw = b'{"broken": "' + SECRET.encode() + b'"\xff\xfe'
    assert redactor.redact_raw(raw) == b'{"broken": "' + MARK.encode() + b'"\xff\xfe'
    clean = b'{"fine": true'
    assert redactor.redact_raw(clean) is clean
    assert redactor.redact_text(f"reason {SECRET}") == f"reason {SECRET}"  # tenant-scoped: not for text of no tenant
    assert Redactor([KEY_RULE]).redact_text(f"reason {SECRET}") == f"reason {MARK}"


# ------------------------------------------------------------------ rule files


def write(tmp_path: Path, text: str, name: str = "rules.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_toml_and_a_json_file_load_the_same_rules(tmp_path):
    toml = write(tmp_path, """
[[rules]]
name = "api_key"
pattern = 'sk-live-[A-Za-z0-9]{16,}'

[[rules]]
name = "email"
field = "payload.metadata.email"
events = ["rollout.started"]
tenants = ["acme"]
""")
    as_json = write(tmp_path, json.dumps({"rules": [
        {"name": "api_key", "pattern": "sk-live-[A-Za-z0-9]{16,}"},
        {"name": "email", "field": "payload.metadata.email", "events": ["rollout.started"], "tenants": ["acme"]},
    ]}), "rules.json")
    assert load_rules(toml).rules == load_rules(as_json).rules
    assert [r.name for r in load_rules(toml).rules] == ["api_key", "email"]


def test_no_file_or_no_rules_means_no_redactor(tmp_path):
    assert load_redactor(None) is None
    assert load_redactor(write(tmp_path, "rules = []")) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[rules]]\nname = "a"\npattern = "sk-[a-z"', "invalid regex"),
        ('[[rules]]\nname = "a"\npattern = "x*"', "matches the empty string"),
        ('[[rules]]\nname = "a"\nfield = "prompt"\nrequires = "@"', "no use for it"),
        ('[[rules]]\nname = "a"\npattern = "x@y"\nrequires = "X"\nignore_case = true', "case-sensitively"),
        ('[[rules]]\nname = "a"\npattern = "x"\nrequires = ""', "requires"),
        ('[[rules]]\nname = "a"\nfield = "call_id"', "cannot be redacted"),
        ('[[rules]]\nname = "a"\nfield = "payload.event_id"', "cannot be redacted"),
        ('[[rules]]\nname = "a"\nfield = "messages[x].name"', "cannot read"),
        ('[[rules]]\nname = "a"\nfield = "metadata..email"', "cannot read"),
        ('[[rules]]\nname = "a"\nfield = ""', "cannot read"),
        ('[[rules]]\nname = "a"\nfield = "messages[*]"', "name a key inside it"),
        ('[[rules]]\nname = "a"\nfield = "metadata"', "name a key inside it"),
        ('[[rules]]\nname = "a"\nfield = "metadata.email"\nevents = ["tool.call"]', "has a payload field"),
        ('[[rules]]\nname = "a"\npattern = 5', "pattern: Input should be a valid string"),
        ('[[rules]]\nname = "a"\npattern = "x"\ntenants = "acme"', "tenants"),
        ('[[rules]]\nname = "a"\npattern = "x"\ntenants = []', "tenants"),
        ('[[rules]]\nname = "a"\npattern = "x"\nevents = ["llm.call"]', "events"),
        ('[[rules]]\nname = "a"\npattern = "x"\nfield = "prompt"', "exactly one"),
        ('[[rules]]\nname = "a"', "exactly one"),
        ('[[rules]]\nname = "a"\nregex = "x"', "regex: Extra inputs"),
        ('[[rules]]\npattern = "x"', "name: Field required"),
        ('[[rules]]\nname = "has space"\npattern = "x"', "name: String should match"),
        ('[[rules]]\nname = "a"\npattern = "x"\n[[rules]]\nname = "a"\npattern = "y"', "unique"),
        ("rules = 3", "exactly one key, 'rules'"),
        ('rule = []', "exactly one key, 'rules'"),
        ("rules = [3]", "rule 0 (None)"),
        ("[[rules]\nname=", "not valid TOML"),
    ],
)
def test_bad_rule_files_fail_with_a_clear_error(tmp_path, text, message):
    with pytest.raises(RedactionConfigError) as info:
        load_rules(write(tmp_path, text))
    assert message in str(info.value)


def test_bad_json_missing_files_and_other_suffixes(tmp_path):
    with pytest.raises(RedactionConfigError, match="not valid JSON"):
        load_rules(write(tmp_path, '{"rules": [', "rules.json"))
    with pytest.raises(RedactionConfigError, match="exactly one key"):
        load_rules(write(tmp_path, '[{"name": "a", "pattern": "x"}]', "rules.json"))
    with pytest.raises(RedactionConfigError, match="cannot read"):
        load_rules(tmp_path / "absent.toml")
    with pytest.raises(RedactionConfigError, match=r"\*.json or \*.toml"):
        load_rules(write(tmp_path, "rules: []", "rules.yaml"))


# ------------------------------------------------------------------ the ingester (producers that bypass the gateway)


def stored_bytes(root: Path) -> bytes:
    """Every file under ``root`` as stored, plus the decoded strings of each Parquet file (ZSTD hides text)."""
    def leaves(value: Any):
        if isinstance(value, (bytes, str)):
            yield value if isinstance(value, bytes) else value.encode()
        elif isinstance(value, (list, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                yield from leaves(item)

    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        out.append(path.read_bytes())
        if path.suffix == ".parquet":
            out.extend(leaves(pq.read_table(path).to_pylist()))
    return b"\n".join(out)


def records(values: list[bytes]) -> list:
    return [Record("t", 0, offset, b"r1", value) for offset, value in enumerate(values)]


def test_the_ingesters_batch_redacts_both_decode_paths_and_the_quarantined_text():
    fast_path = event("tool.call", {"call_id": "c", "name": "n", "arguments": {"k": SECRET}}).model_dump_json()
    lax = json.loads(event("tool.result", {"call_id": "c", "name": "n", "result": SECRET}).model_dump_json())
    lax["event_id"], lax["payload"]["state_changed"] = "e2", 1  # pydantic reads 1 as true, msgspec refuses it
    invalid = {**lax, "event_id": "bad", "ts": f"at {SECRET}"}  # invalid; the reason quotes the value
    values = [fast_path.encode(), json.dumps(lax).encode(), json.dumps(invalid).encode()]
    assert [e is None for e in fast.decode_batch(values)] == [False, True, True]
    batch = Batch()
    batch.add(records(values))
    decoded = batch.decode(SeenEventIds(), max_event_bytes=MAX_EVENT_BYTES, redactor=Redactor([KEY_RULE]))
    payloads = decoded.events.column("payload").to_pylist()
    assert len(payloads) == 2 and all(SECRET not in p and MARK in p for p in payloads)
    [rejected] = decoded.rejected
    assert SECRET.encode() not in rejected.raw and MARK.encode() in rejected.raw
    assert SECRET not in rejected.reason and MARK in rejected.reason and rejected.event_id == "bad"
    unredacted = Batch()
    unredacted.add(records(values))
    assert SECRET in unredacted.decode(SeenEventIds(), max_event_bytes=MAX_EVENT_BYTES).events.column(
        "payload").to_pylist()[0]


def test_the_ingester_redacts_events_that_bypass_the_gateway(broker, topic, group, lake):
    email = "zoë@example.org"
    events = [
        wire_event("rollout.started", {"metadata": {"user_email": email, "plan": "pro"}}, rollout="r-x", seq=0),
        wire_event("llm.request", {"call_id": "c1", "messages": [{"role": "user", "content": f"key {SECRET}"}],
                                   "prompt_token_ids": [1, 2, 3]}, rollout="r-x", seq=1),
        wire_event("llm.response", {"call_id": "c1", "text": "done", "response_token_ids": [4],
                                    "logprobs": [-0.1], "token_source": "engine"}, rollout="r-x", seq=2),
        wire_event("tool.call", {"call_id": "t1", "name": "curl", "arguments": {"auth": SECRET}}, rollout="r-x", seq=3),
    ]
    broken = json.dumps({**events[3], "seq": "three"}).encode()  # quarantined, raw text holds the secret
    produce(broker.bootstrap_servers, topic, [*events, broken], key=b"r-x")
    redactor = Redactor([KEY_RULE, RedactionRule(name="email", field="metadata.user_email")])
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                             group=group, dlq_topic="", redactor=redactor), idle_s=1.0)
    assert (stats.events, stats.quarantined) == (4, 1)

    on_disk = stored_bytes(Path(lake.root))
    assert MARK.encode() in on_disk  # the search can see the text it looks for
    assert SECRET.encode() not in on_disk and email.encode() not in on_disk
    [request] = lake.read("llm_requests").to_pylist()
    [answer] = lake.read("llm_responses").to_pylist()
    assert request["prompt_token_ids"] is None and MARK in request["messages"]
    assert answer["response_token_ids"] == [4] and answer["token_source"] == "engine"
    [started] = lake.read("rollout_starts").to_pylist()
    assert json.loads(started["metadata"]) == {"user_email": "[REDACTED:email]", "plan": "pro"}
    [quarantined] = lake.read("quarantine").to_pylist()
    assert MARK.encode() in quarantined["raw"] and quarantined["field"] == "seq"


def test_an_unusable_rules_file_stops_the_ingester_at_start(tmp_path):
    bad = write(tmp_path, '[[rules]]\nname = "a"\nfield = "call_id"')
    result = CliRunner().invoke(build_app(), ["ingest", "--redaction-rules", str(bad), "--bootstrap-servers",
                                              "127.0.0.1:1", "--lake", str(tmp_path / "lake")])
    said = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 2
    assert "ingester not started" in said
    assert "rule 0 ('a'): field 'call_id': the payload field 'call_id' cannot be redacted" in said


def test_a_producer_learns_what_a_reference_would_hide_from_the_rules():
    """``changes_history``: (the rules change the call's full messages or tools, they change its answer's echo)."""
    clean = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    leaked = [*clean, {"role": "user", "content": f"use {SECRET}"}]
    tools = [{"type": "function", "function": {"name": "deploy", "parameters": {"token": "x"}}}]
    redactor = Redactor([KEY_RULE, RedactionRule(name="tok", field="tools[*].function.parameters.token"),
                         RedactionRule(name="second", field="messages[3].content", tenants=["globex"])])
    assert redactor.changes_history("acme", clean, None, {"content": "ok", "role": "assistant"}) == (False, False)
    assert redactor.changes_history("acme", leaked, None, {"content": "ok", "role": "assistant"}) == (True, False)
    assert redactor.changes_history("acme", clean, tools) == (True, False)
    assert redactor.changes_history("acme", clean, None, {"content": SECRET, "role": "assistant"}) == (False, True)
    echo = {"content": "ok", "role": "assistant"}
    assert redactor.changes_history("globex", clean, None, echo) == (False, False)  # the echo is [2]
    assert redactor.changes_history("globex", leaked, None, echo) == (True, True)  # [2] has the key, the echo is [3]
    assert Redactor([KEY_RULE]).changes_history("acme", leaked, None, None) == (True, False)
