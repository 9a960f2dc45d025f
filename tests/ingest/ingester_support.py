"""Helpers of the ingester tests: wire events of every type and a real producer."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from kafka import KafkaProducer


def wire_event(event_type: str, payload: dict[str, Any], *, rollout: str, seq: int, task: str = "task-0",
               event_id: str | None = None) -> dict[str, Any]:
    """One wire event (schema_version 1) as a producer would send it."""
    return {
        "event_id": event_id or uuid.uuid4().hex, "type": event_type, "schema_version": 1,
        "ts": "2026-11-30T07:00:00Z", "tenant": "acme", "task_id": task, "rollout_id": rollout,
        "attempt": 0, "seq": seq, "span_id": None, "parent_span_id": None,
        "harness": {"name": "tests", "version": "1", "config_hash": "h1"}, "payload": payload,
    }


def rollout_events(rollout: str, *, rng: random.Random, calls: int = 2, task: str = "task-0") -> list[dict[str, Any]]:
    """A whole rollout: start, ``calls`` x (request, response, tool call, tool result), reward, finish."""
    events = [wire_event("rollout.started", {"policy_version": "p1"}, rollout=rollout, seq=0, task=task)]
    for c in range(calls):
        call = f"{rollout}-c{c}"
        prompt = [rng.randrange(0, 2**31 - 1) for _ in range(rng.randrange(1, 60))]
        response = [rng.randrange(0, 150_000) for _ in range(rng.randrange(1, 30))]
        events += [
            wire_event("llm.request", {"call_id": call, "model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "prompt_token_ids": prompt}, rollout=rollout, seq=len(events), task=task),
            wire_event("llm.response", {"call_id": call, "text": "ok", "response_token_ids": response,
                                        "logprobs": [-rng.random() for _ in response], "token_source": "engine"},
                       rollout=rollout, seq=len(events) + 1, task=task),
            wire_event("tool.call", {"call_id": call, "name": "bash", "arguments": {"cmd": "ls"}},
                       rollout=rollout, seq=len(events) + 2, task=task),
            wire_event("tool.result", {"call_id": call, "name": "bash", "result": "a b", "state_changed": False},
                       rollout=rollout, seq=len(events) + 3, task=task),
        ]
    events.append(wire_event("reward", {"name": "pass", "value": 1.0}, rollout=rollout, seq=len(events), task=task))
    events.append(wire_event("rollout.finished", {"status": "succeeded", "steps": calls}, rollout=rollout,
                             seq=len(events), task=task))
    return events


def stream(n_rollouts: int, *, seed: int = 0, calls: int = 2) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in range(n_rollouts):
        yield from rollout_events(f"r-{seed}-{i}", rng=rng, calls=calls, task=f"task-{i % 7}")


def produce(bootstrap_servers: str, topic: str, messages: Iterable[dict[str, Any] | bytes], *,
            key: bytes = b"") -> int:
    """Send events (dicts as JSON, bytes as they are) with key = rollout_id; returns the count."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=5, max_request_size=64 * 1024 * 1024)
    n = 0
    for m in messages:
        if isinstance(m, dict):
            producer.send(topic, key=str(m.get("rollout_id", "")).encode(), value=json.dumps(m).encode())
        else:
            producer.send(topic, key=key or None, value=m)
        n += 1
    producer.flush()
    producer.close()
    return n
