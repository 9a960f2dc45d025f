"""The wire contract: one JSON object per Kafka message, key = rollout_id.

Every event is an envelope (identity, ordering, harness) plus a payload typed
by ``type``. Non-Python producers write this directly; ``schemas/EVENTS.md``
documents it field for field. Adding an optional field does not bump
``SCHEMA_VERSION``; a breaking change does, and ``schemas.versions`` upgrades
every older version the ingester ever accepted. A field at its default may be
left out (the reader fills it in): the gateway and the SDK write events
without them (``omit_defaults``; ``model_dump_json(exclude_defaults=True)``).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    FieldSerializationInfo,
    TypeAdapter,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)

from schemas import compact_logprobs

from schemas.options import DEFAULT_TOPIC  # noqa: F401  (the wire contract's topic; defined with the options)

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?")
"""Date and time; the offset is checked after parsing, to name a missing one precisely."""
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLOAT32_LIMIT = 2.0**128 - 2.0**103
"""Magnitudes from here up round to infinity as float32, the lake's logprobs type: a finite double such as -1e39 (or
``-sys.float_info.max`` standing in for minus infinity) would be stored as -inf and reach training."""

TokenIds = list[StrictInt]
"""Token ids exactly as the engine sampled them (stored as list<int32>); strings are refused."""


def _json_number(v: Any) -> Any:
    # pydantic's lax float takes "0.5" and True; a producer sending those has a bug worth naming.
    if isinstance(v, (str, bool)):
        raise ValueError(f"must be a JSON number, got {type(v).__name__}")
    return v


Number = Annotated[float, BeforeValidator(_json_number)]
"""A float that must arrive as a number (not a string or a boolean); finite, as every float here (``_Model``)."""


def _compact_logprobs(v: Any) -> Any:
    return compact_logprobs.decode(v) if isinstance(v, str) else v


Logprob = Annotated[Number, Field(gt=-FLOAT32_LIMIT, lt=FLOAT32_LIMIT)]
"""A logprob the lake's float32 column holds as a finite number."""
Logprobs = Annotated[list[Logprob], BeforeValidator(_compact_logprobs), WithJsonSchema({"anyOf": [
    {"type": "array", "items": {"type": "number"}},
    {"type": "string", "contentEncoding": "base64",
     "description": "the compact form: base64 of the values as little-endian float32"}]})]
"""One logprob per response token: JSON numbers, or the compact form (``schemas.compact_logprobs``), read as the
same numbers."""
COMPACT_LOGPROBS = "compact_logprobs"
"""``model_dump_json(context={COMPACT_LOGPROBS: True})`` writes logprobs in the compact form where it is exact."""


def _check_token_ids(ids: list[int] | None) -> list[int] | None:
    if ids and (min(ids) < 0 or max(ids) > INT32_MAX):
        raise ValueError(f"token ids must lie in [0, {INT32_MAX}]")
    return ids


class _Model(BaseModel):
    # Unknown fields are ignored so that an older reader accepts events that
    # carry optional fields added later (no schema_version bump for those).
    # Every float field must be finite: NaN and +-Infinity (literals, or numbers
    # such as 1e400 that overflow) are refused with the field named.
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)


class Harness(_Model):
    """Identity of the harness that produced the rollout: part of the policy."""

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=200)
    config_hash: str | None = Field(default=None, max_length=200)


# ---------------------------------------------------------------- payloads


class RolloutStarted(_Model):
    """A rollout (one attempt at one task) began."""

    group_id: str | None = None
    """GRPO group; None means the task_id."""
    policy_version: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


RolloutStatus = Literal["succeeded", "failed", "truncated", "cancelled"]


class RolloutFinished(_Model):
    """A rollout ended; ``steps`` counts the agent's steps."""

    status: RolloutStatus
    reason: str | None = None
    steps: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)


