"""Failure packets over a real lake (events through the wire contract into Delta tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from pipelines.datasets.config import Selection
from pipelines.workbench.failure_packets import ERROR_CHARS, ERROR_SIGNATURE_CHARS, first_messages, normalise
from pipelines.workbench.failures import (
    FailureConfig,
    NothingSelected,
    append_packets,
    extract_failures,
    packet_lines,
    write_jsonl,
)
from pipelines.datasets.outcomes import SuccessRule
from pipelines.datasets.selection import BadFilter
from schemas.tables import FAILURE_PACKETS_TABLE
from store.lake import Lake
from store.sql import LakeMissing
from tests.store.lake_builder import event, write_events
from trajlake.cli import Shell
from trajlake.commands import workbench

HARNESS = {"name": "swe-agent", "version": "1.2", "config_hash": "cfg-a"}
SYSTEM = "Only edit files under src/; never touch tests."
TASK = "Fix the date parser so that ISO weeks parse."


def crashed_rollout(rollout_id: str, *, task_id: str, path: str, tries: int, error: str | None = None) -> list:
    """Plan, bash fails with a FileNotFoundError, the agent gives up: status failed."""
    k = {"rollout_id": rollout_id, "task_id": task_id, "harness": HARNESS}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    return [
        event("rollout.started", {"policy_version": "p7"}, seq=0, **k),
        event("llm.request", {"call_id": "c1", "model": "qwen", "messages": messages}, seq=1, **k),
        event("llm.response", {"call_id": "c1", "text": "run the tests", "finish_reason": "tool_calls",
                               "upstream_retries": 2}, seq=2, **k),
        event("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": "pytest"}}, seq=3, **k),
        event("tool.result", {"call_id": "t1", "name": "bash", "result": None,
                              "error": error or f"Traceback (most recent call last):\nFileNotFoundError: "
                                                f"'{path}' missing after {tries} tries"}, seq=4, **k),
        event("llm.request", {"call_id": "c2", "model": "qwen",
                              "messages": [*messages, {"role": "tool", "content": "error"}]}, seq=5, **k),
        event("llm.response", {"call_id": "c2", "text": "I give up", "finish_reason": "stop"}, seq=6, **k),
        event("rollout.finished", {"status": "failed", "reason": "tool crashed", "steps": 2}, seq=7, **k),
        event("reward", {"name": "pass", "value": 0.0, "source": "grader"}, seq=8, **k),
    ]


def finished_rollout(rollout_id: str, *, task_id: str, reward: float, truncated: bool = False) -> list:
    """Two LLM calls; a truncated rollout re-requests its last call (harness retry) and stops for ``length``."""
    k = {"rollout_id": rollout_id, "task_id": task_id, "harness": HARNESS}
    finish = "length" if truncated else "stop"
    retry = [
        event("llm.request", {"call_id": "c2r", "model": "qwen", "prompt": "continue", "idempotency_key": "k2"},
              seq=5, **k),
        event("llm.response", {"call_id": "c2r", "text": "step two", "finish_reason": finish}, seq=6, **k),
    ] if truncated else []
    return [
        event("rollout.started", {"policy_version": "p7"}, seq=0, **k),
        event("llm.request", {"call_id": "c1", "model": "qwen", "prompt": "Complete: " + TASK}, seq=1, **k),
        event("llm.response", {"call_id": "c1", "text": "step one", "finish_reason": "tool_calls"}, seq=2, **k),
        event("llm.request", {"call_id": "c2", "model": "qwen", "prompt": "continue", "idempotency_key": "k2"},
              seq=3, **k),
        event("llm.response", {"call_id": "c2", "text": "step two", "finish_reason": finish}, seq=4, **k),
        *retry,
        event("rollout.finished", {"status": "truncated" if truncated else "succeeded",
                                   "reason": "reached max_steps=2" if truncated else None, "steps": 2}, seq=7, **k),
        event("reward", {"name": "pass", "value": reward, "source": "grader"}, seq=8, **k),
    ]


@pytest.fixture(scope="module")
def failing_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """Read-only for the tests (those that write build their own with ``fresh_lake``)."""
    lake = Lake(str(tmp_path_factory.mktemp("failures") / "lake"))
    write_events(lake, failing_events())
    return lake


@pytest.fixture
def fresh_lake(lake: Lake) -> Lake:
    write_events(lake, failing_events())
    return lake


def failing_events() -> list:
    """Two crashed rollouts (same failure, different paths), a truncated one, a success, a low-reward success."""
    return [
        *crashed_rollout("r-crash-1", task_id="t1", path="/repo/src/a1.py", tries=3),
        *crashed_rollout("r-crash-2", task_id="t2", path="/repo/src/b22.py", tries=5),
        *finished_rollout("r-trunc", task_id="t3", reward=0.0, truncated=True),
        *finished_rollout("r-ok", task_id="t1", reward=1.0),
        *finished_rollout("r-low", task_id="t2", reward=0.2),
    ]


def build_app() -> typer.Typer:
    """Only the commands under test, registered the way trajlake.cli registers every module."""
    app = typer.Typer(cls=Shell, pretty_exceptions_enable=False)  # the shell's error handler

    @app.callback()
    def _root() -> None:
        """trajlake"""

    workbench.register(app)
    return app


def by_rollout(extraction) -> dict:
    return {p.rollout_id: p for p in extraction.packets}


def test_packet_contains_the_failing_step_constraints_and_outcome(failing_lake: Lake) -> None:
    x = extract_failures(failing_lake, FailureConfig())
    assert (x.selected, x.failed) == (5, 3)
    packet = by_rollout(x)["r-crash-1"]
    assert packet.failing_step.seq == 3 and packet.failing_step.kind == "tool.call"
    assert packet.failing_step.name == "bash" and "FileNotFoundError" in packet.failing_step.error
    assert [s.seq for s in packet.steps if s.failing] == [3]
    assert [s.seq for s in packet.steps] == [1, 3, 5]  # the step before and the one after
    assert packet.constraints == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    assert packet.outcome.status == "failed" and packet.outcome.reward == 0.0
    assert packet.outcome.rewards == [{"name": "pass", "value": 0.0, "source": "grader"}]
    assert packet.signature.harness.model_dump() == HARNESS
    assert packet.signature.error == "FileNotFoundError: <str> missing after <n> tries"
    assert packet.signals.tool_errors == 1 and packet.signals.upstream_retries == 2
    assert packet.signals.harness_retries == 0
    assert packet.signals.step_limit_hit is False


def test_truncated_rollout_fails_at_the_step_limit(failing_lake: Lake) -> None:
    packet = by_rollout(extract_failures(failing_lake, FailureConfig(context=0)))["r-trunc"]
    assert packet.failing_step.seq == 5 and packet.failing_step.finish_reason == "length"
    assert [s.seq for s in packet.steps] == [5]
    assert packet.signals.step_limit_hit and packet.signature.reason == "reached max_steps=<n>"
    assert (packet.signals.harness_retries, packet.signals.upstream_retries) == (1, 0)
    assert packet.constraints == [{"role": "prompt", "content": "Complete: " + TASK}]


def test_packets_are_byte_identical_across_runs(failing_lake: Lake, tmp_path: Path) -> None:
    first, second = (extract_failures(failing_lake, FailureConfig(group=g)) for g in ("rollout", "rollout"))
    write_jsonl(first, tmp_path / "a.jsonl")
    write_jsonl(second, tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert first.extraction_id == second.extraction_id
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in lines] == ["r-crash-1", "r-crash-2", "r-trunc"]
    assert "2026" not in first.extraction_id and all(p.packet_id.startswith("fp-") for p in first.packets)


def test_packet_id_changes_with_the_content(failing_lake: Lake) -> None:
    short = extract_failures(failing_lake, FailureConfig(excerpt_chars=5))
    long = extract_failures(failing_lake, FailureConfig(excerpt_chars=50))
    assert {p.packet_id for p in short.packets}.isdisjoint(p.packet_id for p in long.packets)
    assert short.extraction_id != long.extraction_id


def test_clusters_group_rollouts_that_failed_the_same_way(failing_lake: Lake) -> None:
    x = extract_failures(failing_lake, FailureConfig(group="cluster"))
    assert [(c.rollouts, c.signature.status) for c in x.packets] == [(2, "failed"), (1, "truncated")]
    crash = x.packets[0]
    assert crash.rollout_ids == ["r-crash-1", "r-crash-2"] and crash.task_ids == ["t1", "t2"]
    assert crash.example.rollout_id == "r-crash-1" and crash.signature.failing_tool == "bash"
    assert crash.mean_reward == 0.0 and x.packets[1].step_limit_hits == 1


def test_reward_rule_selects_low_reward_rollouts(failing_lake: Lake) -> None:
    x = extract_failures(failing_lake, FailureConfig(success=SuccessRule.parse("reward>=0.5")))
    assert sorted(by_rollout(x)) == ["r-crash-1", "r-crash-2", "r-low", "r-trunc"]
    low = by_rollout(x)["r-low"]
    assert low.outcome.status == "succeeded" and low.outcome.reward == 0.2
    assert low.failing_step.seq == 3  # no error, no length stop: the last step


def test_selection_filters_by_task_set(failing_lake: Lake) -> None:
    x = extract_failures(failing_lake, FailureConfig(selection=Selection(tasks=("t2",))))
    assert (x.selected, sorted(by_rollout(x))) == (2, ["r-crash-2"])


def test_delta_table_holds_each_extraction_once(fresh_lake: Lake) -> None:
    x = extract_failures(fresh_lake, FailureConfig(group="cluster"))
    assert append_packets(fresh_lake, x) is not None
    assert append_packets(fresh_lake, extract_failures(fresh_lake, FailureConfig(group="cluster"))) is None
    table = fresh_lake.read(FAILURE_PACKETS_TABLE).sort_by("packet_id")
    assert table.num_rows == len(x.packets) == 2
    assert sorted(table.column("packet").to_pylist()) == sorted(packet_lines(x))
    assert set(table.column("extraction_id").to_pylist()) == {x.extraction_id}
    assert sorted(table.column("rollouts").to_pylist()) == [1, 2]
    append_packets(fresh_lake, extract_failures(fresh_lake, FailureConfig()))
    assert fresh_lake.read(FAILURE_PACKETS_TABLE).num_rows == 2 + 3  # another extraction: appended beside the first


def test_oversized_and_malformed_inputs_are_cut_not_carried(lake: Lake) -> None:
    huge = "Traceback:\n" + "x" * 200_000 + "\nMemoryError: at 0xdeadbeef12 " + "y" * 500
    write_events(lake, crashed_rollout("r-huge", task_id="t1", path="/a/b", tries=1, error=huge))
    packet = extract_failures(lake, FailureConfig(excerpt_chars=20)).packets[0]
    assert len(packet.failing_step.error) == ERROR_CHARS and packet.failing_step.error.endswith("y" * 50)
    assert len(packet.signature.error) <= ERROR_SIGNATURE_CHARS
    assert all(len(s.output or "") <= 20 and len(s.input or "") <= 20 for s in packet.steps)
    assert len(packet_lines(extract_failures(lake, FailureConfig(excerpt_chars=20)))[0]) < 8_000


@pytest.mark.parametrize(("messages", "prompt", "expected"), [
    ("not json", None, []),
    ('{"role": "user"}', "p", [{"role": "prompt", "content": "p"}]),
    ('[1, "x", {"role": 5}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]', None,
     [{"role": "user", "content": '[{"text":"hi","type":"text"}]'}]),
    ('[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]', None,
     [{"role": "system", "content": "b"}, {"role": "user", "content": "a"}]),
])
def test_constraints_from_malformed_messages(messages, prompt, expected) -> None:
    assert first_messages(messages, prompt, chars=100) == expected


def test_normalise_keeps_the_shape_of_an_error() -> None:
    assert normalise("Timeout after 30.5s on 'db-7' (id 1b4e28ba-2fa1-11d2-883f-0016d3cca427)") == \
        "Timeout after <n>s on <str> (id <id>)"
    assert normalise("  \n ") is None and normalise(None) is None
    assert normalise("open /var/lib/x/y.txt failed") == "open <path> failed"


def test_empty_or_missing_lake_and_unknown_harness(tmp_path: Path, failing_lake: Lake) -> None:
    with pytest.raises(LakeMissing):
        extract_failures(Lake(str(tmp_path / "absent")), FailureConfig())
    empty = Lake(str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(NothingSelected):
        extract_failures(empty, FailureConfig())
    with pytest.raises(NothingSelected, match="--harness"):
        extract_failures(failing_lake, FailureConfig(selection=Selection(harnesses=("swe-agent@9",))))
    with pytest.raises(BadFilter, match="Columns you can use"):
        extract_failures(failing_lake, FailureConfig(selection=Selection(where="no_such_column > 1")))
    outside = str(tmp_path / "secret.txt")
    Path(outside).write_text("x")
    with pytest.raises(BadFilter, match="disabled by configuration"):  # the predicate is user SQL: sandboxed
        extract_failures(failing_lake, FailureConfig(selection=Selection(
            where=f"(SELECT count(*) FROM read_text('{outside}')) > 0")))


@pytest.mark.parametrize("fields", [
    {"context": -1}, {"context": "many"}, {"excerpt_chars": 10**9}, {"group": "task"}, {"colour": "red"},
    {"success": {"kind": "reward", "threshold": "high"}}, {"selection": {"since": "2026-01-01T00:00:00"}},
])
def test_bad_config_is_refused(fields: dict) -> None:
    with pytest.raises(ValidationError):
        FailureConfig(**fields)


@pytest.mark.parametrize("text", ["", "ok", "reward>0.5", "reward>=", "reward>=abc", "reward>=nan",
                                  "reward>=1,reward>=2", "status,status", "score>=1"])
def test_bad_success_rule_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="success rule"):
        SuccessRule.parse(text)


def test_success_rule_round_trips() -> None:
    for text in ("status", "reward>=0.5", "status,reward>=1"):
        assert SuccessRule.parse(text).describe() == text


def test_cli_writes_jsonl_and_the_table(fresh_lake: Lake, tmp_path: Path) -> None:
    out = tmp_path / "packets.jsonl"
    runner = CliRunner()
    args = ["failures", "--lake", fresh_lake.root, "--cluster", "--output", str(out)]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "3 of 5 selected rollouts did not succeed" in result.output and "version 0" in result.output
    assert len(out.read_text().splitlines()) == 2
    again = runner.invoke(build_app(), [*args, "--json"])
    summary = json.loads(again.output)
    assert summary["already_stored"] is True and summary["packets"] == 2
    stdout = runner.invoke(build_app(), ["failures", "--lake", fresh_lake.root, "--no-store", "-o", "-"])
    assert stdout.stdout.splitlines() == packet_lines(extract_failures(fresh_lake, FailureConfig()))


@pytest.mark.parametrize(("args", "message"), [
    (["--harness", "nope"], "no finished rollout"),
    (["--success", "reward>"], "success rule"),
    (["--since", "yesterday"], "not an RFC 3339 time"),
    (["--where", "1; DROP TABLE x"], "one SQL predicate"),
    (["--json", "--output", "-"], "both write to stdout"),
])
def test_cli_bad_input_exits_with_a_message(failing_lake: Lake, args: list[str], message: str) -> None:
    result = CliRunner().invoke(build_app(), ["failures", "--lake", failing_lake.root, *args])
    assert result.exit_code == 1 and message in " ".join(result.output.split())


def test_cli_unwritable_output_exits_with_a_message(failing_lake: Lake, tmp_path: Path) -> None:
    target = tmp_path / "no-such-folder" / "packets.jsonl"
    result = CliRunner().invoke(build_app(), ["failures", "--lake", failing_lake.root, "--no-store", "-o", str(target)])
    assert result.exit_code == 1 and "pick a writable --output path" in " ".join(result.output.split())
