"""State-change-conditioned tool credit on real Delta lakes: runs earn only after the world changed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from pipelines import BuildConfig, SourceMissing, ToolCredit, build_dataset, read_dataset
from pipelines.datasets.registry import lineage_rows
from tests.pipelines.conftest import SCHEMAS, LakeRows
from trajlake.cli import build_app

BASE = 1.0
CREDIT = ToolCredit(tool="run_tests", value=0.1)


def tool(rows: LakeRows, rollout_id: str, name: str, changed: bool | None, *, call_id: str | None = None) -> str:
    """One tool.result row; returns its event id."""
    call_id = call_id or f"{name}-{rows.seq[rollout_id] + 1}"
    row = rows._row(rollout_id, call_id=call_id, name=name, result="ok", error=None, duration_ms=1.0,
                    state_changed=changed)
    rows.rows["tool_results"].append(row)
    return row["event_id"]


def edit(rows: LakeRows, rollout_id: str, **kw) -> str:
    return tool(rows, rollout_id, "edit_file", True, **kw)


def run_tests(rows: LakeRows, rollout_id: str) -> str:
    return tool(rows, rollout_id, "run_tests", False)


SCENARIOS = {
    # the reward-hacking loop: one edit, then the suite 30 times in a row
    "farm": lambda r, i: [edit(r, i)] + [run_tests(r, i) for _ in range(30)],
    "cycles": lambda r, i: [edit(r, i), run_tests(r, i), edit(r, i), run_tests(r, i)],
    "no_edit": lambda r, i: [run_tests(r, i) for _ in range(3)],
    # running the tests writes caches: the tool's own change never earns, not even the next run
    "self_change": lambda r, i: [tool(r, i, "run_tests", True) for _ in range(5)],
    "unknown_or_no_change": lambda r, i: [tool(r, i, "edit_file", None), run_tests(r, i),
                                          tool(r, i, "edit_file", False), run_tests(r, i)],
    "reads_between": lambda r, i: [edit(r, i), tool(r, i, "read_file", False), run_tests(r, i),
                                   tool(r, i, "read_file", False), run_tests(r, i)],
    # the edit's report retried under the same call id counts once
    "retried_report": lambda r, i: [edit(r, i, call_id="e1"), run_tests(r, i),
                                    edit(r, i, call_id="e1"), run_tests(r, i)],
    "edit_after_last_run": lambda r, i: [run_tests(r, i), edit(r, i)],
    "three_cycles": lambda r, i: [x for _ in range(3) for x in (edit(r, i), run_tests(r, i))],
}
CREDITED_RUNS = {"farm": 1, "cycles": 2, "no_edit": 0, "self_change": 0, "unknown_or_no_change": 0,
                 "reads_between": 1, "retried_report": 1, "edit_after_last_run": 0, "three_cycles": 3}


@pytest.fixture
def scenarios(rows: LakeRows) -> dict[str, list[str]]:
    """One rollout per scenario (each its own task: raw advantages), all with outcome reward BASE."""
    events = {}
    for name, steps in SCENARIOS.items():
        rows.rollout(name, f"task-{name}")
        rows.call(name, "c1", [1, 2, 3], [4, 5])
        events[name] = steps(rows, name)
        rows.reward(name, BASE)
    rows.flush()
    return events


def rewards(lake, name: str) -> dict[str, float]:
    table = read_dataset(lake, name, columns=["rollout_id", "reward"])
    return dict(zip(table["rollout_id"].to_pylist(), table["reward"].to_pylist()))


def test_a_repeated_test_run_without_edits_earns_nothing(lake, scenarios):
    result = build_dataset(lake, "credited", BuildConfig(tool_credit=CREDIT, advantage="raw"))
    got = rewards(lake, "credited")
    assert got == {name: pytest.approx(BASE + 0.1 * n) for name, n in CREDITED_RUNS.items()}
    counts = result.manifest["counts"]["tool_credit"]
    assert counts == {"runs": 30 + 2 + 3 + 5 + 2 + 2 + 2 + 1 + 3, "credited_runs": sum(CREDITED_RUNS.values()),
                      "rollouts_credited": sum(1 for n in CREDITED_RUNS.values() if n)}
    assert result.manifest["tool_credit"] == "run_tests=0.1"
    assert result.manifest["sources"]["tool_results"] >= 0


def test_only_the_credited_runs_join_the_reward_lineage(lake, scenarios):
    build_dataset(lake, "credited", BuildConfig(tool_credit=CREDIT))
    lineage = {r["rollout_id"]: r["reward_event_ids"] for r in lineage_rows(lake, "credited", 0).to_pylist()}
    farm = scenarios["farm"]
    assert farm[1] in lineage["farm"]  # the first run after the edit
    assert not set(farm[2:]) & set(lineage["farm"])  # runs 2..30: nothing changed between them
    assert farm[0] not in lineage["farm"]  # the edit itself earns nothing
    cycles = scenarios["cycles"]
    assert {cycles[1], cycles[3]} <= set(lineage["cycles"])
    assert len(lineage["no_edit"]) == 1  # only the outcome reward event


def test_the_cap_bounds_credited_runs_per_rollout(lake, scenarios):
    build_dataset(lake, "capped", BuildConfig(tool_credit=ToolCredit.parse("run_tests=0.1,max=2"), advantage="raw"))
    got = rewards(lake, "capped")
    assert got["three_cycles"] == pytest.approx(BASE + 0.2)
    assert got["cycles"] == pytest.approx(BASE + 0.2) and got["farm"] == pytest.approx(BASE + 0.1)


def test_credit_is_part_of_the_config_and_the_hash(lake, scenarios):
    plain = build_dataset(lake, "ds")
    credited = build_dataset(lake, "ds", BuildConfig(tool_credit=CREDIT))
    again = build_dataset(lake, "ds", BuildConfig(tool_credit=CREDIT))
    other_tool = build_dataset(lake, "ds", BuildConfig(tool_credit=ToolCredit(tool="edit_file", value=0.1)))
    assert credited.content_hash == again.content_hash
    assert len({plain.content_hash, credited.content_hash, other_tool.content_hash}) == 3
    assert credited.manifest["config"]["tool_credit"] == {"tool": "run_tests", "value": 0.1, "max_runs": None}
    assert plain.manifest["tool_credit"] is None and "tool_credit" not in plain.manifest["counts"]
    assert "tool_results" not in plain.manifest["sources"]
    # off by default: the identity (and so the hash) of configs without it is what it was before it existed
    assert "tool_credit" not in BuildConfig().identity() and "tool_credit" in BuildConfig(tool_credit=CREDIT).identity()


def test_a_tool_nobody_ran_credits_nothing(lake, scenarios):
    build_dataset(lake, "ds", BuildConfig(tool_credit=ToolCredit(tool="deploy", value=5.0), advantage="raw"))
    assert set(rewards(lake, "ds").values()) == {BASE}


def test_credit_needs_the_tool_results_table(lake, rows):
    rows.rollout("r1", "t1")
    rows.call("r1", "c1", [1, 2], [3])
    rows.reward("r1", 1.0)
    for table in ("rollout_starts", "rollout_ends", "llm_requests", "llm_responses", "rewards"):
        lake.append(table, _only(rows, table), schema=SCHEMAS[table])
    with pytest.raises(SourceMissing, match="tool_results"):
        build_dataset(lake, "ds", BuildConfig(tool_credit=CREDIT))
    build_dataset(lake, "ds")  # without the credit the table is not needed


def _only(rows: LakeRows, table: str) -> pa.Table:
    return pa.Table.from_pylist(rows.rows.pop(table, []), schema=SCHEMAS[table])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run_tests", "TOOL=VALUE"),
        ("run_tests=", "TOOL=VALUE"),
        ("=0.1", "at least 1 character"),
        ("run_tests=lots", "TOOL=VALUE"),
        ("run_tests=nan", "finite"),
        ("run_tests=inf", "finite"),
        ("run_tests=0.1,max=0", "greater than or equal to 1"),
        ("run_tests=0.1,max=two", "TOOL=VALUE"),
        ("run_tests=0.1,cap=2", "TOOL=VALUE"),
        ("x" * 201 + "=0.1", "at most 200"),
    ],
)
def test_malformed_credit_specs_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        ToolCredit.parse(text)


@pytest.mark.parametrize(
    "value",
    [{"tool": 5, "value": 0.1}, {"tool": "run_tests"}, {"value": 0.1}, {"tool": "t", "value": "much"},
     {"tool": "t", "value": 0.1, "max_runs": 1.5}, {"tool": "t", "value": 0.1, "extra": 1}, "run_tests=0.1"],
)
def test_wrong_types_and_missing_fields_are_refused(value):
    with pytest.raises(ValidationError):
        BuildConfig(tool_credit=value)


def test_the_cli_takes_tool_credit_and_explains_bad_specs(lake, scenarios, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    monkeypatch.delenv("TRAJLAKE_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    built = runner.invoke(build_app(), ["build-dataset", "ds", "--tool-credit", "run_tests=0.1,max=2"])
    assert built.exit_code == 0, built.output
    line = "tool credit run_tests=0.1,max=2 after state changes: 7 of 50 runs credited, in 5 rollouts"
    assert line in built.output, built.output
    bad = runner.invoke(build_app(), ["build-dataset", "ds", "--tool-credit", "run_tests:0.1"])
    assert bad.exit_code == 1 and "TOOL=VALUE" in bad.output