class LlmRequest(_Model):
    """What the harness asked the engine, with the prompt's exact token ids.

    A reference stores a rollout's history once: ``extends_call_id`` names an
    earlier call of the same tenant and rollout, and one or more of
    ``extends_tokens`` (how many leading ids of that call's full prompt +
    sampled response ids this prompt shares; ``prompt_token_ids`` holds only
    the ids after them), ``extends_messages`` (how many leading messages of
    that call's full messages this call's messages start with; ``messages``
    holds only the ones after them) and ``extends_tools`` (the tools are that
    call's full tools; ``tools`` is null) say what is shared. The full prompt
    is ``(full prompt of extends_call_id + its response ids)[:extends_tokens]
    + prompt_token_ids``; the full messages ``(full messages of
    extends_call_id + [its answer])[:extends_messages] + messages``, the
    answer being the harness's echo of that call's response in the openai
    client's layout (``schemas.answer_message``).
    """

    call_id: str = Field(min_length=1, max_length=200)
    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    """Plain-text prompt of a /v1/completions call (chat calls use ``messages``)."""
    tools: list[dict[str, Any]] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    prompt_token_ids: TokenIds | None = None
    tokenizer: str | None = None
    chat_template_hash: str | None = None
    idempotency_key: str | None = None
    extends_call_id: str | None = Field(default=None, min_length=1, max_length=200)
    """The earlier call of this rollout whose ids this prompt starts with (a prefix reference)."""
    extends_tokens: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    """How many leading ids it shares with that call's prompt + response ids; ``prompt_token_ids`` holds the rest."""
    extends_messages: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    """How many leading messages it shares with that call's full messages, then its answer (one more: the echo of
    that call's response, ``schemas.answer_message``); ``messages`` holds the rest."""
    extends_tools: Literal[True] | None = None
    """True: the tools are that call's full tools (``tools`` is then null)."""

    _ids = field_validator("prompt_token_ids")(_check_token_ids)

    @model_validator(mode="after")
    def _reference(self) -> LlmRequest:
        problem = reference_problem(self)
        if problem:
            raise ValueError(problem)
        return self


def reference_problem(request: Any, *, ids_sent: bool | None = None) -> str | None:
    """Why a request's reference is invalid, None when it is fine (both contract paths use this).

    ``request`` has the fields of ``LlmRequest``; ``ids_sent`` overrides ``prompt_token_ids is not None``
    (the raw fast path reads ids as an unparsed slice).
    """
    call_id, extends = request.extends_call_id, (request.extends_tokens, request.extends_messages,
                                                 request.extends_tools)
    if call_id is None:
        if any(part is not None for part in extends):
            return ("extends_tokens, extends_messages and extends_tools need extends_call_id: name the earlier call "
                    "of the rollout they refer to")
        return None
    if all(part is None for part in extends):
        return ("extends_call_id needs extends_tokens, extends_messages or extends_tools: say what the call shares "
                "with it, or leave it out")
    if call_id == request.call_id:
        return "extends_call_id names the call itself: a reference must name an earlier call of the rollout"
    has_ids = request.prompt_token_ids is not None if ids_sent is None else ids_sent
    if request.extends_tokens is not None and not has_ids:
        return "a prefix reference needs prompt_token_ids (the ids after the shared prefix; [] when there are none)"
    if request.extends_messages is not None and request.messages is None:
        return "extends_messages needs messages (the messages after the shared ones; [] when there are none)"
    if request.extends_tools is not None and request.tools is not None:
        return "extends_tools means the tools are the referenced call's: send tools null with it, or leave it out"
    return None


TokenSource = Literal["engine", "retokenized", "none"]


class LlmResponse(_Model):
    """What the engine returned: sampled token ids and one logprob per token."""

    call_id: str = Field(min_length=1, max_length=200)
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    response_token_ids: TokenIds | None = None
    logprobs: Logprobs | None = None
    """One per response token; on the wire JSON numbers or base64 float32 (``schemas.compact_logprobs``)."""
    token_source: TokenSource = "none"
    usage: dict[str, Any] | None = None
    latency_ms: Number | None = Field(default=None, ge=0)
    upstream_retries: StrictInt = Field(default=0, ge=0, le=INT32_MAX)
    policy_version: str | None = None
    error: str | None = None

    _ids = field_validator("response_token_ids")(_check_token_ids)

    @field_serializer("logprobs", when_used="json")
    def _logprobs_out(self, logprobs: list[float] | None, info: FieldSerializationInfo) -> list[float] | str | None:
        if logprobs and info.context and info.context.get(COMPACT_LOGPROBS):
            return compact_logprobs.encode(logprobs) or logprobs
        return logprobs

    @model_validator(mode="after")
    def _logprobs_match_tokens(self) -> LlmResponse:
        if self.logprobs is not None and self.response_token_ids is not None:
            if len(self.logprobs) != len(self.response_token_ids):
                raise ValueError(
                    f"logprobs has {len(self.logprobs)} entries but response_token_ids has "
                    f"{len(self.response_token_ids)}: send one logprob per response token"
                )
        if self.token_source == "engine" and self.response_token_ids is None:
            raise ValueError("token_source 'engine' needs response_token_ids")
        return self


class ToolCall(_Model):
    """The agent invoked a tool."""

    call_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    arguments: Any = None


class ToolResult(_Model):
    """A tool returned; ``state_changed`` is evidence that the action changed the world."""

    call_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    result: Any = None
    error: str | None = None
    duration_ms: Number | None = Field(default=None, ge=0)
    state_changed: bool | None = None


class Reward(_Model):
    """A scalar reward for the rollout; may arrive late, several per rollout."""

    name: str = Field(min_length=1, max_length=200)
    value: Number
    source: str | None = None


