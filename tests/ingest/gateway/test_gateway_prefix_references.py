"""Each stored call's full prompt, messages and tools reconstruct exactly: gateway -> Kafka -> ingester -> lake.

The split engine records the prompt ids it actually received for every call.
Rollouts run through the gateway with token sessions and prefix references
(stitched calls, and an engine-rendered call after an edited history, whose
shared prefix the gateway measures), go through a real broker and the real
ingester into a Delta lake; every call's full prompt, read back through
``llm_call_prompts`` and through the dataset build, must equal what the
engine received, id for id; every call's full messages and tools, read back
through ``llm_call_messages`` and ``store.messages``, must be JSON-equal to
what the official ``openai`` client sent (captured on the wire), the
harness's echo of each answer included where it was counted, not stored.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from gateway_helpers import KEY, TENANT, serve
from kafka import KafkaProducer
from openai import OpenAI
from test_gateway_sessions import SYSTEM, TOOLS, ask, tool_rollout

from devkit.split_engine import create_split_engine
from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle
from pipelines import BuildConfig, build_dataset, read_dataset
from store.messages import full_messages, request_rows_sql, stored_messages
from store.sql import run_query


@pytest.fixture(scope="module")
def split_engine(tiny_model_dir):
    app = create_split_engine(tiny_model_dir)
    with serve(app) as url:
        yield f"{url}/v1", app


def test_every_stored_prompt_reconstructs_what_the_engine_received(settings, split_engine, tiny_model_dir,
                                                                  broker, topic, group, lake):
    settings.tokenizer = str(tiny_model_dir)
    settings.token_sessions = True
    settings.upstream_timeout_s = 60.0
    settings.upstream_url, engine = split_engine
    settings.bootstrap_servers, settings.topic, settings.broker_timeout_s = broker.bootstrap_servers, topic, 10.0
    engine.state.sampled.clear()
    sent: dict[str, list[dict]] = {}  # rollout -> the request bodies the client sent, in order
    with serve(create_gateway_app(settings)) as url:
        tool_rollout(client(url, "ro-whole", sent), turns=6, stream=False)
        tool_rollout(client(url, "ro-stream", sent), turns=6, stream=True)
        llm = client(url, "ro-edit", sent)  # the harness edits a tool result: the engine renders, the gateway verifies
        messages = [SYSTEM, {"role": "user", "content": "What is 3 + 4?"}]
        for content in ("7", "7 (checked)"):
            answer = ask(llm, messages, stream=False, tools=TOOLS)
            messages = [*messages[:2], answer,
                        {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": content}]
        ask(llm, messages, stream=False, tools=TOOLS)
        llm = client(url, "ro-echo", sent)  # the harness echoes an earlier message with a key moved: not shared
        first = ask(llm, [SYSTEM, {"role": "user", "content": "What is 12 + 30, please?"}], stream=False, tools=TOOLS)
        tool = {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "42"}
        ask(llm, [SYSTEM, {"content": "What is 12 + 30, please?", "role": "user"}, first, tool], stream=False, tools=TOOLS)
    n_calls = len(engine.state.sampled)
    send_outcomes(broker.bootstrap_servers, topic, ["ro-whole", "ro-stream", "ro-edit", "ro-echo"])
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                             group=group), idle_s=2)
    assert stats.quarantined == 0 and stats.events == 2 * n_calls + 8

    calls = run_query(lake, """SELECT rollout_id, call_id, q.prompt_token_ids AS stored, p.prompt_token_ids AS full,
                                      p.resolved, q.extends_call_id, q.extends_tokens, q.n_prompt_tokens,
                                      q.response_token_ids,
                                      json_extract_string(q.params, '$.trajlake_prompt.made') AS made
                               FROM llm_calls AS q JOIN llm_call_prompts AS p USING (tenant, rollout_id, call_id)
                               ORDER BY rollout_id, q.seq""").to_pylist()
    assert len(calls) == n_calls
    received = {tuple(s["token_ids"]): s["prompt_token_ids"] for s in engine.state.sampled}
    for call in calls:  # every stored call, resolved, is exactly the prompt the engine consumed
        assert call["resolved"] and call["full"] == received[tuple(call["response_token_ids"])], call["call_id"]
        assert call["n_prompt_tokens"] == len(call["full"])
    referenced = [c for c in calls if c["extends_call_id"]]
    assert {c["made"] for c in referenced} == {"stitched", "engine_rendered"}
    assert sum(len(c["stored"]) for c in calls) * 2 < sum(len(c["full"]) for c in calls)  # stored about once
    edited = [c for c in referenced if c["rollout_id"] == "ro-edit" and c["made"] == "engine_rendered"]
    assert edited and all(0 < c["extends_tokens"] for c in edited)  # a measured, partial prefix

    build_dataset(lake, "refs", BuildConfig())
    samples = read_dataset(lake, "refs").to_pylist()
    for rollout in ("ro-whole", "ro-stream"):  # one exact sample per stitched rollout, built from references
        [sample] = [s for s in samples if s["rollout_id"] == rollout]
        last = [c for c in calls if c["rollout_id"] == rollout][-1]
        assert sample["input_ids"] == last["full"] + last["response_token_ids"]

    check_full_messages(lake, sent)


def check_full_messages(lake, sent: dict[str, list[dict]]) -> None:
    """Every stored call's full messages and tools equal what the client sent; the references store them about
    once; an echo that differs from what was stored ends the shared run there."""
    view = run_query(lake, """SELECT rollout_id, call_id, m.messages, m.tools, m.resolved FROM llm_call_messages AS m
                              ORDER BY rollout_id, seq""").to_pylist()
    stored = sorted(run_query(lake, request_rows_sql("true")).to_pylist(), key=lambda r: r["rollout_id"])
    assert [r["call_id"] for r in view] == [r["call_id"] for r in stored]
    for rollout, bodies in sent.items():
        rows = [r for r in stored if r["rollout_id"] == rollout]
        resolved, problems = full_messages(stored_messages(rows))
        assert problems == {} and len(rows) == len(bodies)
        for row, body in zip(rows, bodies):
            assert resolved[row["call_id"]].messages == body["messages"], row["call_id"]
            assert resolved[row["call_id"]].tools == body["tools"]
        for row, body in zip([r for r in view if r["rollout_id"] == rollout], bodies):
            assert row["resolved"] and json.loads(row["messages"]) == body["messages"], row["call_id"]
            assert json.loads(row["tools"]) == body["tools"]
    referenced = [r for r in stored if r["extends_messages"] is not None]
    assert referenced and all(r["extends_tools"] and r["tools"] is None for r in referenced)
    sent_bytes = sum(len(json.dumps(b["messages"])) for bodies in sent.values() for b in bodies)
    assert sum(len(r["messages"]) for r in stored) * 2 < sent_bytes  # each message stored about once
    echo = [r["extends_messages"] for r in stored if r["rollout_id"] == "ro-echo"]
    assert echo == [None, 1]  # the system message only: the user message came back with its keys reordered
    edit = [r["extends_messages"] for r in stored if r["rollout_id"] == "ro-edit"]
    assert edit == [None, 3, 2]  # the 2nd counts the 1st's answer; the 3rd answers anew after system and user
    for rollout, echoed in (("ro-whole", True), ("ro-stream", False)):
        rows = [r for r in stored if r["rollout_id"] == rollout]
        for before, row in zip(sent[rollout], rows[1:]):  # each call after the first extends the one before
            # the openai client's dump of each answer is counted, not stored; the streamed harness's echo (role
            # first) is another layout: stored as sent
            assert row["extends_messages"] == len(before["messages"]) + echoed, row["call_id"]
            assert [m["role"] for m in json.loads(row["messages"])][0] == ("tool" if echoed else "assistant")


def client(url: str, rollout: str, sent: dict[str, list[dict]]) -> OpenAI:
    """The official client, recording each request body it sends."""
    def record(request: httpx.Request) -> None:
        sent.setdefault(rollout, []).append(json.loads(request.content))
    http = httpx.Client(event_hooks={"request": [record]})
    return OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, http_client=http,
                  default_headers={"x-trajlake-task-id": "task-1", "x-trajlake-rollout-id": rollout})


def send_outcomes(bootstrap_servers: str, topic: str, rollouts: list[str]) -> None:
    """What the harness sends beside the gateway: each rollout's end and a reward."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers)
    for i, rollout in enumerate(rollouts):
        for kind, payload in (("rollout.finished", {"status": "succeeded"}), ("reward", {"name": "pass", "value": i})):
            event = {"event_id": f"{kind}-{rollout}", "type": kind, "schema_version": 1, "ts": "2026-12-01T00:00:00Z",
                     "tenant": TENANT, "task_id": "task-1", "rollout_id": rollout, "seq": time.time_ns() // 1000,
                     "payload": payload}
            producer.send(topic, key=rollout.encode(), value=json.dumps(event).encode())
    producer.flush()
    producer.close()
