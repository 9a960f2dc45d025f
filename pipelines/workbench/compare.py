"""Harness (or policy) A/B on the tasks both arms ran, with its uncertainty.

Most reported agent gains sit inside evaluation noise, so a comparison is
paired by task and always carries an interval, a p-value and the number of
tasks a test would need to see the observed effect:

* per task, each arm's success rate (share of its rollouts that succeed under
  the ``SuccessRule``) and mean reward (over its rollouts that have one);
* the per-task difference B - A on the tasks both arms ran; the effect is its
  mean (so every task weighs the same, however many rollouts it had);
* a percentile interval from a seeded paired bootstrap over tasks, and the
  normal-approximation interval beside it as a cross-check;
* the p-value of a paired sign-flip permutation test (exact up to 16 non-zero
  differences, else seeded Monte Carlo);
* tasks needed for ``power`` at ``alpha`` for the observed effect (paired,
  normal approximation: n = ((z_{1-a/2} + z_power) * sd / mean)^2);
* the verdict: "B better than A" / "B worse than A" when the p-value is below
  ``alpha`` and the interval excludes 0, else "inside noise".

>>> result = compare(lake, Arm.parse("swe@1.4"), Arm.parse("swe@1.5"), CompareConfig())  # doctest: +SKIP
>>> result.verdict  # doctest: +SKIP
'inside noise'
"""

from __future__ import annotations

from typing import Literal

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from pipelines.workbench.stats import bootstrap_ci, normal_ci, sign_flip_p_value, tasks_for_power
from pipelines.datasets.config import RewardRule, Selection
from pipelines.datasets.outcomes import SuccessRule, select_outcomes
from store.lake import Lake
from store.sql import check_lake, connect
from schemas.errors import InputError