# ---------------------------------------------------------------- envelope


class _Envelope(_Model):
    event_id: str = Field(min_length=1, max_length=200)
    """Producer-assigned, globally unique (UUIDv7 suggested): the dedupe key."""
    schema_version: int
    ts: datetime
    """RFC 3339 timestamp at the producer; stored in UTC."""
    tenant: str = Field(default="default", min_length=1, max_length=200)
    task_id: str = Field(min_length=1, max_length=500)
    rollout_id: str = Field(min_length=1, max_length=500)
    attempt: StrictInt = Field(default=0, ge=0, le=INT32_MAX)
    seq: StrictInt = Field(ge=0, le=INT64_MAX)
    span_id: str | None = None
    parent_span_id: str | None = None
    harness: Harness | None = None

    @field_validator("ts", mode="before")
    @classmethod
    def _rfc3339(cls, v: Any) -> Any:
        # Parsed here, not by pydantic: its strict JSON mode (the ingester's fast
        # path) refuses a str that a before-validator hands on.
        if isinstance(v, datetime):
            return v
        if isinstance(v, str) and _RFC3339.fullmatch(v):
            try:
                return datetime.fromisoformat(v.upper())
            except ValueError as exc:
                raise ValueError(f"not a valid RFC 3339 timestamp: {exc}") from None
        shown = repr(v) if isinstance(v, str) else type(v).__name__
        raise ValueError(f"must be an RFC 3339 string such as 2026-01-01T00:00:00Z, got {shown[:60]}")

    @field_validator("ts")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("timestamp needs a UTC offset, e.g. 2026-01-01T00:00:00Z")
        try:
            return v.astimezone(timezone.utc)
        except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 falls before year 1 in UTC
            raise ValueError("timestamp out of range once converted to UTC") from None


class RolloutStartedEvent(_Envelope):
    type: Literal["rollout.started"]
    payload: RolloutStarted


class RolloutFinishedEvent(_Envelope):
    type: Literal["rollout.finished"]
    payload: RolloutFinished


class LlmRequestEvent(_Envelope):
    type: Literal["llm.request"]
    payload: LlmRequest


class LlmResponseEvent(_Envelope):
    type: Literal["llm.response"]
    payload: LlmResponse


class ToolCallEvent(_Envelope):
    type: Literal["tool.call"]
    payload: ToolCall


class ToolResultEvent(_Envelope):
    type: Literal["tool.result"]
    payload: ToolResult


class RewardEvent(_Envelope):
    type: Literal["reward"]
    payload: Reward


Event = Annotated[
    Union[
        RolloutStartedEvent,
        RolloutFinishedEvent,
        LlmRequestEvent,
        LlmResponseEvent,
        ToolCallEvent,
        ToolResultEvent,
        RewardEvent,
    ],
    Field(discriminator="type"),
]

EVENT_TYPES: tuple[str, ...] = (
    "rollout.started",
    "rollout.finished",
    "llm.request",
    "llm.response",
    "tool.call",
    "tool.result",
    "reward",
)

PAYLOAD_MODELS: dict[str, type[_Model]] = {
    "rollout.started": RolloutStarted,
    "rollout.finished": RolloutFinished,
    "llm.request": LlmRequest,
    "llm.response": LlmResponse,
    "tool.call": ToolCall,
    "tool.result": ToolResult,
    "reward": Reward,
}

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def omit_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw``, a valid event of the current version as JSON values, without the fields a reader fills in when they
    are absent: envelope, ``harness`` and payload fields whose value is their default (``null``, ``0``,
    ``"default"``, ``{}``, ``"none"``), same JSON type. Everything else, unknown fields included, is kept as given,
    so the event reads back the same. What ``model_dump_json(exclude_defaults=True)`` does for a model.

    >>> omit_defaults({"type": "reward", "attempt": 0, "span_id": None, "payload": {"name": "r", "source": None}})
    {'type': 'reward', 'payload': {'name': 'r'}}
    """
    out = _without_defaults(raw, _Envelope)
    if isinstance(out.get("harness"), Mapping):
        out["harness"] = _without_defaults(out["harness"], Harness)
    model = PAYLOAD_MODELS.get(out.get("type"))  # type: ignore[arg-type]
    if model is not None and isinstance(out.get("payload"), Mapping):
        out["payload"] = _without_defaults(out["payload"], model)
    return out


def _without_defaults(raw: Mapping[str, Any], model: type[_Model]) -> dict[str, Any]:
    fields = model.model_fields
    return {name: value for name, value in raw.items() if not (
        name in fields and not fields[name].is_required()
        and type(value) is type(default := fields[name].get_default(call_default_factory=True)) and value == default)}
