"""Rollout outcomes: which selected rollouts succeeded, and with what reward.

The workbench (``failures``, ``compare``) judges rollouts with one rule, so a
packet's "failed" and a comparison's "success rate" always mean the same
thing. Selection and the reward join are the dataset pipeline's
(``pipelines.datasets.selection``): the same filters select the same rollouts.

>>> SuccessRule.parse("reward>=0.5").describe()
'reward>=0.5'
"""

from __future__ import annotations

import math
from typing import Any, Literal

import duckdb
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, field_validator

from pipelines.datasets.config import RewardRule, Selection
from pipelines.datasets.selection import create_selected, reward_sql
from schemas.errors import InputError

OUTCOME_COLUMNS: tuple[str, ...] = (
    "rollout_id", "task_id", "tenant", "attempt", "policy_version", "harness_name", "harness_version",
    "harness_config_hash", "started_at", "status", "steps", "reward", "success",
)
"""Columns of ``select_outcomes``; ``reward`` is NULL for a rollout without one."""


class SuccessRule(BaseModel):
    """When a finished rollout counts as a success.

    ``status``: its status is ``succeeded``. ``reward``: its reward (by the
    reward rule) is >= ``threshold``; a rollout without a reward fails.
    ``both``: both hold.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["status", "reward", "both"] = "status"
    threshold: float | None = None

    @field_validator("threshold")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise InputError("the reward threshold must be a finite number")
        return v

    @classmethod
    def parse(cls, text: str) -> SuccessRule:
        """``status``, ``reward>=X`` or ``status,reward>=X``."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        has_status = "status" in parts
        rewards = [p for p in parts if p != "status"]
        if len(rewards) > 1 or len(parts) != has_status + len(rewards) or not parts:
            raise InputError(f"unknown success rule {text!r}: use status, reward>=X or status,reward>=X")
        if not rewards:
            return cls(kind="status")
        name, op, value = rewards[0].partition(">=")
        try:
            threshold = float(value)
        except ValueError:
            threshold = math.nan
        if name.strip() != "reward" or not op or not math.isfinite(threshold):
            raise InputError(f"unknown success rule {text!r}: use status, reward>=X (X a number) or status,reward>=X")
        return cls(kind="both" if has_status else "reward", threshold=threshold)

    def describe(self) -> str:
        if self.kind == "status":
            return "status"
        reward = f"reward>={self.threshold:g}"
        return reward if self.kind == "reward" else f"status,{reward}"

    def sql(self) -> tuple[str, list[Any]]:
        """A boolean SQL expression over ``status`` and ``reward``, and its parameters."""
        status = "coalesce(status = 'succeeded', false)"
        reward = "coalesce(reward >= ?, false)"
        if self.kind == "status":
            return status, []
        if self.kind == "reward":
            return reward, [self.threshold]
        return f"({status} AND {reward})", [self.threshold]


def select_outcomes(
    con: duckdb.DuckDBPyConnection, selection: Selection, *, success: SuccessRule, reward_rule: RewardRule
) -> pa.Table:
    """Every rollout of ``selection`` with its reward and success, ordered by rollout_id.

    ``con`` is a ``store.sql.connect`` connection; this creates the temp
    objects ``rollout_summary``, ``selected`` and ``outcomes`` on it. As in a
    dataset build, a rollout_id that two tenants both used is left out (its
    rewards could not be told apart). Raises ``BadFilter`` when the ``where``
    predicate does not run.
    """
    create_selected(con, selection)
    rewards, reward_params = reward_sql(reward_rule)
    succeeded, success_params = success.sql()
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE outcomes AS
            WITH r AS ({rewards})
            SELECT s.*, r.reward FROM selected s LEFT JOIN r USING (rollout_id)""",
        reward_params,
    )
    columns = ", ".join(c for c in OUTCOME_COLUMNS if c != "success")
    return con.execute(
        f"SELECT {columns}, {succeeded} AS success FROM outcomes ORDER BY rollout_id", success_params
    ).to_arrow_table()
