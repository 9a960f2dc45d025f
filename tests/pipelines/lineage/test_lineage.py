"""Lineage both ways, on lakes written row by row and on a lake built by the real ingester."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ingest.ingester import IngesterConfig, ingest_until_idle
from ingest.producer import EventProducer
from devkit.workload import WorkloadConfig, generate_events
from pipelines import AmbiguousId, BuildConfig, LineageNotFound, build_dataset
from pipelines.lineage.trace import lineage
from schemas.tables import TS
from tests.pipelines.datasets.test_build import agent
from trajlake.cli import build_app
from trajlake.commands.lineage import render

CHECKPOINTS = pa.schema([pa.field("checkpoint_id", pa.string()), pa.field("dataset", pa.string()),
                         pa.field("dataset_version", pa.int64()), pa.field("parent_checkpoint_id", pa.string()),
                         pa.field("base_model", pa.string()), pa.field("created_at", TS)])
TRAIN_RUNS = pa.schema([pa.field("run_id", pa.string()), pa.field("status", pa.string()), pa.field("attempt", pa.int32()),
                        pa.field("step", pa.int64()), pa.field("host", pa.string()), pa.field("pid", pa.int64()),
                        pa.field("ts", TS)])


def ckpt_row(checkpoint_id: str, version: int, parent: str | None = None, minute: int = 0) -> dict:
    return {"checkpoint_id": checkpoint_id, "dataset": "ds", "dataset_version": version, "parent_checkpoint_id": parent,
            "base_model": "/models/base", "created_at": datetime(2026, 1, 1, 0, minute, tzinfo=timezone.utc)}


def test_dataset_version_down_to_events_and_back_up(lake, rows):
    agent(rows, "r1", "t", 1.0)
    agent(rows, "r2", "t", 0.0)
    rows.flush()
    build_dataset(lake, "ds")
    down = lineage(lake, "ds@0")
    assert (down.kind, down.rollouts) == ("dataset", ["r1", "r2"])
    # 2 calls x (request + response) + 1 reward per rollout, each with its Kafka coordinates
    assert down.events.num_rows == 10
    assert set(down.events["type"].to_pylist()) == {"llm.request", "llm.response", "reward"}
    assert down.offset_ranges() == [{"topic": "trajlake.events", "partition": 0, "first": 3, "last": 14, "events": 10}]
    assert down.sources["llm_requests"] == 0
    for event_id in down.events["event_id"].to_pylist():
        up = lineage(lake, event_id)
        assert up.kind == "event" and [(d.dataset, d.version, d.used_event) for d in up.datasets] == [("ds", 0, True)]
    started = lineage(lake, "r1").events.filter(pa.compute.equal(lineage(lake, "r1").events["type"], "rollout.started"))
    assert [(d.dataset, d.used_event) for d in lineage(lake, started["event_id"][0].as_py()).datasets] == [("ds", False)]


def test_a_rollout_is_traced_to_every_version_and_checkpoint(lake, rows):
    agent(rows, "r1", "t", 1.0)
    agent(rows, "r2", "u", 0.0)
    rows.flush()
    build_dataset(lake, "ds")
    build_dataset(lake, "ds", BuildConfig(advantage="raw"))
    build_dataset(lake, "only_u", BuildConfig(selection={"tasks": ["u"]}))
    lake.append("checkpoints", pa.Table.from_pylist([ckpt_row("ck-1", 1)], schema=CHECKPOINTS))
    up = lineage(lake, "r1")
    assert [(d.dataset, d.version) for d in up.datasets] == [("ds", 0), ("ds", 1)]
    assert [(c.checkpoint_id, c.version) for c in up.checkpoints] == [("ck-1", 1)]
    assert [(d.dataset, d.version) for d in lineage(lake, "r2").datasets] == [("ds", 0), ("ds", 1), ("only_u", 0)]
    checkpoint = lineage(lake, "ck-1")
    assert (checkpoint.kind, checkpoint.rollouts, checkpoint.datasets[0].version) == ("checkpoint", ["r1", "r2"], 1)
    assert lineage(lake, "ds").subject == "ds@1"  # a bare name is its latest version


def test_a_checkpoint_shows_its_parent_version_and_resumes_and_is_used_only_by_its_children(lake, rows):
    agent(rows, "r1", "t", 1.0)
    rows.flush()
    build_dataset(lake, "ds")
    build_dataset(lake, "ds", BuildConfig(advantage="raw"))
    lake.append("checkpoints", pa.Table.from_pylist([
        ckpt_row("ck-a", 0), ckpt_row("ck-b", 1, parent="ck-a", minute=1),
        ckpt_row("ck-sibling", 1, minute=2),  # same version, other run: not trained from ck-b
        ckpt_row("ck-c", 1, parent="ck-b", minute=3),
    ], schema=CHECKPOINTS))
    at = [datetime(2026, 1, 1, 0, m, tzinfo=timezone.utc) for m in range(3)]
    lake.append("train_runs", pa.Table.from_pylist([
        {"run_id": "ck-b", "status": "started", "attempt": 1, "step": 0, "host": "h1", "pid": 11, "ts": at[0]},
        {"run_id": "ck-b", "status": "started", "attempt": 2, "step": 4, "host": "h2", "pid": 22, "ts": at[1]},
        {"run_id": "ck-b", "status": "finished", "attempt": 2, "step": 9, "host": "h2", "pid": 22, "ts": at[2]},
    ], schema=TRAIN_RUNS))
    b = lineage(lake, "ck-b")
    assert (b.kind, b.parent_checkpoint, [(d.dataset, d.version) for d in b.datasets]) == ("checkpoint", "ck-a", [("ds", 1)])
    assert [c.checkpoint_id for c in b.checkpoints] == ["ck-c"]  # not itself, not its sibling on ds@1
    assert [(r["step"], r["host"], r["attempt"]) for r in b.resumes] == [(4, "h2", 2)]
    a = lineage(lake, "ck-a")
    assert (a.parent_checkpoint, a.base_model, a.resumes) == (None, "/models/base", [])
    assert [c.checkpoint_id for c in a.checkpoints] == ["ck-b"]
    assert [c.checkpoint_id for c in lineage(lake, "ck-c").checkpoints] == []
    assert [c.checkpoint_id for c in lineage(lake, "ds@1").checkpoints] == ["ck-b", "ck-c", "ck-sibling"]
    console = Console(record=True, width=200)
    console.print(render(b, limit=5))
    text = console.export_text()
    assert "trained on ds@1 from checkpoint ck-a" in text and "resumed 1 time(s)" in text and "at step 4" in text
    assert "used by 1 checkpoint(s) trained from it" in text and "ck-sibling" not in text


def test_unknown_ids_are_refused_with_a_hint(lake, rows):
    agent(rows, "r1", "t", 1.0)
    rows.flush()
    with pytest.raises(LineageNotFound, match="trajlake datasets list"):
        lineage(lake, "no-such-thing")
    with pytest.raises(LookupError, match="no dataset has been built"):
        lineage(lake, "ds@3")


def test_ids_two_tenants_share_are_looked_up_per_tenant(lake, rows, monkeypatch):
    agent(rows, "r1", "t", 1.0, tenant="acme")
    shared = rows.rows["rewards"][-1]["event_id"]
    agent(rows, "r2", "t", 0.0, tenant="beta")
    rows.rows["rewards"][-1]["event_id"] = shared  # beta's producer picked the same event id
    rows.rollout("rs", "t", tenant="acme")
    rows.rollout("rs", "t", tenant="beta")
    rows.flush()
    build_dataset(lake, "ds")
    assert lineage(lake, "ds@0").events.num_rows == 10  # each rollout's own reward, not both twice
    for ref in (shared, "rs"):
        with pytest.raises(AmbiguousId, match="tenants acme, beta: pass --tenant"):
            lineage(lake, ref)
    beta = lineage(lake, shared, tenant="beta")
    assert (beta.rollouts, beta.events["tenant"].to_pylist()) == (["r2"], ["beta"])
    assert [(d.dataset, d.used_event) for d in beta.datasets] == [("ds", True)]
    assert set(lineage(lake, "rs", tenant="acme").events["tenant"].to_pylist()) == {"acme"}
    with pytest.raises(LineageNotFound, match="of tenant 'gamma'"):
        lineage(lake, shared, tenant="gamma")
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    asked = CliRunner().invoke(build_app(), ["lineage", shared])
    assert asked.exit_code == 1 and "pass --tenant" in asked.output and "Traceback" not in asked.output
    picked = CliRunner().invoke(build_app(), ["lineage", shared, "--tenant", "acme", "--json"])
    assert picked.exit_code == 0 and json.loads(picked.output)["rollouts"] == ["r1"]


@pytest.mark.slow
def test_lineage_round_trip_on_a_lake_built_by_the_ingester(broker, topic, group, lake):
    config = WorkloadConfig(tasks=3, rollouts_per_task=3, seed=11, min_calls=3, max_calls=6, max_context_tokens=800,
                            late_reward_rate=0.0)
    with EventProducer(broker.bootstrap_servers, topic=topic) as producer:
        producer.send_many(generate_events(config))
    ingest_until_idle(IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                     group=group, dlq_topic=""), idle_s=2)
    result = build_dataset(lake, "ingested")
    assert result.manifest["counts"]["rollouts"]["in_dataset"] > 0
    down = lineage(lake, f"ingested@{result.version}")
    # every event the dataset used is in the ingester's events table at the same Kafka coordinates
    logged = {r["event_id"]: (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"])
              for r in lake.read("events", columns=["event_id", "kafka_topic", "kafka_partition", "kafka_offset"])
              .to_pylist()}
    used = down.events.to_pylist()
    assert used and all(logged[e["event_id"]] == (topic, e["kafka_partition"], e["kafka_offset"]) for e in used)
    assert sum(r["events"] for r in down.offset_ranges()) == len(used)
    # and back up: each rollout and each used event leads to this version
    for rollout_id in down.rollouts:
        assert [(d.dataset, d.version) for d in lineage(lake, rollout_id).datasets] == [("ingested", result.version)]
    assert lineage(lake, used[0]["event_id"]).datasets[0].used_event is True
    samples = lake.read("datasets/ingested", columns=["call_ids"])["call_ids"].to_pylist()
    assert len({c for ids in samples for c in ids}) == sum(len(ids) for ids in samples)  # no call trained twice
    assert datetime.fromisoformat(result.manifest["built_at"]) <= datetime.now(timezone.utc)
