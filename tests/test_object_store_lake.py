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
import time
import urllib.request
from pathlib import Path

import pytest

from devkit.ports import free_port
from schemas.tables import SAMPLES
from store.lake import Lake
from tests.ingest.ingester_support import produce, stream
from devkit.synthetic import synthetic_samples


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


def lake_of(env: dict[str, str], root: str) -> Lake:
    from store.storage import storage_options

    return Lake(root, storage_options=storage_options(root, env))


def test_ingest_wrote_every_event_to_the_object_store(s3) -> None:
    env, root, rollouts = s3
    events = lake_of(env, root).read("events", columns=["rollout_id"])
    assert sorted(set(events.column("rollout_id").to_pylist())) == rollouts


def test_sql_and_tables_read_the_object_store(s3) -> None:
    env, _, rollouts = s3
    out = ok(env, "sql", "SELECT count(*) AS n FROM rollouts", "--format", "json")
    assert json.loads(out.splitlines()[0])["n"] == len(rollouts)
    assert "llm_calls" in ok(env, "tables")


def test_rollout_show_failures_and_compare(s3) -> None:
    env, _, rollouts = s3
    assert rollouts[0] in ok(env, "rollout", "show", rollouts[0], "--json")
    ok(env, "failures")
    result = trajlake(env, "compare", "tests@1", "tests@1")  # the harness of ingester_support's events
    assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr


def test_build_dataset_list_show_and_lineage(s3) -> None:
    env, _, _ = s3
    ok(env, "build-dataset", "objstore", "--include-unfinished")
    ok(env, "datasets", "list")
    assert json.loads(ok(env, "datasets", "show", "objstore", "--json"))["version"] == 0
    ok(env, "lineage", "objstore@0", "--json")


def test_train_on_the_tiny_model_reads_its_dataset_from_the_object_store(s3, tiny_model_dir, tmp_path) -> None:
    env, root, _ = s3
    lake_of(env, root).append("datasets/tiny", synthetic_samples(str(tiny_model_dir), groups=2), schema=SAMPLES)
    out = ok(env, "train", "--dataset", "tiny", "--model", str(tiny_model_dir), "--epochs", "1", "--out", str(tmp_path))
    assert "ckpt-tiny-v0" in out


def test_scheduler_once_and_retention(s3) -> None:
    env, _, _ = s3
    assert "succeeded" in ok(env, "scheduler", "--once", "--job", "compact")
    ok({**env, "TRAJLAKE_RETENTION_DAYS": '{"nobody": 1}'}, "retention", "apply")


def test_query_api_answers_sql_from_the_object_store(s3, tmp_path: Path) -> None:
    env, _, rollouts = s3
    keys = tmp_path / "keys"
    keys.write_text("k1=acme\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "trajlake.cli", "query-api", "--host", "127.0.0.1",
                               "--port", str(port), "--keys-file", str(keys)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/sql", data=json.dumps({"sql": "SELECT count(*) AS n FROM rollouts"}).encode(),
            headers={"Authorization": "Bearer k1", "Content-Type": "application/json"})
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    body = json.loads(reply.read())
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(30)
    assert body["rows"] == [[len(rollouts)]]


def test_rewrites_then_every_reader_again(s3) -> None:
    env, _, rollouts = s3
    ok(env, "forget", "--tenant", "acme", "--rollout", rollouts[0], "--yes", "--reason", "test")
    ok(env, "compact", "--vacuum-hours", "0")
    ok(env, "rebuild")
    out = ok(env, "sql", "SELECT count(*) AS n FROM rollouts", "--format", "json")
    assert json.loads(out.splitlines()[0])["n"] == len(rollouts) - 1
    ok(env, "rollout", "show", rollouts[1], "--json")


UNREACHABLE = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ENDPOINT": "http://127.0.0.1:1"}
NO_BUCKET = {"TRAJLAKE_LAKE": "s3://no-such-bucket-here/lake"}


@pytest.mark.parametrize(
    ("settings", "command", "named"),
    [
        (UNREACHABLE, ["sql", "SELECT count(*) FROM rollouts"], "AWS_ENDPOINT_URL"),
        (UNREACHABLE, ["runs", "--json"], "AWS_ENDPOINT_URL"),
        (NO_BUCKET, ["compact"], "bucket 'no-such-bucket-here' does not exist"),
    ],
)
def test_a_wrong_object_store_setting_is_one_clear_line(s3, settings: dict[str, str], command: list[str],
                                                        named: str) -> None:
    result = trajlake({**s3[0], **settings, "COLUMNS": "400"}, *command)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert named in result.stderr + result.stdout
