"""Every lake-touching command on an ``s3://`` lake (the moto server), run as a user would.

One lake is built once for the module by ``trajlake ingest`` from the
embedded broker; each command then runs as a subprocess with only the
``AWS_*`` settings pointing at the object store. Commands that rewrite files
(forget, compact, rebuild) run last, and the readers run again after them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from store.lake import Lake
from tests.ingest.ingester_support import produce, stream


def trajlake(env: dict[str, str], *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajlake.cli", *args], env=env, input=input,
                          capture_output=True, text=True, timeout=300)


def ok(env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = trajlake(env, *args, input=input)
    assert result.returncode == 0, f"{args}: rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def s3(s3_server, broker):
    """(env, lake root, rollout ids) of an s3:// lake filled by ``trajlake ingest``."""
    root = f"s3://{s3_server.new_bucket()}/lake"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "TRAJLAKE_"))}
    env.update(s3_server.env, TRAJLAKE_LAKE=root)
    topic = "objstore-events"
    broker.create_topic(topic, partitions=2)
    sent = list(stream(6, seed=3))
    produce(broker.bootstrap_servers, topic, sent)
    ok(env, "ingest", "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
       "--partitions", "0,1", "--stop-after-idle-s", "2")
    rollouts = sorted({e["rollout_id"] for e in sent})
    return env, root, rollouts


def test_ingest_wrote_every_event_to_the_object_store(s3) -> None:
    env, root, rollouts = s3
    lake = Lake(root, storage_options={k: v for k, v in env.items() if k.startswith("AWS_")} | {
        "aws_conditional_put": "etag"})
    assert sorted(set(lake.read("events", columns=["rollout_id"]).column("rollout_id").to_pylist())) == rollouts


def test_sql_and_tables_read_the_object_store(s3) -> None:
    env, _, rollouts = s3
    out = ok(env, "sql", "SELECT count(*) AS n FROM rollouts", "--format", "json")
    assert json.loads(out.splitlines()[0])["n"] == len(rollouts)
    assert "llm_calls" in ok(env, "tables")


def test_rollout_show_failures_and_compare(s3) -> None:
    env, _, rollouts = s3
    assert rollouts[0] in ok(env, "rollout", "show", rollouts[0], "--json")
    ok(env, "failures")
    harness = json.loads(ok(env, "sql", "SELECT harness_name, harness_version FROM rollouts LIMIT 1",
                            "--format", "json").splitlines()[0])
    arm = f"{harness['harness_name']}@{harness['harness_version']}"
    result = trajlake(env, "compare", arm, arm)
    assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr


def test_build_dataset_list_show_and_lineage(s3) -> None:
    env, _, _ = s3
    ok(env, "build-dataset", "objstore", "--include-unfinished")
    ok(env, "datasets", "list")
    ok(env, "datasets", "show", "objstore@1", "--json")
    ok(env, "lineage", "objstore@1", "--json")


def test_rewrites_then_every_reader_again(s3) -> None:
    env, _, rollouts = s3
    ok(env, "forget", "--tenant", "default", "--rollout", rollouts[0], "--yes", "--reason", "test")
    ok(env, "compact", "--vacuum-hours", "0")
    ok(env, "rebuild")
    out = ok(env, "sql", "SELECT count(*) AS n FROM rollouts", "--format", "json")
    assert json.loads(out.splitlines()[0])["n"] == len(rollouts) - 1
    ok(env, "tables")
    ok(env, "rollout", "show", rollouts[1], "--json")
    ok(env, "lineage", "objstore@1", "--json")
