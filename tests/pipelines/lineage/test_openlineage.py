"""OpenLineage out: a nightly run's events reach an HTTP receiver, each one valid in the client's models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
from openlineage.client.generated.error_message_run import ErrorMessageRunFacet
from openlineage.client.generated.nominal_time_run import NominalTimeRunFacet
from openlineage.client.generated.parent_run import Job as ParentJob
from openlineage.client.generated.parent_run import ParentRunFacet
from openlineage.client.generated.parent_run import Run as ParentRun
from openlineage.client.generated.tags_run import TagsRunFacet, TagsRunFacetFields
from openlineage.client.serde import Serde

from pipelines.lineage.openlineage import LineageConfigError, dataset_id, open_lineage, run_event
from store.lake import Lake
from store.runs import RunStatus
from store.scheduler import Scheduler


from tests.store.lake_builder import sample_rollout, write_events

NIGHT = datetime(2026, 1, 2, 3, tzinfo=timezone.utc)
"""The nightly run of 2026-01-02 02:00 builds from lake_builder's day, 2026-01-01."""


def _dataset(cls, d: dict):
    facets = {"version": DatasetVersionDatasetFacet(datasetVersion=d["facets"]["version"]["datasetVersion"])} \
        if "version" in d.get("facets", {}) else {}
    return cls(namespace=d["namespace"], name=d["name"], facets=facets)


def _run_facets(facets: dict) -> dict:
    known = {
        "parent": lambda f: ParentRunFacet(run=ParentRun(runId=f["run"]["runId"]), job=ParentJob(**f["job"])),
        "nominalTime": lambda f: NominalTimeRunFacet(nominalStartTime=f["nominalStartTime"],
                                                     nominalEndTime=f["nominalEndTime"]),
        "errorMessage": lambda f: ErrorMessageRunFacet(message=f["message"],
                                                       programmingLanguage=f["programmingLanguage"]),
        "tags": lambda f: TagsRunFacet(tags=[TagsRunFacetFields(**t) for t in f["tags"]]),  # the client's own
    }
    return {name: known[name](f) for name, f in facets.items()}  # an unknown facet fails here


def validated(body: dict) -> RunEvent:
    """The event rebuilt with the client's models (their validators run); it must serialise back the same."""
    event = RunEvent(
        eventType=RunState(body["eventType"]), eventTime=body["eventTime"], producer=body["producer"],
        run=Run(runId=body["run"]["runId"], facets=_run_facets(body["run"].get("facets", {}))),
        job=Job(namespace=body["job"]["namespace"], name=body["job"]["name"]),
        inputs=[_dataset(InputDataset, d) for d in body.get("inputs", [])],
        outputs=[_dataset(OutputDataset, d) for d in body.get("outputs", [])],
    )
    assert Serde.to_dict(event) == body
    return event


