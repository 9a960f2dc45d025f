"""``--json`` on tables, datasets list, datasets diff and retention show: machine-readable, same facts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.pipelines.conftest import LakeRows
from tests.pipelines.datasets.test_build import agent
from tests.store.test_forget import T0, ingest, rollout_events
from trajlake.cli import build_app


def cli(lake, *args: str, env: dict | None = None):
    result = CliRunner().invoke(build_app(), [*args, "--lake", lake.root],
                                env={"TRAJLAKE_BOOTSTRAP_SERVERS": None, "COLUMNS": "200", **(env or {})})
    assert result.exit_code == 0, result.output
    return result.output


def test_tables_and_datasets_as_json(lake):
    rows = LakeRows(lake)
    agent(rows, "r1", "t1", 1.0, split=True)
    agent(rows, "r2", "t1", 0.0)
    rows.flush()
    cli(lake, "build-dataset", "ds")
    cli(lake, "build-dataset", "ds", "--advantage", "mean")

    views = {v["name"]: v for v in map(json.loads, cli(lake, "tables", "--json").splitlines())}
    delta = [v for v in views.values() if v["kind"] == "delta"]
    assert delta and all(v["version"] is not None and v["table"] for v in delta)
    assert views["llm_calls"]["rows"] == 5 and set(views["llm_calls"]) == {"name", "kind", "rows", "table", "version"}

    versions = [json.loads(line) for line in cli(lake, "datasets", "list", "--json").splitlines()]
    assert [(v["dataset"], v["version"]) for v in versions] == [("ds", 0), ("ds", 1)]
    assert versions[0]["created_at"].endswith("+00:00") and versions[0]["n_rollouts"] == 2

    diff = json.loads(cli(lake, "datasets", "diff", "ds@0", "ds@1", "--json"))
    assert diff["a"] == "ds@0" and diff["config_changes"]["advantage"] == ["grpo", "mean"]
    assert diff["same_content"] is False and diff["rollouts_added"] == []


def test_retention_show_as_json(lake):
    ingest(lake, rollout_events("acme", "old", at=T0))
    out = cli(lake, "retention", "show", "--json", env={"TRAJLAKE_RETENTION_DAYS": '{"acme": 1, "*": 400}'})
    assert [json.loads(line) for line in out.splitlines()] == [
        {"tenant": "*", "days": 400, "expired_rollouts": 0},
        {"tenant": "acme", "days": 1, "expired_rollouts": 1},
    ]
