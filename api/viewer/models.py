"""Response models of the viewer's JSON endpoints (``/v1/viewer/...``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from store.trajectory import Trajectory


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class RolloutRow(_Model):
    """One line of the rollout list."""

    rollout_id: str
    task_id: str
    harness_name: str | None
    harness_version: str | None
    status: str
    reward: float | None
    n_llm_calls: int
    n_tool_calls: int
    n_response_tokens: int
    llm_latency_ms: float | None
    started_at: datetime | None


class RolloutRows(_Model):
    """A page of the rollout list, newest first."""

    items: list[RolloutRow]
    limit: int
    offset: int
    next_offset: int | None


class Facets(_Model):
    """The values the list's filters offer."""

    harnesses: list[str]
    """``NAME@VERSION`` of every harness the tenant's rollouts name."""
    statuses: list[str]
    n_rollouts: int


class CallText(_Model):
    """An LLM call's full request and response (each text cut at ``MAX_TEXT_CHARS``)."""

    call_id: str
    messages: str | None
    """JSON text of the chat messages, as the harness sent them."""
    prompt: str | None
    text: str | None
    tool_calls: str | None
    truncated: bool


class ToolText(_Model):
    """A tool step's full arguments and result (each cut at ``MAX_TEXT_CHARS``)."""

    call_id: str
    arguments: str | None
    result: str | None
    truncated: bool


class TokenBlock(_Model):
    """A run of tokens: one merged sample (from a dataset) or one call's prompt + response (no dataset).

    ``mask`` is 1 on trained tokens (dataset) or sampled response tokens (no dataset), 0 on context.
    """

    index: int
    start_reason: str
    """``first`` or the mismatch class that started a new sample; ``call`` for a call block."""
    call_ids: list[str]
    ids: list[int]
    mask: list[int]
    pieces: list[str] | None
    """Decoded text of each token, when the viewer has a tokenizer."""
    truncated: bool
    """The block was cut at the viewer's token cap."""


class TokenView(_Model):
    """Where the rollout's tokens come from and the blocks to draw."""

    source: Literal["dataset", "calls", "none"]
    dataset: str | None
    version: int | None
    blocks: list[TokenBlock]
    n_tokens: int
    n_masked: int
    """Tokens with mask 1 over every block (before any cut)."""
    note: str
    """What the view shows, in words (e.g. that no dataset contains the rollout)."""


class RolloutDetail(_Model):
    """Everything the rollout page draws."""

    trajectory: Trajectory
    calls: list[CallText]
    tools: list[ToolText]
    tokens: TokenView


class SuccessPoint(_Model):
    """One bucket of one harness version: rollouts ended, succeeded, rate and its Wilson interval."""

    bucket: datetime
    n: int
    succeeded: int
    rate: float
    low: float
    high: float


class SuccessSeries(_Model):
    harness: str
    """``NAME@VERSION``."""
    points: list[SuccessPoint]


class SuccessChart(_Model):
    """Success rate by harness version over time (ended rollouts only)."""

    bucket: Literal["hour", "day"]
    confidence: float
    series: list[SuccessSeries]
