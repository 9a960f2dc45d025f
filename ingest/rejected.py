"""Inputs a producer already knows are not events, sent on for quarantine with the producer's reason.

The gateway cannot map some OTLP spans to events (unknown operation, malformed
attributes). Rather than only answering the exporter, it sends each such span
to the events topic wrapped in an envelope: ``{"trajlake_rejected": {"field",
"problem"}, "tenant", "rollout_id", "input"}``, keyed by the rollout id. The
ingester quarantines any message in that envelope with the producer's field
and problem instead of validating it (``schemas/EVENTS.md``, Invalid events),
so such inputs are kept and found like any invalid event, and ``forget`` finds
them by tenant and rollout.

>>> RejectedInput("acme", "r-1", "(span)", "unsupported operation", {"name": "x"}).record()[0]
b'r-1'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ingest.redaction import Redactor
from schemas.errors import InvalidEvent
from schemas.versions import MAX_EVENT_BYTES

REJECTED = "trajlake_rejected"
_MARK = REJECTED.encode()


@dataclass(frozen=True)
class RejectedInput:
    """One input to quarantine, with why; ``record()`` is its Kafka (key, value)."""

    tenant: str
    rollout_id: str
    field: str
    problem: str
    input: Any
    """The input as JSON-able data (an OTLP span as a dict)."""
    redactor: Redactor | None = None
    """Pattern rules run over the encoded value (as the ingester does over a quarantined input)."""

    def record(self) -> tuple[bytes, bytes]:
        """Key = rollout id; value = the envelope, its input left out when it would pass the event size limit."""
        doc = {REJECTED: {"field": self.field, "problem": self.problem}, "tenant": self.tenant,
               "rollout_id": self.rollout_id, "input": self.input}
        value = _compact(doc)
        if len(value) > MAX_EVENT_BYTES:
            doc["input"] = f"(left out: {len(value)} bytes, over the {MAX_EVENT_BYTES}-byte event limit)"
            value = _compact(doc)
        return self.rollout_id.encode(), value if self.redactor is None else self.redactor.redact_raw(value)

    def redacted(self, redactor: Redactor) -> RejectedInput:
        """With ``redactor``'s rules applied to the value; the same object when no rule matches."""
        value = self.record()[1]
        return self if redactor.redact_raw(value) is value else replace(self, redactor=redactor)


def _compact(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def producer_rejection(raw: bytes | None) -> InvalidEvent | None:
    """The producer's reason when ``raw`` is a ``RejectedInput`` envelope, else None (validate it as an event)."""
    if not raw or _MARK not in raw:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    reason = doc.get(REJECTED) if isinstance(doc, dict) else None
    if not isinstance(reason, dict):
        return None
    field, problem = reason.get("field"), reason.get("problem")
    if not isinstance(field, str) or not isinstance(problem, str):
        return None
    field, problem = (text.encode("utf-8", "backslashreplace").decode() for text in (field, problem))  # "\ud800"
    return InvalidEvent(field, f"rejected by the producer: {problem}")
