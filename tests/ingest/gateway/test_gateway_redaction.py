"""Redaction in the gateway: the secret reaches neither Kafka, nor the spool, nor the lake.

Real gateway app over HTTP, the fake engine, a real Kafka-protocol broker and
the real ingester writing a Delta lake; then the bytes of every file are
searched for the secret (Parquet files decoded too: ZSTD hides text), and
every table is read back.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
from gateway_fake_engine import token_id
from gateway_helpers import KEY, OTHER_KEY, memory_emitter, serve, wait_for
from typer.testing import CliRunner

from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle
from pipelines import BuildConfig, build_dataset, read_dataset
from schemas.tables import TYPED_TABLES
from store.sql import run_query
from tests.ingest.test_redaction import stored_bytes
from trajlake.cli import build_app

SECRET = "sk-live-Q8b2ZxT4LmW9pR7aYc"
EMAIL = "zoë.private@example.org"
RULES = """
[[rules]]
name = "api_key"
pattern = 'sk-live-[A-Za-z0-9]{16,}'

[[rules]]
name = "email"
field = "payload.metadata.user_email"

[[rules]]
name = "dog"
pattern = "lazy dog"
tenants = ["globex"]
"""


def rules_file(tmp_path: Path, rules: str = RULES) -> Path:
    path = tmp_path / "redaction.toml"
    path.write_text(rules, encoding="utf-8")
    return path


def wire(event_type: str, payload: dict, *, seq: int) -> dict:
    return {"event_id": uuid.uuid4().hex, "type": event_type, "schema_version": 1, "ts": "2026-11-30T07:00:00Z",
            "task_id": "task-r", "rollout_id": "ro-secret", "seq": seq, "payload": payload}


def exercise(url: str) -> None:
    """Calls and events that carry the secret in every kind of place, plus clean ones."""
    acme = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}", "X-Trajlake-Task-Id": "task-r",
                                               "X-Trajlake-Rollout-Id": "ro-secret"}, timeout=30)
    globex = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OTHER_KEY}"}, timeout=30)
    history = [{"role": "user", "content": f"deploy with {SECRET} please"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "deploy", "arguments": json.dumps({"token": SECRET})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "deployed"}]
    for body in ({"model": "fake-model", "messages": history[:1]}, {"model": "fake-model", "messages": history},
                 {"model": "fake-model", "prompt": f"key={SECRET}"}):
        route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        assert acme.post(route, json=body).status_code == 200
    clean = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}
    assert acme.post("/v1/chat/completions", json=clean).status_code == 200
    assert globex.post("/v1/chat/completions", json=clean).status_code == 200
    batch = [wire("rollout.started", {"metadata": {"user_email": EMAIL, "plan": "pro"}}, seq=0),
             wire("tool.call", {"call_id": "t1", "name": "curl", "arguments": json.dumps({"auth": SECRET})}, seq=1),
             wire("tool.result", {"call_id": "t1", "name": "curl", "result": f"echo: {SECRET}"}, seq=2),
             wire("reward", {"name": "pass", "value": 1.0}, seq=2**62),
             wire("rollout.finished", {"status": "succeeded", "steps": 4}, seq=2**62 + 1)]
    answer = acme.post("/v1/events", json={"events": batch}).json()
    assert answer["accepted"] == 5, answer


def test_the_secret_reaches_neither_kafka_nor_the_lake(settings, engine, broker, topic, group, lake, tmp_path):
    settings.bootstrap_servers, settings.topic = broker.bootstrap_servers, topic
    settings.redaction_rules = rules_file(tmp_path)
    with serve(create_gateway_app(settings)) as url:
        exercise(url)
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers,
                                             topic=topic, group=group), idle_s=1.0)
    assert stats.events == 15 and stats.quarantined == 0

    on_disk = stored_bytes(Path(lake.root)) + stored_bytes(settings.spool_dir)
    assert b"[REDACTED:api_key]" in on_disk  # the search below can see the text it looks for
    assert SECRET.encode() not in on_disk and EMAIL.encode() not in on_disk
    tables = {name: lake.read(name).to_pylist() for name in ["events", *(n for n, _ in TYPED_TABLES.values())]
              if lake.exists(name)}
    text = json.dumps(tables, default=str, ensure_ascii=False)
    assert SECRET not in text and EMAIL not in text
    [started] = tables["rollout_starts"]
    assert json.loads(started["metadata"]) == {"user_email": "[REDACTED:email]", "plan": "pro"}

    requests = {json.dumps(r["messages"] or r["prompt"]): r for r in tables["llm_requests"]}
    responses = {(r["tenant"], r["call_id"]): r for r in tables["llm_responses"]}
    redacted = [r for key, r in requests.items() if "REDACTED" in key]
    assert len(redacted) == 3 and all(r["prompt_token_ids"] is None for r in redacted)
    clean = [r for r in tables["llm_requests"] if r["messages"] and "hello there" in r["messages"]]
    assert all(r["prompt_token_ids"] == [token_id("hello"), token_id("there"), token_id("<assistant>")]
               for r in clean)
    for row in tables["llm_requests"]:
        assert token_id(SECRET) not in (row["prompt_token_ids"] or [])
    by_tenant = {r["tenant"]: responses[(r["tenant"], r["call_id"])] for r in clean}
    assert by_tenant["globex"]["token_source"] == "none" and by_tenant["globex"]["response_token_ids"] is None
    assert "[REDACTED:dog]" in by_tenant["globex"]["text"]
    assert by_tenant["acme"]["token_source"] == "engine" and "lazy dog" in by_tenant["acme"]["text"]  # tenant-scoped

    clean_call = next(r["call_id"] for r in clean if r["tenant"] == "acme")
    for allow_non_engine in (False, True):  # redacted calls lack prompt ids: never trained
        result = build_dataset(lake, "ds", BuildConfig(allow_non_engine=allow_non_engine))
        calls = result.manifest["counts"]["calls"]
        assert (calls["ok"], calls["non_engine"]) == (1, 3), calls
        assert [s["call_ids"] for s in read_dataset(lake, "ds").to_pylist()] == [[clean_call]]


def test_the_spool_never_holds_the_secret(settings, engine, tmp_path):
    settings.redaction_rules = rules_file(tmp_path)
    emitter, sink = memory_emitter(tmp_path)
    sink.down = True
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        exercise(url)
        wait_for(lambda: emitter.spooled == 15, what="15 spooled events", detail=lambda: emitter.spooled)
    spooled = stored_bytes(tmp_path / "spool")
    assert b"[REDACTED:api_key]" in spooled and b"[REDACTED:email]" in spooled
    assert SECRET.encode() not in spooled and EMAIL.encode() not in spooled
    assert emitter.redacted == 7  # 3 requests with the key, globex's response, the 3 posted events


def test_an_unusable_rules_file_stops_the_gateway_at_start(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAJLAKE_GATEWAY_KEYS", "k=t")
    monkeypatch.setenv("TRAJLAKE_SPOOL_DIR", str(tmp_path / "spool"))
    bad = tmp_path / "rules.toml"
    bad.write_text('[[rules]]\nname = "a"\npattern = "sk-[a-z"\n', encoding="utf-8")
    result = CliRunner().invoke(build_app(), ["gateway", "--redaction-rules", str(bad)])
    said = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 2
    assert "gateway not started" in said and "rule 0 ('a'): invalid regex" in said


REFERENCE_RULES = """
[[rules]]
name = "answer"
field = "messages[2].content"

