"""A msgspec mirror of the wire contract: the ingester's fast decode path.

Why two definitions of one contract: ``schemas.events`` (pydantic) is the
contract. It upgrades old versions, accepts what lax validation accepts and
names every problem precisely, which quarantine needs. It was also the
ingester's largest cost: 59 us of CPU per 4 KB token-heavy workload event
(bench/ingest/stages.py, collector paused). The Structs here check the same
rules in one C pass in 19 us, but only answer "valid at the current version, here are the values" or "no". The
ingester decodes a batch with ``decode_batch`` and sends every message it
refuses (and every other ``schema_version``) through
``schemas.versions.decode_event``, which accepts it or says why not, so
quarantine reasons stay exactly what the pydantic models say.

The fast path may refuse more than the contract does (a bool sent as ``1``);
it must never accept what the contract refuses nor read a value differently.
Two things msgspec does not read: the strings of unknown fields (so a message that is not UTF-8 is refused before
msgspec sees it, ``is_utf8``) and their numbers: an integer past Python's 4,300-digit conversion limit inside an
unknown field is accepted here (the field is dropped, never stored) where the contract's text path refuses the
message as not valid JSON; the one known difference.
Non-finite floats, which the contract refuses in every float field, never
decode here: msgspec's JSON reader refuses ``NaN``/``Infinity`` literals and
numbers that overflow a double (``1e400``), so no Struct checks finiteness. ``tests/schemas/test_fast_decode.py`` holds the two in sync:
same fields, required-ness, type families and bounds; same verdicts on the
workload and on every invalid case; byte-identical ``events`` rows. Change
both files together. (``ts`` is the one deliberate difference: taken as text
and parsed in ``_finish`` exactly as the contract parses it; the batch path,
``schemas.fast_tokens``, reads the usual spelling for the whole batch at once.)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import Meta

from schemas import versions
from schemas.events import _RFC3339, FLOAT32_LIMIT, INT32_MAX, INT64_MAX, reference_problem
from schemas.versions import MAX_EVENT_BYTES

Id = Annotated[str, Meta(min_length=1, max_length=200)]
LongId = Annotated[str, Meta(min_length=1, max_length=500)]
Int32 = Annotated[int, Meta(ge=0, le=INT32_MAX)]
TokenIds = list[Int32]
NonNegative = Annotated[float, Meta(ge=0)]
Json = dict[str, Any]


class _Struct(msgspec.Struct, gc=False):
    """Unknown fields are ignored (msgspec's default), as in the pydantic models; fields are keyword-only
    (``kw_only`` is per class in msgspec, so every subclass repeats it).

    ``gc=False``: decoded JSON holds no reference cycles, and skipping the
    cycle collector's tracking saves time per event.
    """


class Harness(_Struct, kw_only=True):
    name: Id
    version: Id
    config_hash: Annotated[str, Meta(max_length=200)] | None = None


class RolloutStarted(_Struct, kw_only=True):
    group_id: str | None = None
    policy_version: str | None = None
    metadata: Json = {}


class RolloutFinished(_Struct, kw_only=True):
    status: Literal["succeeded", "failed", "truncated", "cancelled"]
    reason: str | None = None
    steps: Int32 | None = None


class LlmRequest(_Struct, kw_only=True):
    call_id: Id
    model: str | None = None
    messages: list[Json] | None = None
    prompt: str | None = None
    tools: list[Json] | None = None
    params: Json = {}
    prompt_token_ids: TokenIds | None = None
    tokenizer: str | None = None
    chat_template_hash: str | None = None
    idempotency_key: str | None = None
    extends_call_id: Id | None = None
    extends_tokens: Int32 | None = None
    extends_messages: Int32 | None = None
    extends_tools: Literal[True] | None = None

    def __post_init__(self) -> None:
        if self.extends_call_id is not None or self.extends_tokens is not None or self.extends_messages is not None \
                or self.extends_tools is not None:
            problem = reference_problem(self)
            if problem:
                raise ValueError(problem)


class LlmResponse(_Struct, kw_only=True):
    call_id: Id
    text: str | None = None
    tool_calls: list[Json] | None = None
    finish_reason: str | None = None
    response_token_ids: TokenIds | None = None
    logprobs: list[Annotated[float, Meta(gt=-FLOAT32_LIMIT, lt=FLOAT32_LIMIT)]] | None = None
    token_source: Literal["engine", "retokenized", "none"] = "none"
    usage: Json | None = None
    latency_ms: NonNegative | None = None
    upstream_retries: Int32 = 0
    policy_version: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        ids, logprobs = self.response_token_ids, self.logprobs
        if logprobs is not None and ids is not None and len(logprobs) != len(ids):
            raise ValueError("one logprob per response token")
        if self.token_source == "engine" and ids is None:
            raise ValueError("token_source 'engine' needs response_token_ids")


class ToolCall(_Struct, kw_only=True):
    call_id: Id
    name: Id
    arguments: Any = None


class ToolResult(_Struct, kw_only=True):
    call_id: Id
    name: Id
    result: Any = None
    error: str | None = None
    duration_ms: NonNegative | None = None
    state_changed: bool | None = None


class Reward(_Struct, kw_only=True):
    name: Id
    value: float
    source: str | None = None


class _Envelope(_Struct, kw_only=True, tag_field="type"):
    """``ts`` arrives as a string and is replaced by its UTC datetime in ``decode_batch``."""

    type: ClassVar[str]
    event_id: Id
    schema_version: int
    ts: str
    tenant: Id = "default"
    task_id: LongId
    rollout_id: LongId
    attempt: Int32 = 0
    seq: Annotated[int, Meta(ge=0, le=INT64_MAX)]
    span_id: str | None = None
    parent_span_id: str | None = None
    harness: Harness | None = None


class RolloutStartedEvent(_Envelope, kw_only=True, tag="rollout.started"):
    type: ClassVar[str] = "rollout.started"
    payload: RolloutStarted


class RolloutFinishedEvent(_Envelope, kw_only=True, tag="rollout.finished"):
    type: ClassVar[str] = "rollout.finished"
    payload: RolloutFinished


class LlmRequestEvent(_Envelope, kw_only=True, tag="llm.request"):
    type: ClassVar[str] = "llm.request"
    payload: LlmRequest


class LlmResponseEvent(_Envelope, kw_only=True, tag="llm.response"):
    type: ClassVar[str] = "llm.response"
    payload: LlmResponse


class ToolCallEvent(_Envelope, kw_only=True, tag="tool.call"):
    type: ClassVar[str] = "tool.call"
    payload: ToolCall


class ToolResultEvent(_Envelope, kw_only=True, tag="tool.result"):
    type: ClassVar[str] = "tool.result"
    payload: ToolResult


class RewardEvent(_Envelope, kw_only=True, tag="reward"):
    type: ClassVar[str] = "reward"
    payload: Reward


FastEvent = Union[
    RolloutStartedEvent, RolloutFinishedEvent, LlmRequestEvent, LlmResponseEvent, ToolCallEvent, ToolResultEvent,
    RewardEvent,
]

EVENT_STRUCTS: dict[str, type[_Envelope]] = {cls.type: cls for cls in FastEvent.__args__}
"""Event type -> its Struct (mirrors ``schemas.events``' discriminated union)."""

_DECODER = msgspec.json.Decoder(FastEvent)


def decode_batch(values: Sequence[bytes | None], *, max_bytes: int = MAX_EVENT_BYTES) -> list[FastEvent | None]:
    """Decode raw wire events; None where the fast path refuses (send those to ``decode_event``).

    >>> [event] = decode_batch([b'{"type": "reward", ...}'])  # doctest: +SKIP
    """
    out: list[FastEvent | None] = []
    for raw in values:
        event = None
        if raw is not None and len(raw) <= max_bytes and is_utf8(raw):
            try:
                event = _DECODER.decode(raw)
            except (msgspec.MsgspecError, ValueError, RecursionError):  # ValueError: invalid UTF-8 in a string
                pass
            else:
                event = _finish(event)
        out.append(event)
    return out


def is_utf8(raw: bytes) -> bool:
    """Whether ``raw`` is UTF-8 text: msgspec checks the strings it reads, not the ones it skips (unknown fields),
    and the contract refuses a message that is not UTF-8 anywhere. ASCII (what ``json.dumps`` writes) costs a scan."""
    if raw.isascii():
        return True
    try:
        raw.decode()
        return True
    except UnicodeDecodeError:
        return False


def _finish(event: FastEvent) -> FastEvent | None:
    """The checks msgspec cannot express: current version, and ``ts`` parsed as ``schemas.events`` parses it."""
    if not is_current(event):
        return None
    parsed = parse_ts(event.ts)
    if parsed is None:
        return None
    event.ts = parsed
    return event


def is_current(event: FastEvent) -> bool:
    """Whether the event is at the schema version this reader is built for (older ones need the upgrade chain)."""
    return event.schema_version == versions.SCHEMA_VERSION  # read at call time, not import time


def parse_ts(ts: str) -> datetime | None:
    """``ts`` as the contract reads it (UTC), or None where the contract refuses it."""
    if not _RFC3339.fullmatch(ts):
        return None
    try:
        parsed = datetime.fromisoformat(ts.upper())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:  # year 1 with a positive offset, year 9999 with a negative one
        return None
