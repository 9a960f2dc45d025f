"""Today's code reads lakes written by older versions (``tests/fixtures/lake-v*``, see make_pinned_lake.py).

The tables are a public format: an upgrade must not orphan a user's lake.
Each pinned lake is copied to a temp folder first (readers never write, but
rebuild does) and read the way users read it: SQL views, a rollout's
trajectory, the dataset, lineage, the bookkeeping tables, a rebuild of the
typed tables from ``events``. A fresh lake written by today's code must hold
exactly the catalogue's tables, and every pinned table's columns must still
be in the catalogue with the same types.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pipelines.datasets.registry import list_versions, read_dataset
from pipelines.lineage.trace import lineage
from schemas.table_names import ADDED_COLUMNS
from schemas.tables import CATALOGUE, INGESTED_TABLES, TYPED_TABLES, catalogued, dataset_table
from store.commit import MarkedTable, resume_offsets
from store.forget import forgotten_dataset_versions
from store.identity import lake_id
from store.lake import Lake, list_tables, table_schema
from store.rebuild import rebuild_typed_tables
from store.runs import RunsTable, RunStatus
from store.sql import run_query
from store.trajectory import load_trajectory
from tests.fixtures.make_pinned_lake import CHECKPOINT, DATASET, GROUP, TOPIC, make_pinned_lake
from trainer.dataset import DatasetRef, load_samples
from trainer.leases import history as lease_history
from trainer.records import list_checkpoints, run_states
from trajlake.cli import build_app

FIXTURES = Path(__file__).parent / "fixtures"
PINNED = sorted(p for p in FIXTURES.glob("lake-v*") if p.is_dir())


def test_a_pinned_lake_is_committed() -> None:
    assert PINNED, f"no pinned lake under {FIXTURES}: write one with tests/fixtures/make_pinned_lake.py"


@pytest.fixture(params=PINNED, ids=lambda p: p.name)
def pinned(request, tmp_path) -> Lake:
    copy = tmp_path / request.param.name
    shutil.copytree(request.param, copy)
    return Lake(str(copy))


def catalogue_name(table: str) -> str:
    return dataset_table("<name>") if table.startswith(dataset_table("")) else table


def test_the_sql_views_answer(pinned: Lake) -> None:
    rollouts = run_query(pinned, "SELECT rollout_id, task_id, status, reward, n_llm_calls, n_tool_calls, "
                                 "n_prompt_tokens, n_response_tokens FROM rollouts ORDER BY rollout_id").to_pylist()
    assert [(r["rollout_id"], r["status"], r["reward"]) for r in rollouts] == [
        ("r1", "succeeded", 1.0), ("r2", "failed", 0.0), ("r3", "succeeded", 0.5)]
    assert {(r["n_llm_calls"], r["n_tool_calls"], r["n_prompt_tokens"], r["n_response_tokens"]) for r in rollouts} \
        == {(2, 1, 17, 5)}
    calls = run_query(pinned, "SELECT prompt_token_ids, response_token_ids, logprobs FROM llm_calls "
                              "WHERE rollout_id = 'r1' ORDER BY seq").to_pylist()
    assert calls[0] == {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "response_token_ids": [7, 8, 9],
                        "logprobs": [-0.5, -0.25, -0.125]}
    assert calls[1]["prompt_token_ids"] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    steps = run_query(pinned, "SELECT rollout_id, error FROM tool_steps ORDER BY rollout_id").to_pylist()
    assert [s["error"] is not None for s in steps] == [False, True, False]
    assert run_query(pinned, "SELECT count(*) AS n FROM quarantine").to_pylist() == [{"n": 1}]
    for table in list_tables(pinned):  # every table has a view that reads
        view = table.replace("/", "__")
        run_query(pinned, f"SELECT * FROM {view}")


def test_a_rollout_reads_step_by_step(pinned: Lake) -> None:
    trajectory = load_trajectory(pinned, "r2", tenant="acme")
    assert [s.kind for s in trajectory.steps] == [
        "rollout.started", "llm.call", "tool.call", "llm.call", "rollout.finished", "reward"]
    assert trajectory.summary.status == "failed" and trajectory.summary.n_tool_errors == 1
    shown = CliRunner().invoke(build_app(), ["rollout", "show", "r1", "--lake", pinned.root], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "r1" in shown.output and "bash" in shown.output


def test_the_dataset_reads_and_trains(pinned: Lake) -> None:
    [version] = list_versions(pinned, DATASET).to_pylist()
    assert (version["version"], version["n_samples"], version["n_rollouts"]) == (0, 3, 3)
    rows = read_dataset(pinned, DATASET).sort_by("rollout_id").to_pylist()
    assert [(r["rollout_id"], r["advantage"]) for r in rows] == [("r1", 1.0), ("r2", -1.0), ("r3", 0.0)]
    assert rows[0]["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    samples = load_samples(pinned, DatasetRef(DATASET), vocab_size=1_000, max_len=64)
    assert sorted(samples.rollout_ids) == ["r1", "r2", "r3"]


def test_lineage_goes_both_ways(pinned: Lake) -> None:
    down = lineage(pinned, f"{DATASET}@0")
    assert sorted(down.rollouts) == ["r1", "r2", "r3"]
    assert {(o["topic"], o["partition"]) for o in down.offset_ranges()} == {(TOPIC, 0)}
    assert [c.checkpoint_id for c in down.checkpoints] == [CHECKPOINT]
    ckpt = lineage(pinned, CHECKPOINT)
    assert ckpt.kind == "checkpoint" and sorted(ckpt.rollouts) == ["r1", "r2", "r3"]
    up = lineage(pinned, "r1", tenant="acme")
    assert [(d.dataset, d.version) for d in up.datasets] == [(DATASET, 0)]
    assert [c.checkpoint_id for c in up.checkpoints] == [CHECKPOINT]


def test_the_bookkeeping_tables_read(pinned: Lake) -> None:
    assert lake_id(pinned) == "pinned-lake"
    [checkpoint] = list_checkpoints(pinned)
    assert (checkpoint.checkpoint_id, checkpoint.dataset_version, checkpoint.config["epochs"]) == (CHECKPOINT, 0, 1)
    assert run_states(pinned)[CHECKPOINT].status == "finished"
    assert [lease.lease_until is None for lease in lease_history(pinned, DATASET, 0)] == [False, True]
    [run] = RunsTable(pinned).current().values()
    assert run.status is RunStatus.SUCCEEDED and run.checkpoint == CHECKPOINT
    audit = run_query(pinned, "SELECT DISTINCT rollouts FROM forget_audit").to_pylist()
    assert audit == [{"rollouts": ["r4"]}] and forgotten_dataset_versions(pinned) == {}
    assert run_query(pinned, "SELECT count(*) AS n FROM events WHERE rollout_id = 'r4'").to_pylist() == [{"n": 0}]
    packets = run_query(pinned, "SELECT kind, rollout_id, status FROM failure_packets").to_pylist()
    assert packets == [{"kind": "rollout", "rollout_id": "r2", "status": "failed"}]


def test_an_ingester_resumes_where_the_pinned_lake_stopped(pinned: Lake) -> None:
    tables = [MarkedTable(pinned, name, schema, group=GROUP, topic=TOPIC) for name, schema in INGESTED_TABLES.items()]
    for table in tables:
        table.load([0])
    assert resume_offsets(tables, [0]) == {0: 31}  # offsets 0..28: the rollouts; 29, 30: invalid, duplicate


def test_the_typed_tables_rebuild_from_events(pinned: Lake) -> None:
    before = {name: pinned.read(name).num_rows for name, _ in TYPED_TABLES.values()}
    views = run_query(pinned, "SELECT * EXCLUDE (first_event_at, last_event_at) FROM rollouts ORDER BY rollout_id")
    assert rebuild_typed_tables(pinned, group=GROUP) == before
    after = run_query(pinned, "SELECT * EXCLUDE (first_event_at, last_event_at) FROM rollouts ORDER BY rollout_id")
    assert after.equals(views)


def test_pinned_columns_are_still_in_the_catalogue(pinned: Lake) -> None:
    for table in list_tables(pinned):
        pinned_schema = pa.schema(pinned.dataset(table).schema)
        current = CATALOGUE[catalogue_name(table)].schema
        for field in pinned_schema:
            assert field.name in current.names, f"{table}.{field.name} left the catalogue: old lakes lose it"
            assert current.field(field.name).type == field.type, f"{table}.{field.name} changed type"


def test_todays_writers_write_exactly_the_catalogue(tmp_path) -> None:
    """A lake written by this version holds every catalogued table and nothing else.

    A new table must be declared in ``schemas/tables.py`` (``Lake`` refuses to
    write one that is not) and written by make_pinned_lake.py, then pinned as
    the next ``lake-v<N>``.
    """
    written = list_tables(make_pinned_lake(tmp_path / "lake"))
    assert all(catalogued(t) for t in written), written
    assert {catalogue_name(t) for t in written} == set(CATALOGUE)


def test_columns_added_since_are_declared(pinned: Lake) -> None:
    """An ingested table's column that a pinned lake lacks must be listed in ADDED_COLUMNS (SQL reads it as NULL)."""
    for name, schema in INGESTED_TABLES.items():
        if pinned.exists(name):
            old = set(table_schema(pinned.table(name)).names)
            assert {f.name for f in schema if f.name not in old} <= set(ADDED_COLUMNS.get(name, ())), name
