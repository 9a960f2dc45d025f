"""The dataset and lineage commands through the real CLI, with a real broker for dataset.version."""

from __future__ import annotations

import json

import pytest
from kafka import KafkaConsumer
from typer.testing import CliRunner

from schemas.control import CONTROL_ADAPTER, CONTROL_TOPIC
from tests.pipelines.datasets.test_build import agent
from trajlake.cli import build_app


@pytest.fixture
def cli(lake, rows, monkeypatch):
    agent(rows, "r1", "t1", 1.0, split=True)
    agent(rows, "r2", "t1", 0.0)
    rows.flush()
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    monkeypatch.delenv("TRAJLAKE_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    return lambda *args: runner.invoke(build_app(), list(args))


def test_build_show_list_diff_export_lineage(cli, tmp_path):
    built = cli("build-dataset", "ds")
    assert built.exit_code == 0, built.output
    assert "ds@0" in built.output and "samples per rollout" in built.output and "merge breaks: other" in built.output
    assert "built without publishing" in built.output
    assert cli("build-dataset", "ds", "--advantage", "mean", "--task", "t1", "--since", "2026-11-01T00:00:00Z",
               "--until", "2026-11-02T00:00:00+02:00").exit_code == 0
    shown = cli("datasets", "show", "ds@0", "--json")
    assert json.loads(shown.output)["advantage"] == "grpo"
    listed = cli("datasets", "list")
    assert listed.exit_code == 0 and listed.output.count("ds ") >= 2
    diff = cli("datasets", "diff", "ds@0", "ds@1")
    assert "config advantage: grpo -> mean" in diff.output and "same content" not in diff.output
    exported = cli("datasets", "export", "ds@1", str(tmp_path / "out"))
    assert exported.exit_code == 0 and (tmp_path / "out" / "data" / "train-00000.parquet").exists()
    traced = cli("lineage", "ds@1")
    assert traced.exit_code == 0 and "2 rollout(s)" in traced.output and "kafka offsets" in traced.output
    as_json = json.loads(cli("lineage", "r1", "--json").output)
    assert [d["version"] for d in as_json["datasets"]] == [0, 1]
    run = json.loads(cli("lineage", "ds@1", "--openlineage").output)
    assert run["eventType"] == "COMPLETE" and run["outputs"][0]["facets"]["version"]["datasetVersion"] == "1"
    assert {i["name"].rsplit("/", 1)[-1] for i in run["inputs"]} >= {"llm_requests", "rewards"}
    assert {i["namespace"] for i in run["inputs"]} == {"file"}  # the OpenLineage naming spec
    assert cli("lineage", "r1", "--openlineage").exit_code == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build-dataset", "ds", "--advantage", "ppo"], "advantage"),
        (["build-dataset", "ds", "--since", "yesterday"], "since"),
        (["build-dataset", "ds", "--until", "soon"], "not an RFC 3339 time"),
        (["build-dataset", "ds", "--reward-rule", "weighted:a"], "NAME=NUMBER"),
        (["build-dataset", "ds", "--where", "nope = 1"], "Columns you can use"),
        (["build-dataset", "ds", "--where", "x" * 3000], "where"),
        (["build-dataset", "ds", "--task", "none", "--where", "1=1) or (1=1"], "parentheses do not balance"),
        (["build-dataset", "ds", "--task", "none", "--where", "steps > 0 /* ) or (1=1 */"], "no comments"),
        (["failures", "--tenant", "nobody", "--no-store", "--where", "1=1) or (1=1"], "parentheses do not balance"),
        (["build-dataset", "ds", "--status", "done"], "statuses"),
        (["build-dataset", "ds", "--batch-tokens", "0"], "batch-tokens"),
        (["build-dataset", "a/b"], "dataset name"),
        (["build-dataset", "ds", "--tokenizer", "/no/such/tokenizer"], "--tokenizer /no/such/tokenizer: no such folder"),
        (["build-dataset", "ds", "--task", "none"], "no rollout is left"),
        (["datasets", "show", "nope"], "no dataset has been built"),
        (["lineage", "nope"], "is no dataset version"),
    ],
)
def test_bad_input_gets_a_clear_error(cli, args, message):
    result = cli(*args)
    assert result.exit_code != 0
    assert message in result.output
    assert "a bug" not in result.output, result.output


def test_a_folder_without_a_tokenizer_is_bad_input(cli, tmp_path):
    result = cli("build-dataset", "ds", "--tokenizer", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "no tokenizer could be loaded" in result.output and "a bug" not in result.output, result.output


def test_a_version_past_int64_is_not_in_the_registry(cli):
    assert cli("build-dataset", "ds").exit_code == 0
    huge = "9" * 20
    for args in (["lineage", f"ds@{huge}"], ["datasets", "show", f"ds@{huge}"], ["datasets", "diff", "ds@0", f"ds@{huge}"]):
        result = cli(*args)
        assert result.exit_code == 1 and f"version {huge} is not in the registry" in result.output, result.output


def test_ctrl_c_after_the_commit_names_the_committed_version(cli, monkeypatch):
    """A Ctrl-C between the registry commit and the version line (simulated where that line is printed)."""
    def stopped(*_args, **_options):
        raise KeyboardInterrupt
    monkeypatch.setattr("trajlake.commands.datasets.render_manifest", stopped)
    result = cli("build-dataset", "ds")
    assert result.exit_code == 130, result.output
    assert "stopped by Ctrl-C after ds@0 was committed" in result.output, result.output
    monkeypatch.setattr("pipelines.lineage.openlineage.traced_build", stopped)  # a stop before the commit
    result = cli("build-dataset", "ds")
    assert result.exit_code == 130 and "committed" not in result.output, result.output  # ds@0 is older


def test_a_predicate_with_parentheses_and_quoted_parentheses_still_selects(cli):
    built = cli("build-dataset", "ds", "--where", "(steps > 0 AND task_id <> ')') OR (tenant = '(')")
    assert built.exit_code == 0, built.output
    assert "ds@0" in built.output


def test_build_publishes_dataset_version_on_the_control_topic(cli, broker):
    built = cli("build-dataset", "ds", "--bootstrap-servers", broker.bootstrap_servers)
    assert built.exit_code == 0, built.output
    assert f"published dataset.version to {CONTROL_TOPIC}" in built.output
    consumer = KafkaConsumer(CONTROL_TOPIC, bootstrap_servers=broker.bootstrap_servers,
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    try:
        message = next(iter(consumer))
    finally:
        consumer.close()
    event = CONTROL_ADAPTER.validate_json(message.value)
    assert message.key == b"ds" and (event.type, event.dataset, event.version) == ("dataset.version", "ds", 0)
    assert event.content_hash == event.manifest["content_hash"]


def test_an_unreachable_broker_still_builds(cli):
    built = cli("build-dataset", "ds", "--bootstrap-servers", "127.0.0.1:9")
    assert built.exit_code == 0, built.output
    assert "unreachable" in built.output and "ds@0" in built.output
