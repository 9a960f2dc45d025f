"""The wire contract (events) and the table schemas of trajlake.

The names below load on first use, so that ``import schemas.errors`` (every command does) does not build the
event models.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_MODULES = {
    "schemas.errors": ("InvalidEvent",),
    "schemas.events": ("DEFAULT_TOPIC", "EVENT_TYPES", "Event", "Harness", "LlmRequest", "LlmRequestEvent",
                       "LlmResponse", "LlmResponseEvent", "Reward", "RewardEvent", "RolloutFinished",
                       "RolloutFinishedEvent", "RolloutStarted", "RolloutStartedEvent", "ToolCall", "ToolCallEvent",
                       "ToolResult", "ToolResultEvent"),
    "schemas.versions": ("MAX_EVENT_BYTES", "SCHEMA_VERSION", "decode_event", "validate_event"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