class Receiver:
    """A Marquez-compatible endpoint on loopback: keeps every POST /api/v1/lineage body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers["content-length"]))
                ok = self.path == "/api/v1/lineage" and self.headers["content-type"] == "application/json"
                if ok:
                    bodies.append(json.loads(raw))
                self.send_response(201 if ok else 404)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def nightly_jobs(lake: Lake, tmp_path, receiver: Receiver, **overrides):
    from trajlake.commands.scheduler import SchedulerSettings, build_jobs

    settings = SchedulerSettings(lake=lake.root, train_out=str(tmp_path / "ck"), compact_cron="", retention_cron="",
                                 scheduler_backoff_s=0, openlineage_transport="http", openlineage_url=receiver.url,
                                 **overrides)
    return build_jobs(lake, settings)


@pytest.fixture
def rollouts_lake(lake: Lake) -> Lake:
    write_events(lake, sample_rollout("r1") + sample_rollout("r2"))
    return lake


def test_lineage_events_of_a_nightly_run_reach_an_http_receiver(rollouts_lake, tmp_path, tiny_model_dir):
    lake = rollouts_lake
    with Receiver() as receiver:
        jobs = nightly_jobs(lake, tmp_path, receiver, train_model=str(tiny_model_dir))
        [final] = Scheduler(lake, jobs, clock=lambda: NIGHT).run_pending()
    assert final.status is RunStatus.SUCCEEDED
    events = [validated(b) for b in receiver.bodies]
    assert [(e.job.name, e.eventType.value) for e in events] == [
        ("scheduler.nightly", "START"), ("build-dataset.nightly", "START"), ("build-dataset.nightly", "COMPLETE"),
        ("train.nightly", "START"), ("train.nightly", "COMPLETE"), ("scheduler.nightly", "COMPLETE")]
    nightly, build, train = events[0], events[2], events[4]
    assert nightly.run.facets["nominalTime"].nominalEndTime == "2026-01-02T02:00:00Z"
    for child in (build, train):
        assert child.run.facets["parent"].run.runId == nightly.run.runId
        assert child.run.facets["parent"].job.name == "scheduler.nightly"
    root = str(Path(lake.root).resolve())
    assert {(d.namespace, d.name) for d in build.inputs} >= {("file", f"{root}/llm_requests"),
                                                             ("file", f"{root}/rewards")}
    assert all(d.facets["version"].datasetVersion.isdigit() for d in build.inputs)
    [dataset] = build.outputs
    assert (dataset.namespace, dataset.name, dataset.facets["version"].datasetVersion) == (
        "file", f"{root}/datasets/nightly", "0")
    assert [(d.name, d.facets["version"].datasetVersion) for d in train.inputs] == [(dataset.name, "0")]
    [checkpoint] = train.outputs
    assert checkpoint.namespace == "file" and checkpoint.facets["version"].datasetVersion == final.checkpoint


def test_a_failed_training_sends_fail_with_the_error_and_the_build_still_completes(rollouts_lake, tmp_path):
    lake = rollouts_lake
    with Receiver() as receiver:
        jobs = nightly_jobs(lake, tmp_path, receiver, train_model=str(tmp_path / "no-such-model"),
                            scheduler_max_attempts=1)
        [final] = Scheduler(lake, jobs, clock=lambda: NIGHT, sleep=lambda s: None).run_pending()
    assert final.status is RunStatus.GAVE_UP
    events = {(e.job.name, e.eventType.value): e for e in map(validated, receiver.bodies)}
    assert ("build-dataset.nightly", "COMPLETE") in events
    for job in ("train.nightly", "scheduler.nightly"):
        assert "no-such-model" in events[(job, "FAIL")].run.facets["errorMessage"].message


def test_an_unreachable_lineage_server_never_fails_the_run(rollouts_lake, tmp_path):
    with Receiver() as receiver:
        url = receiver.url
    from trajlake.commands.scheduler import SchedulerSettings, build_jobs

    settings = SchedulerSettings(lake=rollouts_lake.root, train_out=str(tmp_path / "ck"), compact_cron="",
                                 retention_cron="", scheduler_train=False, openlineage_transport="http",
                                 openlineage_url=url)
    [final] = Scheduler(rollouts_lake, build_jobs(rollouts_lake, settings), clock=lambda: NIGHT).run_pending()
    assert final.status is RunStatus.SUCCEEDED and final.dataset_version == 0


def test_file_transport_and_settings_errors(tmp_path, rollouts_lake):
    from pipelines import BuildConfig, get_manifest
    from pipelines.lineage.openlineage import traced_build
    from trajlake.settings import CommonSettings

    path = tmp_path / "lineage.jsonl"
    lineage = open_lineage(CommonSettings(openlineage_transport="file", openlineage_file=str(path)))
    with lineage.active():
        traced_build(rollouts_lake, "ds", BuildConfig())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(b["job"]["name"], b["eventType"]) for b in lines] == [("build-dataset.ds", "START"),
                                                                   ("build-dataset.ds", "COMPLETE")]
    [validated(b) for b in lines]
    assert validated(run_event(get_manifest(rollouts_lake, "ds", 0), namespace=rollouts_lake.root))
    for bad, fix in [({"openlineage_transport": "kafka"}, "one of"), ({"openlineage_transport": "http"}, "URL"),
                     ({"openlineage_transport": "file"}, "FILE")]:
        with pytest.raises(LineageConfigError, match=fix):
            open_lineage(CommonSettings(**bad))
    assert dataset_id("s3://bucket/lake/events") == ("s3://bucket", "lake/events")


def test_the_console_transport_prints_each_event_at_the_default_log_level(rollouts_lake):
    env = {**os.environ, "TRAJLAKE_OPENLINEAGE_TRANSPORT": "console", "COLUMNS": "200"}
    env.pop("TRAJLAKE_LOG_LEVEL", None)
    done = subprocess.run([sys.executable, "-m", "trajlake.cli", "build-dataset", "ds", "--lake", rollouts_lake.root,
                           "--no-publish"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line[line.index("{"):]) for line in (done.stdout + done.stderr).splitlines()
               if '"eventType"' in line]
    assert [(e.job.name, e.eventType.value) for e in map(validated, printed)] == [
        ("build-dataset.ds", "START"), ("build-dataset.ds", "COMPLETE")]


def test_each_version_a_follower_trains_is_a_run_and_a_refused_one_fails(lake, tmp_path, tiny_model_dir):
    import pyarrow as pa
    from deltalake import write_deltalake

    from schemas.tables import SAMPLES
    from trainer.config import TrainConfig
    from trainer.follow import follow
    from devkit.synthetic import synthetic_samples
    from trajlake.settings import CommonSettings

    bad = synthetic_samples(str(tiny_model_dir), groups=2).to_pylist()
    bad[1]["input_ids"][3] = 99_999  # outside the tiny model's vocabulary: refused at validation
    lake.append("datasets/syn", pa.Table.from_pylist(bad, schema=SAMPLES), schema=SAMPLES)
    write_deltalake(lake.uri("datasets/syn"), synthetic_samples(str(tiny_model_dir), groups=2, seed=1), mode="overwrite")
    stop = threading.Event()
    give_up = threading.Timer(300, stop.set)  # a follower that never trains syn@1 must not hang the suite
    give_up.start()
    config = TrainConfig(model=str(tiny_model_dir), out=str(tmp_path / "ck"), epochs=1, micro_batch_tokens=80, seed=0)
    with Receiver() as receiver:
        with open_lineage(CommonSettings(openlineage_transport="http", openlineage_url=receiver.url)).active():
            [record] = follow(lake, config, stop_event=stop, poll_interval_s=0.2,
                              on_checkpoint=lambda _: stop.set())
    give_up.cancel()
    events = [validated(b) for b in receiver.bodies]
    assert [(e.job.name, e.eventType.value) for e in events] == [
        ("train.syn", "START"), ("train.syn", "FAIL"), ("train.syn", "START"), ("train.syn", "COMPLETE")]
    assert "outside the vocabulary" in events[1].run.facets["errorMessage"].message
    done = events[3]
    assert [(d.name.rsplit("/", 2)[-2:], d.facets["version"].datasetVersion) for d in done.inputs] == [
        (["datasets", "syn"], "1")]
    [checkpoint] = done.outputs
    assert checkpoint.facets["version"].datasetVersion == record.checkpoint_id
    assert events[2].run.runId == done.run.runId != events[0].run.runId