Verdict = Literal["B better than A", "B worse than A", "inside noise"]
ArmKind = Literal["harness", "policy"]
MetricName = Literal["success", "reward"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arm(_Model):
    """One side of the comparison: a harness (``NAME@VERSION`` or ``NAME``) or a policy version."""

    kind: ArmKind = "harness"
    value: str = Field(min_length=1, max_length=256)

    @classmethod
    def parse(cls, text: str, kind: ArmKind = "harness") -> Arm:
        """``swe-agent@1.5`` (or ``swe-agent``: every version) for a harness; the version string for a policy."""
        text = text.strip()
        if kind == "harness":
            name, at, version = text.partition("@")
            if not name or (at and not version) or "@" in version:
                raise InputError(f"harness {text!r} is not NAME@VERSION (or NAME for every version)")
        return cls(kind=kind, value=text)

    def selection(self, base: Selection) -> Selection:
        """``base`` narrowed to this arm's rollouts."""
        if self.kind == "harness":
            return base.model_copy(update={"harnesses": (self.value,)})
        return base.model_copy(update={"policy_versions": (self.value,)})


class CompareConfig(_Model):
    """What is compared and how (every field is reported with the result)."""

    selection: Selection = Field(default_factory=Selection)
    """Filters both arms share (tasks, tenants, time window, ``where``); the arms add their own."""
    success: SuccessRule = Field(default_factory=SuccessRule)
    reward_rule: RewardRule = Field(default_factory=RewardRule)
    primary: MetricName = "success"
    """The metric whose verdict is the headline."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    power: float = Field(default=0.8, gt=0, lt=1)
    resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    """Bootstrap resamples of the tasks."""
    permutations: int = Field(default=10_000, ge=100, le=1_000_000)
    """Sign-flip draws when the test is not exact."""
    seed: int = 0


class ArmSummary(_Model):
    """An arm's rollouts: all selected, and those on the shared tasks."""

    label: str
    rollouts: int
    tasks: int
    shared_rollouts: int
    without_reward: int
    """Shared-task rollouts with no reward (left out of the reward metric; they fail reward>=X)."""


class MetricResult(_Model):
    """One metric, paired by task: arm means, the difference B - A and its uncertainty."""

    name: MetricName
    tasks: int
    """Tasks paired for this metric (for reward: shared tasks where both arms have a rewarded rollout)."""
    a: float
    b: float
    diff: float
    ci: tuple[float, float]
    """Seeded paired-bootstrap percentile interval of ``diff``."""
    normal_ci: tuple[float, float]
    p_value: float
    """Paired sign-flip permutation test, two-sided."""
    tasks_needed: int | None
    """Tasks for ``power`` at ``alpha`` for the observed effect; None when the effect is 0 or one task paired."""
    verdict: Verdict


class Comparison(_Model):
    """The A/B result: arms, shared tasks, both metrics and the headline verdict."""

    a: ArmSummary
    b: ArmSummary
    shared_tasks: int
    success: MetricResult
    reward: MetricResult | None
    """None when no shared task has a reward in both arms."""
    verdict: Verdict
    config: CompareConfig


class CompareError(InputError):
    """The comparison cannot be made; the message says what to change."""


def compare(lake: Lake, a: Arm, b: Arm, config: CompareConfig) -> Comparison:
    """Compare arm B against arm A on the tasks both ran (see the module docstring)."""
    check_lake(lake)
    if a == b:
        raise CompareError(f"both arms are {a.value!r}: compare two different {a.kind} versions")
    con = connect(lake, sandbox=True)  # the --where predicate is user SQL: no file access
    try:
        tables = [_outcomes(con, arm, config) for arm in (a, b)]
    finally:
        con.close()
    overlap = set(tables[0].column("rollout_id").to_pylist()) & set(tables[1].column("rollout_id").to_pylist())
    if overlap:
        raise CompareError(f"{len(overlap)} rollouts belong to both arms ({a.value!r}, {b.value!r}): "
                           "name versions (NAME@VERSION) that do not contain each other")
    per_task = [_per_task(t) for t in tables]
    shared = sorted(set(per_task[0]) & set(per_task[1]))
    if not shared:
        raise CompareError(f"no task was run by both {a.value!r} ({len(per_task[0])} tasks) and {b.value!r} "
                           f"({len(per_task[1])} tasks): a paired comparison needs shared tasks "
                           "(widen the time window or task filter)")
    success = _metric("success", [(per_task[0][t][0], per_task[1][t][0]) for t in shared], config)
    reward_pairs = [(per_task[0][t][1], per_task[1][t][1]) for t in shared]
    reward_pairs = [(x, y) for x, y in reward_pairs if x is not None and y is not None]
    reward = _metric("reward", reward_pairs, config) if reward_pairs else None
    headline = success if config.primary == "success" or reward is None else reward
    return Comparison(
        a=_summary(a, tables[0], shared), b=_summary(b, tables[1], shared), shared_tasks=len(shared),
        success=success, reward=reward, verdict=headline.verdict, config=config,
    )


def _outcomes(con: duckdb.DuckDBPyConnection, arm: Arm, config: CompareConfig) -> pa.Table:
    table = select_outcomes(con, arm.selection(config.selection), success=config.success,
                            reward_rule=config.reward_rule)
    if table.num_rows == 0:
        column = "harness_name || '@' || harness_version" if arm.kind == "harness" else "policy_version"
        known = [r[0] for r in con.execute(
            f"SELECT DISTINCT {column} FROM rollout_summary WHERE {column} IS NOT NULL ORDER BY 1 LIMIT 20"
        ).fetchall()]
        raise CompareError(f"no finished rollouts of {arm.kind} {arm.value!r} match the filters; "
                           f"known {arm.kind} versions: {', '.join(known) or 'none (is the lake empty?)'}")
    return table


def _per_task(table: pa.Table) -> dict[str, tuple[float, float | None]]:
    """task_id -> (success rate, mean reward or None when no rollout has a reward)."""
    grouped = table.select(["task_id", "success", "reward"]).set_column(
        1, "success", pc.cast(table.column("success"), pa.float64())
    ).group_by("task_id").aggregate([("success", "mean"), ("reward", "mean")])
    return {t: (s, r) for t, s, r in zip(grouped.column("task_id").to_pylist(),
                                          grouped.column("success_mean").to_pylist(),
                                          grouped.column("reward_mean").to_pylist())}


def _metric(name: MetricName, pairs: list[tuple[float, float]], config: CompareConfig) -> MetricResult:
    values = np.array(pairs, dtype=np.float64)
    diffs = values[:, 1] - values[:, 0]
    ci = bootstrap_ci(diffs, confidence=config.confidence, resamples=config.resamples, seed=config.seed)
    p_value = sign_flip_p_value(diffs, permutations=config.permutations, seed=config.seed)
    return MetricResult(
        name=name, tasks=len(diffs), a=float(values[:, 0].mean()), b=float(values[:, 1].mean()),
        diff=float(diffs.mean()), ci=ci, normal_ci=normal_ci(diffs, confidence=config.confidence),
        p_value=p_value, tasks_needed=tasks_for_power(diffs, alpha=config.alpha, power=config.power),
        verdict=verdict(ci, p_value, alpha=config.alpha),
    )


def verdict(ci: tuple[float, float], p_value: float, *, alpha: float) -> Verdict:
    """A difference only when the test rejects at ``alpha`` and the interval excludes 0 (both must agree)."""
    if p_value < alpha and ci[0] > 0:
        return "B better than A"
    if p_value < alpha and ci[1] < 0:
        return "B worse than A"
    return "inside noise"


def _summary(arm: Arm, table: pa.Table, shared: list[str]) -> ArmSummary:
    on_shared = table.filter(pc.is_in(table.column("task_id"), pa.array(shared)))
    return ArmSummary(
        label=arm.value, rollouts=table.num_rows, tasks=len(pc.unique(table.column("task_id"))),
        shared_rollouts=on_shared.num_rows, without_reward=on_shared.column("reward").null_count,
    )
