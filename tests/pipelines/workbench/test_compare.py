"""Harness A/B: the statistics on known data, then through a real lake and the CLI."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from pipelines.workbench.stats import bootstrap_ci, normal_ci, sign_flip_p_value, tasks_for_power
from pipelines.workbench.compare import Arm, CompareConfig, CompareError, compare, verdict
from pipelines.datasets.config import Selection
from pipelines.datasets.outcomes import SuccessRule
from pipelines.datasets.selection import BadFilter
from store.lake import Lake
from store.sql import LakeMissing
from tests.pipelines.conftest import LakeRows
from trajlake.cli import Shell
from trajlake.commands import workbench

TASKS = 200
Z_SUM = 1.959963984540054 + 0.8416212335729143  # z_{0.975} + z_{0.80}


def planted_a(i: int) -> bool:
    return i % 10 < 4  # 40%


def planted_b(i: int) -> bool:
    return (3 * i + 1) % 10 < 7  # 70%, on a different mix of tasks


def null_c(i: int) -> bool:
    return (7 * i + 3) % 10 < 4  # 40%, other tasks than A: mean difference exactly 0


def hand_diffs(b=planted_b, a=planted_a) -> list[int]:
    return [int(b(i)) - int(a(i)) for i in range(TASKS)]


def hand_normal_ci(diffs: list[int]) -> tuple[float, float]:
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean - 1.959963984540054 * se, mean + 1.959963984540054 * se


# ------------------------------------------------------------------ statistics, no lake


def test_planted_effect_interval_matches_the_analytic_one() -> None:
    diffs = np.array(hand_diffs(), dtype=float)
    low, high = bootstrap_ci(diffs, confidence=0.95, resamples=20_000, seed=1)
    hand_low, hand_high = hand_normal_ci(hand_diffs())
    assert diffs.mean() == pytest.approx(0.3) and low > 0
    assert low == pytest.approx(hand_low, abs=0.015) and high == pytest.approx(hand_high, abs=0.015)
    assert normal_ci(diffs, confidence=0.95) == pytest.approx((hand_low, hand_high))
    assert sign_flip_p_value(diffs, permutations=10_000, seed=1) < 0.001
    expected = math.ceil((Z_SUM * statistics.stdev(hand_diffs()) / 0.3) ** 2)
    assert tasks_for_power(diffs, alpha=0.05, power=0.8) == expected


def test_seeded_null_effect_is_inside_noise() -> None:
    rng = np.random.default_rng(2026)
    diffs = (rng.random(TASKS) < 0.5).astype(float) - (rng.random(TASKS) < 0.5).astype(float)
    ci = bootstrap_ci(diffs, confidence=0.95, resamples=5_000, seed=0)
    p = sign_flip_p_value(diffs, permutations=5_000, seed=0)
    assert ci[0] < 0 < ci[1] and p > 0.05
    assert verdict(ci, p, alpha=0.05) == "inside noise"


@pytest.mark.parametrize(("diffs", "p"), [
    ([1, 1, 1], 2 / 8), ([1] * 5, 2 / 32), ([1, -1], 1.0), ([0, 0, 0], 1.0), ([0.5, 0, 0.5, 0.5, -0.5], 10 / 16),
])
def test_exact_sign_flip_p_values(diffs: list[float], p: float) -> None:
    """Hand counts: e.g. four +-0.5 flips reach |sum| >= 1 in 1 + 4 + 4 + 1 of 16 patterns."""
    assert sign_flip_p_value(np.array(diffs, dtype=float), permutations=100, seed=0) == pytest.approx(p)


def test_monte_carlo_sign_flip_never_returns_zero() -> None:
    assert sign_flip_p_value(np.ones(40), permutations=999, seed=0) == pytest.approx(1 / 1000)


def test_bootstrap_is_reproducible_by_seed() -> None:
    diffs = np.array(hand_diffs(), dtype=float)
    first = bootstrap_ci(diffs, confidence=0.9, resamples=1_000, seed=7)
    assert bootstrap_ci(diffs, confidence=0.9, resamples=1_000, seed=7) == first
    assert bootstrap_ci(diffs, confidence=0.9, resamples=1_000, seed=8) != first
    assert bootstrap_ci(np.array([0.25] * 3), confidence=0.95, resamples=100, seed=0) == (0.25, 0.25)


def test_tasks_for_power_edge_cases() -> None:
    assert tasks_for_power(np.array([1.0, -1.0]), alpha=0.05, power=0.8) is None
    assert tasks_for_power(np.array([0.2, 0.2, 0.2]), alpha=0.05, power=0.8) == 1
    assert tasks_for_power(np.array([0.5]), alpha=0.05, power=0.8) is None  # one task: no sd
    diffs = np.array([0.1, 0.3, -0.1, 0.1])  # mean 0.1, sd sqrt(0.08/3)
    assert tasks_for_power(diffs, alpha=0.05, power=0.8) == math.ceil((Z_SUM * math.sqrt(0.08 / 3) / 0.1) ** 2)


@pytest.mark.parametrize(("ci", "p", "expected"), [
    ((0.1, 0.2), 0.01, "B better than A"), ((-0.2, -0.1), 0.01, "B worse than A"),
    ((0.1, 0.2), 0.2, "inside noise"), ((-0.1, 0.2), 0.01, "inside noise"),
])
def test_verdict_needs_test_and_interval_to_agree(ci, p, expected) -> None:
    assert verdict(ci, p, alpha=0.05) == expected


# ------------------------------------------------------------------ through a real lake


@pytest.fixture(scope="module")
def ab_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """200 tasks, one rollout each of swe@1.0 (40%), swe@2.0 (70%), swe@3.0 (40%, other tasks); swe@4.0 elsewhere."""
    lake = Lake(str(tmp_path_factory.mktemp("compare") / "lake"))
    rows = LakeRows(lake)
    arms = (("1.0", "pA", planted_a), ("2.0", "pB", planted_b), ("3.0", "pC", null_c))
    for version, policy, succeeds in arms:
        for i in range(TASKS):
            rid = f"r-{version}-{i:03d}"
            ok = succeeds(i)
            rows.rollout(rid, f"task-{i:03d}", harness=("swe", version), policy_version=policy,
                         status="succeeded" if ok else "failed")
            rows.reward(rid, 1.0 if ok else 0.0)
    for i in range(3):
        rows.rollout(f"r-4.0-{i}", f"other-{i}", harness=("swe", "4.0"))
    rows.flush()
    return lake


def arm(version: str) -> Arm:
    return Arm.parse(f"swe@{version}")


def test_planted_effect_through_the_lake(ab_lake: Lake) -> None:
    r = compare(ab_lake, arm("1.0"), arm("2.0"), CompareConfig(resamples=20_000, seed=1))
    hand_low, hand_high = hand_normal_ci(hand_diffs())
    assert (r.shared_tasks, r.a.rollouts, r.b.rollouts) == (TASKS, TASKS, TASKS)
    assert (r.success.a, r.success.b, r.success.diff) == pytest.approx((0.4, 0.7, 0.3))
    assert r.success.ci[0] == pytest.approx(hand_low, abs=0.015)
    assert r.success.ci[1] == pytest.approx(hand_high, abs=0.015)
    assert r.success.p_value < 0.001 and r.verdict == "B better than A"
    assert r.success.tasks_needed == math.ceil((Z_SUM * statistics.stdev(hand_diffs()) / 0.3) ** 2)
    assert r.reward is not None and r.reward.diff == pytest.approx(0.3) and r.reward.verdict == "B better than A"
    reverse = compare(ab_lake, arm("2.0"), arm("1.0"), CompareConfig(resamples=2_000))
    assert reverse.verdict == "B worse than A" and reverse.success.diff == pytest.approx(-0.3)


def test_null_effect_is_inside_noise(ab_lake: Lake) -> None:
    r = compare(ab_lake, arm("1.0"), arm("3.0"), CompareConfig(resamples=2_000, permutations=2_000))
    assert r.success.diff == 0 and r.success.ci[0] < 0 < r.success.ci[1]
    assert r.success.p_value > 0.5 and r.success.tasks_needed is None and r.verdict == "inside noise"


def test_policy_arms_and_success_by_reward(ab_lake: Lake) -> None:
    config = CompareConfig(success=SuccessRule.parse("reward>=1"), primary="reward", resamples=1_000)
    r = compare(ab_lake, Arm.parse("pA", "policy"), Arm.parse("pB", "policy"), config)
    assert r.success.diff == pytest.approx(0.3) and r.verdict == "B better than A"


def test_task_filter_limits_the_pairs(ab_lake: Lake) -> None:
    tasks = tuple(f"task-{i:03d}" for i in range(10))
    r = compare(ab_lake, arm("1.0"), arm("2.0"), CompareConfig(selection=Selection(tasks=tasks), resamples=500))
    diffs = hand_diffs()[:10]
    assert r.shared_tasks == 10 and r.success.diff == pytest.approx(statistics.fmean(diffs))


def test_tasks_weigh_the_same_and_missing_rewards_are_counted(lake: Lake) -> None:
    rows = LakeRows(lake)
    for rid, task, version, status, reward in [
        ("a1", "t1", "1", "succeeded", 1.0), ("a2", "t1", "1", "failed", None), ("a3", "t2", "1", "failed", 0.0),
        ("b1", "t1", "2", "succeeded", 1.0), ("b2", "t2", "2", "succeeded", None), ("b3", "t3", "2", "failed", 0.0),
    ]:
        rows.rollout(rid, task, harness=("h", version), status=status)
        if reward is not None:
            rows.reward(rid, reward)
    rows.flush()
    r = compare(lake, Arm.parse("h@1"), Arm.parse("h@2"), CompareConfig(resamples=200, permutations=200))
    assert r.shared_tasks == 2 and (r.a.tasks, r.b.tasks) == (2, 3)
    assert (r.success.a, r.success.b) == pytest.approx((0.25, 1.0))  # t1: 1/2 and t2: 0 -> mean 0.25
    assert (r.a.without_reward, r.b.without_reward, r.b.shared_rollouts) == (1, 1, 2)
    assert r.reward is not None and r.reward.tasks == 1  # t2 has no reward in arm B


def test_rollout_id_reused_across_tenants_is_left_out(lake: Lake) -> None:
    """As in a dataset build: the two tenants' rewards of one id could not be told apart."""
    rows = LakeRows(lake)
    rows.rollout("a1", "t1", harness=("h", "1"))
    rows.rollout("b1", "t1", harness=("h", "2"))
    for tenant in ("acme", "beta"):
        rows.rollout("dup", "t1", tenant=tenant, harness=("h", "1"), status="failed")
    rows.flush()
    r = compare(lake, Arm.parse("h@1"), Arm.parse("h@2"), CompareConfig(resamples=100, permutations=100))
    assert (r.a.rollouts, r.success.a) == (1, 1.0)


