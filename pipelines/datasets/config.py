"""What a dataset build selects and how it scores: one validated config.

The config is part of the dataset's identity: its canonical JSON goes into
the manifest and into the content hash (minus ``batch_tokens``, which only
changes how the work is chunked, never the rows, and minus ``tool_credit``
and ``mask`` while they are off, so versions built before they existed keep
their hash).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.errors import InputError

AdvantageMode = Literal["grpo", "mean", "raw"]
"""grpo: (r - mean) / std over the group; mean: r - mean (Dr. GRPO); raw: r."""

MaskMode = Literal["actions", "observations"]
"""actions: loss on the sampled response tokens; observations: on the tool results the harness appended."""

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
            raise InputError("give a UTC offset, e.g. 2026-01-01T00:00:00Z")
        return v

    @field_validator("where")
    @classmethod
    def _one_predicate(cls, v: str | None) -> str | None:
        if v is not None and (";" in v or "--" in v or "/*" in v):
            raise InputError("--where takes one SQL predicate: no ';' and no comments")
        if v is not None and not parentheses_balance(v):
            raise InputError(f"--where {v!r}: its parentheses do not balance (outside quotes): give one predicate "
                             "that stands alone, e.g. \"(steps > 2 OR reward > 0.5)\"")
        return v


def parentheses_balance(predicate: str) -> bool:
    """Whether every ')' of ``predicate`` outside string literals and quoted names closes an earlier '(' and every
    '(' is closed: the selection joins the predicate to its other filters as ``(predicate) AND ...``, so
    ``1=1) OR (1=1`` would otherwise escape them. DuckDB's own tokenizer finds the literals (E'\\'' included).

    >>> parentheses_balance("steps > 2 AND (x = ')' OR y)"), parentheses_balance("1=1) OR (1=1")
    (True, False)
    """
    import duckdb

    tokens = duckdb.tokenize(predicate)
    depth = 0
    for (start, kind), (end, _) in zip(tokens, [*tokens[1:], (len(predicate), None)]):
        if kind in (duckdb.token_type.string_const, duckdb.token_type.identifier):
            continue  # a literal or a name: its parentheses, quoted, are text
        for char in predicate[start:end]:
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth < 0:
                return False
    return depth == 0


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
                    raise InputError(f"reward weight {part!r} is not NAME=NUMBER") from None
                if not eq or not name.strip():
                    raise InputError(f"reward weight {part!r} is not NAME=NUMBER")
            return cls(kind="weighted", weights=weights)
        raise InputError(
            f"unknown reward rule {text!r}: use latest, latest:NAME, sum, mean or weighted:NAME=W,NAME=W"
        )

    def describe(self) -> str:
        if self.kind == "weighted":
            return "weighted:" + ",".join(f"{k}={v:g}" for k, v in sorted(self.weights.items()))
        return f"latest:{self.name}" if self.name else self.kind


class ToolCredit(BaseModel):
    """Credit for runs of one tool that follow a change of the world (rule in ``pipelines.datasets.tool_credit``).

    The credit is added to the rollout's reward from the reward rule.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, max_length=200)
    """``tool.result`` name of the credited tool, e.g. ``run_tests``."""
    value: float
    """Reward added per credited run."""
    max_runs: int | None = Field(default=None, ge=1)
    """At most this many credited runs per rollout; None = no cap."""

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise InputError("the credit per run must be a finite number")
        return v

    @classmethod
    def parse(cls, text: str) -> ToolCredit:
        """``TOOL=VALUE`` or ``TOOL=VALUE,max=N``.

        >>> ToolCredit.parse("run_tests=0.1,max=3")
        ToolCredit(tool='run_tests', value=0.1, max_runs=3)
        """
        head, _, cap = text.strip().partition(",")
        tool, eq, value = head.partition("=")
        cap_key, cap_eq, cap_value = cap.partition("=")
        try:
            if not eq or (cap and (cap_key.strip() != "max" or not cap_eq)):
                raise ValueError
            return cls(tool=tool.strip(), value=float(value),
                       max_runs=int(cap_value) if cap else None)
        except ValueError as exc:
            detail = f" ({exc.errors()[0]['msg']})" if hasattr(exc, "errors") else ""
            raise InputError(f"tool credit {text!r}{detail}: write TOOL=VALUE or TOOL=VALUE,max=N, "
                             "e.g. run_tests=0.1,max=3") from None

    def describe(self) -> str:
        return f"{self.tool}={self.value:g}" + (f",max={self.max_runs}" if self.max_runs is not None else "")


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
    tool_credit: ToolCredit | None = None
    """State-change-conditioned credit for runs of one tool, added to the reward."""
    mask: MaskMode = "actions"
    """Which tokens the loss covers: sampled actions, or observations (see pipelines.datasets.observations)."""
    tokenizers: tuple[str, ...] = ()
    """Local tokenizer folders; calls recorded with one of them get their sample breaks classified by text
    (``pipelines.datasets.merging``). Not in the identity: it changes only ``start_reason``, which the rows carry."""

    @model_validator(mode="after")
    def _observations_have_no_advantage(self) -> BuildConfig:
        if self.mask == "observations" and self.drop_degenerate:
            raise InputError("observation datasets carry no advantage: drop --drop-degenerate or use --mask actions")
        return self

    def identity(self) -> dict:
        """The config as it enters the content hash (chunking, tokenizer folders and options left off excluded)."""
        defaults = BuildConfig.model_fields
        off = {name for name in ("tool_credit", "mask") if getattr(self, name) == defaults[name].default}
        return json.loads(self.model_dump_json(exclude={"batch_tokens", "tokenizers", *off}))
