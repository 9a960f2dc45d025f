"""Helpers of the gateway tests: real HTTP servers (``serve``), a memory sink, waiting."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from ingest.gateway.emitter import Emitter, SinkUnavailable
from ingest.spool import Spool
from schemas.events import PAYLOAD_MODELS, Harness, _Envelope
from trajlake.background import serve_in_thread as serve  # noqa: F401  (re-exported for the gateway tests)

KEY = "sk-test-acme"
TENANT = "acme"
OTHER_KEY = "sk-test-globex"


class MemorySink:
    """A sink that keeps (key, value) pairs, or refuses everything while ``down``."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.down = False
        self.lock = threading.Lock()

    def send(self, records) -> None:
        if self.down:
            raise SinkUnavailable("memory sink is down")
        with self.lock:
            self.records.extend(records)

    def close(self) -> None:
        pass


def memory_emitter(tmp_path: Path, *, max_bytes: int = 1 << 20) -> tuple[Emitter, MemorySink]:
    sink = MemorySink()
    return Emitter(sink, Spool(tmp_path / "spool", max_bytes=max_bytes), retry_interval_s=0.05), sink


def wire_event(value: bytes) -> dict:
    """An event's JSON as a reader takes it: the fields the gateway left out at their defaults filled in."""
    event = json.loads(value)

    def filled(raw: dict, model) -> dict:
        return {**{name: f.get_default(call_default_factory=True) for name, f in model.model_fields.items()
                   if not f.is_required()}, **raw}

    event = filled(event, _Envelope)
    if event["harness"] is not None:
        event["harness"] = filled(event["harness"], Harness)
    event["payload"] = filled(event["payload"], PAYLOAD_MODELS[event["type"]])
    return event


def wait_for(predicate, *, timeout_s: float = 20.0, what: str = "condition", detail=None) -> None:
    """Poll ``predicate`` until true; on timeout, fail naming ``what`` and ``detail()`` (state to debug with)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {detail()}" if detail else ""))
        time.sleep(0.02)


def emitter_state(emitter: Emitter) -> dict:
    return {"produced": emitter.produced, "spooled": emitter.spooled, "replayed": emitter.replayed,
            "dropped": emitter.dropped, "invalid": emitter.invalid, "pending": emitter.pending,
            "broker_up": emitter.broker_up, "spool_events": emitter.spool.depth_records}


def read_topic(bootstrap_servers: str, topic: str, *, count: int, timeout_s: float = 30.0) -> list[dict]:
    """Every event on ``topic`` (all partitions, from the start) once ``count`` have arrived."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        out: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out.extend(wire_event(r.value) for r in records)
        # one more short poll: anything beyond ``count`` would be a duplicate
        for records in consumer.poll(timeout_ms=300).values():
            out.extend(wire_event(r.value) for r in records)
        return out
    finally:
        consumer.close()