def test_comparison_errors_say_what_to_change(ab_lake: Lake, tmp_path) -> None:
    config = CompareConfig(resamples=100, permutations=100)
    with pytest.raises(CompareError, match="known harness versions: swe@1.0, swe@2.0"):
        compare(ab_lake, arm("1.0"), arm("9.9"), config)
    with pytest.raises(CompareError, match="no task was run by both"):
        compare(ab_lake, arm("1.0"), arm("4.0"), config)
    with pytest.raises(CompareError, match="both arms"):
        compare(ab_lake, arm("1.0"), arm("1.0"), config)
    with pytest.raises(CompareError, match="belong to both arms"):
        compare(ab_lake, Arm.parse("swe"), arm("1.0"), config)
    with pytest.raises(LakeMissing):
        compare(Lake(str(tmp_path / "absent")), arm("1.0"), arm("2.0"), config)
    (tmp_path / "secret.txt").write_text("x")
    reads_a_file = Selection(where=f"(SELECT count(*) FROM read_text('{tmp_path / 'secret.txt'}')) > 0")
    with pytest.raises(BadFilter, match="disabled by configuration"):
        compare(ab_lake, arm("1.0"), arm("2.0"), config.model_copy(update={"selection": reads_a_file}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="is the lake empty"):
        compare(Lake(str(tmp_path / "empty")), arm("1.0"), arm("2.0"), config)


@pytest.mark.parametrize("text", ["", "@1.0", "swe@", "swe@1@2"])
def test_bad_harness_arm_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Arm.parse(text)


@pytest.mark.parametrize("fields", [
    {"confidence": 1.5}, {"alpha": 0}, {"power": "high"}, {"resamples": 5}, {"permutations": 10**9},
    {"primary": "latency"}, {"seed": "x"}, {"extra": 1}, {"success": {"kind": "vibes"}},
])
def test_bad_compare_config_is_refused(fields: dict) -> None:
    with pytest.raises(ValidationError):
        CompareConfig(**fields)


def test_oversized_arm_is_refused() -> None:
    with pytest.raises(ValidationError):
        Arm.parse("x" * 10_000, "policy")


# ------------------------------------------------------------------ CLI


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer(cls=Shell, pretty_exceptions_enable=False)  # the shell's error handler

    @app.callback()
    def _root() -> None:
        """trajlake"""

    workbench.register(app)
    return app


def run(app: typer.Typer, *args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_cli_prints_the_table_and_verdict(app: typer.Typer, ab_lake: Lake) -> None:
    planted = run(app, "compare", "swe@1.0", "swe@2.0", "--lake", ab_lake.root, "--resamples", "1000")
    assert planted.exit_code == 0, planted.output
    assert "paired by task on 200 shared tasks" in planted.output and "+30.0 pp" in planted.output
    assert "verdict: B better than A" in planted.output
    null = run(app, "compare", "swe@1.0", "swe@3.0", "--lake", ab_lake.root, "--resamples", "1000")
    assert "verdict: inside noise" in null.output


def test_cli_json_is_reproducible(app: typer.Typer, ab_lake: Lake) -> None:
    args = ("compare", "pA", "pB", "--by", "policy", "--lake", ab_lake.root, "--resamples", "500", "--json")
    first, second = run(app, *args), run(app, *args)
    assert first.exit_code == 0 and first.output == second.output
    result = json.loads(first.output)
    assert result["verdict"] == "B better than A" and result["config"]["resamples"] == 500


@pytest.mark.parametrize(("args", "message"), [
    (["swe@1.0", "swe@9"], "known harness versions"),
    (["swe@1.0", "swe@4.0"], "no task was run by both"),
    (["swe@1.0", "swe@2.0", "--by", "model"], "--by 'model'"),
    (["swe@1.0", "swe@2.0", "--confidence", "7"], "confidence"),
    (["swe@1.0", "swe@2.0", "--success", "reward"], "success rule"),
    (["swe@1.0", "swe@2.0", "--until", "soon"], "not an RFC 3339 time"),
])
def test_cli_bad_input_exits_with_a_message(app: typer.Typer, ab_lake: Lake, args: list[str], message: str) -> None:
    result = run(app, "compare", *args, "--lake", ab_lake.root)
    assert result.exit_code == 1 and message in " ".join(result.output.split())


def test_cli_filters_by_the_other_kind(app: typer.Typer, ab_lake: Lake) -> None:
    """Harness arms under one policy; a policy filter that matches neither arm is an error."""
    ok = run(app, "compare", "swe@1.0", "swe@2.0", "--policy-version", "pA", "--policy-version", "pB",
             "--lake", ab_lake.root, "--resamples", "200", "--json")
    assert ok.exit_code == 0 and json.loads(ok.output)["shared_tasks"] == TASKS
    none = run(app, "compare", "swe@1.0", "swe@2.0", "--policy-version", "pC", "--lake", ab_lake.root)
    assert none.exit_code == 1 and "no finished rollouts" in none.output
    clash = run(app, "compare", "pA", "pB", "--by", "policy", "--policy-version", "pA", "--lake", ab_lake.root)
    assert clash.exit_code == 1 and "the arms already name the policy" in " ".join(clash.output.split())