[[rules]]
name = "api_key"
pattern = 'sk-live-[A-Za-z0-9]{16,}'
"""


def test_messages_references_hide_nothing_from_the_rules(settings, engine, broker, topic, group, lake, tmp_path):
    """A messages reference stores a call's history once: the messages it shares with the rollout's previous call,
    and the harness's echo of that call's answer, are rebuilt from that call's rows. Rules on the full messages
    still hold: an echo a rule would change is sent (and redacted) in the call that echoes it, and a call the rules
    changed is no reference base (a later call would store its secret-bearing history only as a reference, and keep
    prompt ids that encode the secret)."""
    settings.bootstrap_servers, settings.topic = broker.bootstrap_servers, topic
    settings.redaction_rules = rules_file(tmp_path, REFERENCE_RULES)
    llm = httpx.Client(headers={"Authorization": f"Bearer {KEY}", "X-Trajlake-Task-Id": "task-r",
                                "X-Trajlake-Rollout-Id": "ro-ref"}, timeout=30)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is up"}]
    with serve(create_gateway_app(settings)) as url:
        for new in ("and then", f"deploy with {SECRET}", "thanks"):  # each call echoes the answer before it
            answer = llm.post(f"{url}/v1/chat/completions", json={"model": "fake-model", "messages": messages})
            assert answer.status_code == 200
            echo = {"content": answer.json()["choices"][0]["message"]["content"], "role": "assistant"}
            messages = [*messages, echo, {"role": "user", "content": new}]
        assert llm.post(f"{url}/v1/chat/completions", json={"model": "fake-model", "messages": messages}).is_success
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers,
                                             topic=topic, group=group), idle_s=1.0)
    assert stats.events == 8 and stats.quarantined == 0

    rows = run_query(lake, """SELECT q.extends_messages, m.messages, m.resolved, p.prompt_token_ids
                              FROM llm_requests AS q JOIN llm_call_messages AS m USING (tenant, rollout_id, call_id)
                              JOIN llm_call_prompts AS p USING (tenant, rollout_id, call_id)
                              ORDER BY q.seq""").to_pylist()
    assert [r["extends_messages"] for r in rows] == [None, 2, 5, 7]  # the echo at [2] sent; the later ones counted
    assert all(r["resolved"] for r in rows)
    for row in rows[1:]:  # the answer echoed at messages[2] is redacted in every call's full messages
        assert json.loads(row["messages"])[2] == {"content": "[REDACTED:answer]", "role": "assistant"}
        assert row["prompt_token_ids"] is None  # ... and no call keeps ids that encode it (or the key)
    assert rows[0]["prompt_token_ids"] == [token_id(w) for w in "be brief what is up <assistant>".split()]
    rebuilt = json.dumps([r["messages"] for r in rows])
    assert SECRET not in rebuilt and "[REDACTED:api_key]" in rebuilt
