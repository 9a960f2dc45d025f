"""Build real lakes for SQL tests: validated Events -> the ingester's rows -> ``Lake.append``.

Events go through the wire contract (``EVENT_ADAPTER``) and the ingester's
row mapping (``store.event_rows``), one Delta commit per table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from schemas.events import EVENT_ADAPTER
from schemas.tables import INGESTED_TABLES
from store.event_rows import KafkaCoordinates, events_table, typed_tables
from store.lake import Lake

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def event(kind: str, payload: dict[str, Any], *, seq: int, rollout_id: str = "r1", task_id: str = "t1",
          tenant: str = "default", attempt: int = 0, seconds: float | None = None,
          harness: dict[str, str] | None = None) -> Any:
    """A validated Event; ``seconds`` after T0 (default: ``seq``) is its ts."""
    return EVENT_ADAPTER.validate_python({
        "event_id": uuid.uuid4().hex, "type": kind, "schema_version": 1,
        "ts": T0 + timedelta(seconds=seq if seconds is None else seconds),
        "tenant": tenant, "task_id": task_id, "rollout_id": rollout_id, "attempt": attempt, "seq": seq,
        "harness": harness, "payload": payload,
    })


def write_events(lake: Lake, events: list[Any], *, tables: Iterable[str] | None = None, first_offset: int = 0) -> None:
    """Append the events to ``events`` and their typed tables, as the ingester does.

    ``tables`` limits which tables are written (to build lakes with tables missing); the events get Kafka
    offsets ``first_offset``, ``first_offset + 1``... of partition 0 (continue them where a test compacts).
    """
    rows = events_table(events, [KafkaCoordinates("trajlake.events", 0, first_offset + i) for i in range(len(events))])
    batches = {"events": rows, **typed_tables(rows)}
    for name, batch in batches.items():
        if tables is None or name in tables:
            lake.append(name, batch, schema=INGESTED_TABLES[name])


def harness() -> dict[str, str]:
    return {"name": "swe-agent", "version": "1.2", "config_hash": "abc123"}


def sample_rollout(rollout_id: str = "r1", *, task_id: str = "t1", tenant: str = "default") -> list[Any]:
    """A finished rollout: start, two LLM calls, one tool step, a re-scored reward."""
    k = {"rollout_id": rollout_id, "task_id": task_id, "tenant": tenant, "harness": harness()}
    return [
        event("rollout.started", {"policy_version": "p7", "metadata": {"split": "train"}}, seq=0, **k),
        event("llm.request", {"call_id": "c1", "model": "qwen", "prompt_token_ids": [1, 2, 3],
                              "messages": [{"role": "user", "content": "fix the bug"}]}, seq=1, **k),
        event("llm.response", {"call_id": "c1", "text": "I will run the tests", "finish_reason": "tool_calls",
                               "response_token_ids": [4, 5], "logprobs": [-0.5, -0.25], "token_source": "engine",
                               "latency_ms": 120.0, "policy_version": "p7"}, seq=2, **k),
        event("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": "pytest"}}, seq=3, **k),
        event("tool.result", {"call_id": "t1", "name": "bash", "result": "1 failed", "duration_ms": 800.0,
                              "state_changed": False}, seq=4, **k),
        event("llm.request", {"call_id": "c2", "model": "qwen", "prompt_token_ids": [1, 2, 3, 4, 5, 6]},
              seq=5, **k),
        event("llm.response", {"call_id": "c2", "text": "done", "finish_reason": "stop",
                               "response_token_ids": [7, 8, 9], "logprobs": [-1.0, -0.5, -0.125],
                               "token_source": "engine", "latency_ms": 80.0}, seq=6, **k),
        event("rollout.finished", {"status": "succeeded", "reason": "tests pass", "steps": 2}, seq=7, **k),
        event("reward", {"name": "pass", "value": 0.0, "source": "grader"}, seq=8, **k),
        event("reward", {"name": "pass", "value": 1.0, "source": "grader"}, seq=9, **k),
        event("reward", {"name": "format", "value": 0.5}, seq=10, **k),
    ]
