"""What a failure packet holds, and how one rollout's trajectory becomes one.

A packet is for a person or a model ("harness engineer") to read: the task's
constraints, the steps around the failure (the failing step marked), the
outcome and the harness identity. Everything in it comes from the rollout's
events (their own timestamps included); nothing from the wall clock, so the
same lake gives the same packets, byte for byte. ``packet_id`` is a hash of
the rest of the packet.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from store.trajectory import LlmCallStep, RewardStep, ToolStep, Trajectory, excerpt

ERROR_SIGNATURE_CHARS = 160
ERROR_CHARS = 1000
"""A step's error keeps its last this-many characters (a traceback ends with what went wrong)."""
INVALID_TOOL_CALL = re.compile(r"invalid|unknown tool|no such tool|not a tool|malformed|parse|json|argument", re.I)
"""A tool error that says the call itself was wrong (not the world): counted as an invalid tool call."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Harness(_Model):
    name: str | None
    version: str | None
    config_hash: str | None


class Signature(_Model):
    """What a failure looks like; rollouts with equal signatures form one cluster."""

    harness: Harness
    status: str
    reason: str | None
    """The rollout's status reason, normalised like ``error``."""
    failing_tool: str | None
    """Name of the failing tool step (None when the failing step is an LLM call or there is none)."""
    error: str | None
    """The failing step's error, normalised (ids, numbers, paths and quoted text replaced)."""
    finish_reason: str | None
    """Finish reason of the last LLM call up to the failing step (``length``: the step limit)."""


class PacketStep(_Model):
    """An action (LLM call) or observation (tool step), excerpted."""

    seq: int
    ts: str
    """The event's own timestamp (RFC 3339, UTC)."""
    kind: Literal["llm.call", "tool.call"]
    call_id: str
    name: str | None
    """Tool name, or the model of an LLM call."""
    input: str | None
    """Tool arguments, or the last message of the LLM prompt."""
    output: str | None
    """Tool result, or the LLM response text."""
    error: str | None
    finish_reason: str | None = None
    upstream_retries: int | None = None
    failing: bool = False


class Signals(_Model):
    """Counts over the whole rollout that hint at the cause."""

    llm_calls: int
    tool_calls: int
    tool_errors: int
    llm_errors: int
    invalid_tool_calls: int
    """Tool errors whose text says the call was malformed (see ``INVALID_TOOL_CALL``)."""
    unanswered_tool_calls: int
    upstream_retries: int
    """Retries the gateway made to the inference engine."""
    harness_retries: int
    """Requests the harness sent again (same idempotency key, new call id)."""
    step_limit_hit: bool
    """An LLM call stopped for ``length`` or the rollout ended ``truncated``."""


class Outcome(_Model):
    status: str
    reason: str | None
    steps: int | None
    reward: float | None
    """The reward by the extraction's reward rule (None: no reward)."""
    rewards: list[dict[str, Any]]
    """Every reward event in order: name, value, source (re-scores included)."""
    started_at: str | None
    finished_at: str | None


class RolloutPacket(_Model):
    """One failed rollout, ready to read."""

    packet_id: str
    kind: Literal["rollout"] = "rollout"
    signature: Signature
    tenant: str
    task_id: str
    rollout_id: str
    attempt: int
    policy_version: str | None
    constraints: list[dict[str, str]]
    """The task's first system and first user message (role, content), or the first prompt."""
    outcome: Outcome
    signals: Signals
    failing_step: PacketStep | None
    steps: list[PacketStep]
    """Steps around the failing step: up to N before it, it, and up to N after it."""


class ClusterPacket(_Model):
    """Rollouts that failed the same way, with the first of them (by rollout id) as the example."""

    packet_id: str
    kind: Literal["cluster"] = "cluster"
    signature: Signature
    rollouts: int
    rollout_ids: list[str]
    task_ids: list[str]
    mean_reward: float | None
    step_limit_hits: int
    example: RolloutPacket


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 text: the one serialisation packets are hashed and written in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_id(content: dict[str, Any], prefix: str = "fp") -> str:
    """``prefix-`` + the first 32 hex digits of the SHA-256 of the canonical JSON."""
    return f"{prefix}-{hashlib.sha256(canonical_json(content).encode()).hexdigest()[:32]}"


def with_id(model: type[RolloutPacket] | type[ClusterPacket], **content: Any) -> Any:
    """Build a packet whose ``packet_id`` is the hash of everything else in it."""
    draft = model.model_construct(packet_id="", **content).model_dump(mode="json", exclude={"packet_id"})
    return model(packet_id=content_id(draft), **content)


def normalise(text: str | None) -> str | None:
    """An error text reduced to its shape, so equal failures match across rollouts.

    Keeps the last non-empty line (a traceback ends with the exception), then
    replaces uuids, long hex, quoted text, paths and numbers.

    >>> normalise("Traceback ...\\nFileNotFoundError: '/tmp/a1.txt' missing after 3 tries")
    'FileNotFoundError: <str> missing after <n> tries'
    """
    if text is None:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    shape = lines[-1]
    for pattern, token in _SHAPES:
        shape = pattern.sub(token, shape)
    return excerpt(shape, ERROR_SIGNATURE_CHARS)


_SHAPES = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<id>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-]+){2,}"), "<path>"),
    (re.compile(r"\b(?:0x)?[0-9a-f]*\d[0-9a-f]{7,}\b", re.I), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
]


