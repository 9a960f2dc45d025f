"""Each stored call's full prompt reconstructs exactly: gateway (token sessions) -> Kafka -> ingester -> lake.

The split engine records the prompt ids it actually received for every call.
Rollouts run through the gateway with token sessions and prefix references
(stitched calls, and an engine-rendered call after an edited history, whose
shared prefix the gateway measures), go through a real broker and the real
ingester into a Delta lake; every call's full prompt, read back through
``llm_call_prompts`` and through the dataset build, must equal what the
engine received, id for id.
"""

from __future__ import annotations

import json
import time

import pytest
from gateway_helpers import TENANT, serve
from kafka import KafkaProducer
from test_gateway_sessions import SYSTEM, TOOLS, ask, client, tool_rollout

from devkit.split_engine import create_split_engine
from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle
from pipelines import BuildConfig, build_dataset, read_dataset
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
    with serve(create_gateway_app(settings)) as url:
        tool_rollout(client(url, "ro-whole"), turns=6, stream=False)
        tool_rollout(client(url, "ro-stream"), turns=6, stream=True)
        llm = client(url, "ro-edit")  # the harness edits a tool result: the engine renders, the gateway verifies
        messages = [SYSTEM, {"role": "user", "content": "What is 3 + 4?"}]
        for content in ("7", "7 (checked)"):
            answer = ask(llm, messages, stream=False, tools=TOOLS)
            messages = [*messages[:2], answer,
                        {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": content}]
        ask(llm, messages, stream=False, tools=TOOLS)
    n_calls = len(engine.state.sampled)
    send_outcomes(broker.bootstrap_servers, topic, ["ro-whole", "ro-stream", "ro-edit"])
    stats = ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                             group=group), idle_s=2)
    assert stats.quarantined == 0 and stats.events == 2 * n_calls + 6

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
