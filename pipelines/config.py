"""What a dataset build selects and how it scores: one validated config.

The config is part of the dataset's identity: its canonical JSON goes into
the manifest and into the content hash (minus ``batch_tokens``, which only
changes how the work is chunked, never the rows).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

AdvantageMode = Literal["grpo", "mean", "raw"]
"""grpo: (r - mean) / std over the group; mean: r - mean (Dr. GRPO); raw: r."""

RolloutStatus = Literal["succeeded", "failed", "truncated", "cancelled"]

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class Selection(BaseModel):
    """Which rollouts go in. Empty lists mean "any"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: datetime | None = None
    """Rollouts that started at or after this time (UTC)."""
    until: datetime | None = None
    """Rollouts that started before this time (UTC)."""
    tasks: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    harnesses: tuple[str, ...] = ()
    """Harness names, or ``name@version``."""
    policy_versions: tuple[str, ...] = ()
    statuses: tuple[RolloutStatus, ...] = ()
    include_unfinished: bool = False
    """By default only rollouts with a rollout.finished event are used."""
    where: str | None = Field(default=None, max_length=2000)
    """Extra SQL predicate over the columns of ``rollout_summary`` (see selection.py)."""

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("give a UTC offset, e.g. 2026-01-01T00:00:00Z")
        return v

    @field_validator("where")
    @classmethod
    def _one_predicate(cls, v: str | None) -> str | None:
        if v is not None and (";" in v or "--" in v):
            raise ValueError("--where takes one SQL predicate: no ';' and no comments")
        return v


class RewardRule(BaseModel):
    """How a rollout's rewards (several names, late arrivals) become one scalar.

    For every reward name the latest value wins (by event ts, then seq).
    ``latest``: the latest reward of any name. ``sum``/``mean``: sum or mean
    over the latest value of each name. ``weighted``: sum of weight x latest
    value over the named rewards; a rollout missing one of them has no reward.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["latest", "sum", "mean", "weighted"] = "latest"
    weights: dict[str, float] = Field(default_factory=dict)
    name: str | None = None
    """Only rewards with this name count (``latest:NAME``)."""

    @classmethod
    def parse(cls, text: str) -> RewardRule:
        """``latest``, ``latest:NAME``, ``sum``, ``mean`` or ``weighted:a=0.7,b=0.3``.

        >>> RewardRule.parse("weighted:pass=1,style=0.1").weights
        {'pass': 1.0, 'style': 0.1}
        """
        kind, _, arg = text.strip().partition(":")
        if kind == "latest":
            return cls(kind="latest", name=arg or None)
        if kind in ("sum", "mean") and not arg:
            return cls(kind=kind)
        if kind == "weighted" and arg:
            weights: dict[str, float] = {}
            for part in arg.split(","):
                name, eq, value = part.partition("=")
                try:
                    weights[name.strip()] = float(value)
                except ValueError:
                    raise ValueError(f"reward weight {part!r} is not NAME=NUMBER") from None
                if not eq or not name.strip():
                    raise ValueError(f"reward weight {part!r} is not NAME=NUMBER")
            return cls(kind="weighted", weights=weights)
        raise ValueError(
            f"unknown reward rule {text!r}: use latest, latest:NAME, sum, mean or weighted:NAME=W,NAME=W"
        )

    def describe(self) -> str:
        if self.kind == "weighted":
            return "weighted:" + ",".join(f"{k}={v:g}" for k, v in sorted(self.weights.items()))
        return f"latest:{self.name}" if self.name else self.kind


class BuildConfig(BaseModel):
    """Everything that decides the rows of a dataset version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    selection: Selection = Field(default_factory=Selection)
    reward_rule: RewardRule = Field(default_factory=RewardRule)
    advantage: AdvantageMode = "grpo"
    group_by: Literal["group_id", "task_id"] = "group_id"
    """Advantage groups: the rollout's group_id (task_id unless the producer set one) or task_id."""
    drop_degenerate: bool = False
    """Drop rollouts of degenerate groups (size 1, zero std) instead of giving them advantage 0."""
    allow_non_engine: bool = False
    """Train on calls whose tokens were re-tokenized (token_source != engine)."""
    std_epsilon: float = Field(default=1e-6, ge=0)
    """A group whose reward std is <= this is degenerate under grpo."""
    batch_tokens: int = Field(default=4_000_000, ge=1)
    """Tokens (prompt + response) read per batch of rollouts: bounds memory."""

    def identity(self) -> dict:
        """The config as it enters the content hash (chunking excluded)."""
        return json.loads(self.model_dump_json(exclude={"batch_tokens"}))