def build_packet(
    trajectory: Trajectory, *, reward: float | None, constraints: list[dict[str, str]], harness_retries: int,
    context: int,
) -> RolloutPacket:
    """The packet of one failed rollout; ``context`` steps either side of the failing step."""
    s = trajectory.summary
    actions = [step for step in trajectory.steps if isinstance(step, (LlmCallStep, ToolStep))]
    failing = failing_index(actions, truncated=s.status == "truncated")
    start, stop = (max(0, len(actions) - context), len(actions)) if failing is None else (
        max(0, failing - context), failing + context + 1)
    window = [_packet_step(step, failing=i == failing) for i, step in enumerate(actions) if start <= i < stop]
    failing_step = None if failing is None else actions[failing]
    llm_upto = [a for a in actions[: (len(actions) if failing is None else failing + 1)] if isinstance(a, LlmCallStep)]
    harness = Harness(name=s.harness_name, version=s.harness_version, config_hash=s.harness_config_hash)
    signature = Signature(
        harness=harness, status=s.status, reason=normalise(s.reason),
        failing_tool=failing_step.name if isinstance(failing_step, ToolStep) else None,
        error=normalise(failing_step.error) if failing_step is not None else None,
        finish_reason=llm_upto[-1].finish_reason if llm_upto else None,
    )
    rewards = [{"name": r.name, "value": r.value, "source": r.source}
               for r in trajectory.steps if isinstance(r, RewardStep)]
    outcome = Outcome(status=s.status, reason=s.reason, steps=s.steps, reward=reward, rewards=rewards,
                      started_at=_ts(s.started_at), finished_at=_ts(s.finished_at))
    return with_id(
        RolloutPacket, signature=signature, tenant=s.tenant, task_id=s.task_id, rollout_id=s.rollout_id,
        attempt=s.attempt, policy_version=s.policy_version, constraints=constraints, outcome=outcome,
        signals=_signals(actions, truncated=s.status == "truncated", harness_retries=harness_retries),
        failing_step=None if failing is None else _packet_step(actions[failing], failing=True), steps=window,
    )


def failing_index(actions: list[LlmCallStep | ToolStep], *, truncated: bool) -> int | None:
    """Which step failed, by the first rule that finds one (None when there are no steps).

    1. the last step with an error (tool or LLM); 2. the last LLM call that
    stopped for ``length`` (or the last call of a truncated rollout); 3. the
    last tool call without a result; 4. the last step.
    """
    last = _last(actions, lambda a: a.error is not None)
    if last is None:
        last = _last(actions, lambda a: isinstance(a, LlmCallStep) and a.finish_reason == "length")
    if last is None and truncated:
        last = _last(actions, lambda a: isinstance(a, LlmCallStep))
    if last is None:
        last = _last(actions, lambda a: isinstance(a, ToolStep) and not a.has_result)
    return last if last is not None or not actions else len(actions) - 1


def _last(actions: list[Any], predicate: Any) -> int | None:
    return next((i for i in range(len(actions) - 1, -1, -1) if predicate(actions[i])), None)


def _signals(actions: list[LlmCallStep | ToolStep], *, truncated: bool, harness_retries: int) -> Signals:
    tools = [a for a in actions if isinstance(a, ToolStep)]
    calls = [a for a in actions if isinstance(a, LlmCallStep)]
    return Signals(
        llm_calls=len(calls), tool_calls=len(tools),
        tool_errors=sum(t.error is not None for t in tools), llm_errors=sum(c.error is not None for c in calls),
        invalid_tool_calls=sum(t.error is not None and bool(INVALID_TOOL_CALL.search(t.error)) for t in tools),
        unanswered_tool_calls=sum(not t.has_result for t in tools),
        upstream_retries=sum(c.upstream_retries or 0 for c in calls), harness_retries=harness_retries,
        step_limit_hit=truncated or any(c.finish_reason == "length" for c in calls),
    )


def _packet_step(step: LlmCallStep | ToolStep, *, failing: bool) -> PacketStep:
    if isinstance(step, ToolStep):
        return PacketStep(seq=step.seq, ts=_ts(step.ts), kind="tool.call", call_id=step.call_id, name=step.name,
                          input=step.arguments_excerpt, output=step.result_excerpt, error=tail(step.error),
                          failing=failing)
    return PacketStep(seq=step.seq, ts=_ts(step.ts), kind="llm.call", call_id=step.call_id, name=step.model,
                      input=step.prompt_excerpt, output=step.text_excerpt, error=tail(step.error),
                      finish_reason=step.finish_reason, upstream_retries=step.upstream_retries, failing=failing)


def tail(text: str | None, chars: int = ERROR_CHARS) -> str | None:
    """The last ``chars`` characters of ``text``, with a leading ellipsis when cut.

    >>> tail("Traceback: a long story\\nValueError: bad", 16)
    '…ValueError: bad'
    """
    if text is None or len(text) <= chars:
        return text
    return "…" + text[len(text) - chars + 1:]


def _ts(value: Any) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def first_messages(messages_json: str | None, prompt: str | None, *, chars: int) -> list[dict[str, str]]:
    """The first system and first user message of a request (role, content excerpt), else its prompt."""
    found: dict[str, str] = {}
    try:
        messages = json.loads(messages_json) if messages_json else []
    except ValueError:
        messages = []
    for message in messages if isinstance(messages, list) else []:
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "user") and role not in found:
            content = message.get("content")
            found[role] = content if isinstance(content, str) else canonical_json(content)
    if not found and prompt:
        found["prompt"] = prompt
    return [{"role": role, "content": excerpt(found[role], chars) or ""}
            for role in ("system", "user", "prompt") if role in found]
