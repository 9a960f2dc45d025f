"""``POST /v1/events``: batches of wire events from harnesses that are not written in Python.

Body: ``{"events": [event, ...]}`` (or a bare list), each event in the wire
contract (``schemas/EVENTS.md``). The tenant of every event is the API key's:
a ``tenant`` in the body is overwritten. Each event is validated on its own
and gets its own result; the accepted ones are answered only once they are
durable (acknowledged by Kafka or fsynced to the spool).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from ingest.gateway.bodies import parse_object
from ingest.gateway.emitter import Emitter
from ingest.gateway.errors import BadRequest, EventsRefused
from ingest.rejected import RejectedInput
from schemas.errors import InvalidEvent
from schemas.events import Event
from schemas.versions import MAX_EVENT_BYTES, validate_event

MAX_BATCH_EVENTS = 1000


@dataclass(frozen=True)
class EventResult:
    index: int
    status: str
    """``accepted`` or ``rejected``."""
    event_id: str | None
    error: str | None = None


@dataclass(frozen=True)
class BatchResult:
    accepted: int
    rejected: int
    results: list[EventResult]


def _items(raw: bytes) -> list[Any]:
    body = parse_object(raw)
    items = body.get("events") if isinstance(body, dict) else body
    if not isinstance(items, list):
        raise BadRequest("body must be {\"events\": [...]} or a JSON list of events", param="events")
    if len(items) > MAX_BATCH_EVENTS:
        raise BadRequest(f"{len(items)} events in one batch; send at most {MAX_BATCH_EVENTS}", param="events")
    return items


def _check(index: int, item: Any, tenant: str) -> Event | EventResult:
    event_id = item.get("event_id") if isinstance(item, dict) else None
    event_id = event_id if isinstance(event_id, str) else None
    if not isinstance(item, dict):
        return EventResult(index, "rejected", None, f"(event): must be a JSON object, got {type(item).__name__}")
    size = len(json.dumps(item, separators=(",", ":"), default=str))
    if size > MAX_EVENT_BYTES:
        return EventResult(index, "rejected", event_id, f"(event): {size} bytes exceeds the {MAX_EVENT_BYTES}-byte limit")
    try:
        return validate_event({**item, "tenant": tenant})
    except InvalidEvent as exc:
        return EventResult(index, "rejected", event_id, str(exc))


async def emit_durably(events: list[Event | RejectedInput], *, emitter: Emitter) -> None:
    """Hand validated events (or inputs to quarantine, ``ingest.rejected``) to the emitter; return once they are durable, else raise ``EventsRefused``."""
    if not events:
        return
    loop = asyncio.get_running_loop()
    durable: asyncio.Future[bool] = loop.create_future()
    emitter.submit(lambda: events, on_durable=lambda ok: loop.call_soon_threadsafe(durable.set_result, ok))
    if not await durable:
        raise EventsRefused("the gateway's event spool is full (broker unreachable for long): retry later")


async def ingest_batch(raw: bytes, *, tenant: str, emitter: Emitter) -> BatchResult:
    """Validate each event, hand the valid ones to the emitter, wait until they are durable."""
    items = _items(raw)
    if emitter.spool_full:
        raise EventsRefused("the gateway's event spool is full (broker unreachable for long): retry later")
    results: list[EventResult] = []
    valid: list[Event] = []
    for index, item in enumerate(items):
        checked = _check(index, item, tenant)
        if isinstance(checked, EventResult):
            results.append(checked)
        else:
            valid.append(checked)
            results.append(EventResult(index, "accepted", checked.event_id))
    await emit_durably(valid, emitter=emitter)
    accepted = len(valid)
    return BatchResult(accepted=accepted, rejected=len(results) - accepted, results=results)
