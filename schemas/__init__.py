"""The wire contract (events) and the table schemas of trajlake.

The names below load on first use, so that ``import schemas.errors`` (every command does) does not build the
event models.
"""

from __future__ import annotations

from schemas.lazy import lazy_exports

_MODULES = {
    "schemas.errors": ("InvalidEvent",),
    "schemas.events": ("DEFAULT_TOPIC", "EVENT_TYPES", "Event", "Harness", "LlmRequest", "LlmRequestEvent",
                       "LlmResponse", "LlmResponseEvent", "Reward", "RewardEvent", "RolloutFinished",
                       "RolloutFinishedEvent", "RolloutStarted", "RolloutStartedEvent", "ToolCall", "ToolCallEvent",
                       "ToolResult", "ToolResultEvent"),
    "schemas.versions": ("MAX_EVENT_BYTES", "SCHEMA_VERSION", "decode_event", "validate_event"),
}
__getattr__, __all__ = lazy_exports(__name__, _MODULES)
