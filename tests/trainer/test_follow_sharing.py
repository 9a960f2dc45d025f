"""Several followers, one lake, one broker: every version trained once, by one process, whatever else is there.

Real DeepSpeed on CPU, each follower its own process, the real broker; tiny model, few steps.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from kafka import KafkaProducer
from typer.testing import CliRunner

from ingest.topics import ensure_topic
from pipelines.datasets.publish import publish_version
from schemas.tables import SAMPLES
from store.identity import lake_id
from store.lake import Lake
from tests.trainer.driver import Follower, config_for, wait_for
from trainer.follow import pending_versions
from trainer.records import list_checkpoints, version_states
from devkit.synthetic import synthetic_samples
from trajlake.cli import build_app


def _followers(n: int, lake: Lake, cfg: dict, tmp_path: Path, **args) -> list[Follower]:
    return [Follower({"lake": lake.root, "config": cfg, **args}, tmp_path / f"follower-{i}.log") for i in range(n)]


def _stop(followers: list[Follower]) -> None:
    for f in followers:
        f.stop()


@pytest.mark.parametrize("n", [2, 3])
def test_followers_started_at_the_same_instant_train_each_version_exactly_once(n, tiny_model_dir, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for seed in (0, 1):
        lake.append("datasets/syn", synthetic_samples(str(tiny_model_dir), groups=4, seed=seed), schema=SAMPLES)
    out = tmp_path / "ckpt"
    go = tmp_path / "go"
    followers = _followers(n, lake, config_for(tiny_model_dir, out, epochs=2), tmp_path, go_file=str(go), poll_s=0.3)
    try:
        wait_for(lambda: all("READY" in f.output() for f in followers), *followers, what="every follower's start")
        go.touch()  # they all leave their start line within ~10 ms of each other
        wait_for(lambda: len(list_checkpoints(lake)) == 2, *followers, what="both versions trained")
    finally:
        _stop(followers)
    first, second = list_checkpoints(lake)
    assert (first.dataset_version, second.dataset_version, second.parent_checkpoint_id) == (0, 1, first.checkpoint_id)
    runs = lake.read("train_runs").sort_by("ts").to_pylist()
    assert [(r["dataset_version"], r["status"], r["attempt"]) for r in runs] == [
        (0, "started", 1), (0, "finished", 1), (1, "started", 1), (1, "finished", 1),
    ]  # fmt: skip
    # one claim wrote each run's folder; nothing else created one
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/claim-*")) == sorted(
        Path(r.ds_path).parent.relative_to(out).as_posix() for r in (first, second)
    )
    outputs = [f.output() for f in followers]
    assert sum(o.count("event=checkpoint_written") for o in outputs) == 2
    assert not any("Traceback" in o or "IllegalTransition" in o for o in outputs)


def test_a_killed_lease_holder_is_taken_over_and_its_run_resumed(tiny_model_dir, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    samples = synthetic_samples(str(tiny_model_dir), groups=8)
    lake.append("datasets/syn", samples, schema=SAMPLES)
    cfg = config_for(tiny_model_dir, tmp_path / "ckpt")  # 3 epochs x 4 micro-batches, a restart point every 2 steps
    (holder,) = _followers(1, lake, cfg, tmp_path, poll_s=0.3, lease_s=3, pause_after_step=5)
    other = None
    try:
        wait_for(lambda: "PAUSED" in holder.output(), holder, what="the holder reaching step 5")
        other = Follower({"lake": lake.root, "config": cfg, "poll_s": 0.3, "lease_s": 3}, tmp_path / "other.log")
        # the holder is alive and renews its lease: the other follower leaves the version alone
        wait_for(lambda: "event=follow_skip_held" in other.output(), holder, other, what="the other seeing the lease")
        holder.proc.kill()  # SIGKILL: no cleanup, the lease row still says "held"
        holder.proc.wait()
        wait_for(lambda: len(list_checkpoints(lake)) == 1, other, what="the takeover finishing the run")
    finally:
        _stop([holder] + ([other] if other else []))
    (record,) = list_checkpoints(lake)
    m = record.metrics
    assert (m["resumed_from_step"], m["resumes"], record.steps) == (4, 1, 12)
    # the summary covers the whole run: every token of 3 epochs and the holder's first loss
    assert m["tokens"] == 3 * sum(len(ids) for ids in samples["input_ids"].to_pylist())
    first_loss = float(holder.output().split("STEP 1 loss=")[1].split()[0])
    assert m["first_loss"] == pytest.approx(first_loss, abs=1e-7)
    assert "event=lease_taken_over" in other.output() and "event=resumed" in other.output()
    # the takeover wrote its own folder and left the dead holder's restart point where it was
    assert Path(record.ds_path).parent.name == "claim-2"
    assert (Path(record.ds_path).parents[1] / "claim-1" / "ds" / "step4").is_dir()
    runs = lake.read("train_runs").sort_by("ts").to_pylist()
    assert [(r["status"], r["attempt"], r["step"]) for r in runs] == [("started", 1, 0), ("started", 2, 4),
                                                                      ("finished", 2, 12)]  # fmt: skip


def test_hints_about_another_lake_do_not_stop_a_version_built_here_later(broker, tiny_model_dir, tmp_path):
    here, there = Lake(str(tmp_path / "here")), Lake(str(tmp_path / "there"))
    topic = f"control-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap_servers, topic, partitions=1)
    cfg = config_for(tiny_model_dir, tmp_path / "ckpt", epochs=1)
    (follower,) = _followers(1, here, cfg, tmp_path, bootstrap=broker.bootstrap_servers, topic=topic, poll_s=1.0,
                             debug_versions=True)  # fmt: skip
    try:
        wait_for(lambda: "event=follow_started" in follower.output(), follower, what="the follower's start")
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        for version in (0, 1):  # the other lake built syn@0 and syn@1 first
            publish_version(producer, {"dataset": "syn", "version": version, "content_hash": "h"}, topic=topic,
                            lake_id=lake_id(there))  # fmt: skip
        producer.close()
        wait_for(lambda: follower.output().count("event=control_hint_other_lake") == 2, follower, what="hints read")
        lake_here_v0 = here.append("datasets/syn", synthetic_samples(str(tiny_model_dir), groups=4), schema=SAMPLES)
        wait_for(lambda: len(list_checkpoints(here)) == 1, follower, what="syn@0 of this lake trained")
    finally:
        follower.stop()
    assert lake_here_v0 == 0 and [(r.dataset, r.dataset_version) for r in list_checkpoints(here)] == [("syn", 0)]
    assert not there.exists("checkpoints") and lake_id(here) != lake_id(there)


def test_a_version_refused_at_validation_is_recorded_and_left_alone_until_retried(tiny_model_dir, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    rows = synthetic_samples(str(tiny_model_dir), groups=2).to_pylist()
    rows[1]["input_ids"][3] = 99_999  # outside the tiny model's 2,048-token vocabulary
    lake.append("datasets/syn", pa.Table.from_pylist(rows, schema=SAMPLES), schema=SAMPLES)
    cfg = config_for(tiny_model_dir, tmp_path / "ckpt", epochs=1)
    (follower,) = _followers(1, lake, cfg, tmp_path, poll_s=0.2)
    try:
        wait_for(lambda: ("syn", 0) in version_states(lake), follower, what="the refusal recorded")
        # a good version after it (a build overwrites): trained once the follower has polled past the refused one
        write_deltalake(lake.uri("datasets/syn"), synthetic_samples(str(tiny_model_dir), groups=2, seed=1), mode="overwrite")
        wait_for(lambda: len(list_checkpoints(lake)) == 1, follower, what="syn@1 trained")
    finally:
        follower.stop()
    refused = [r for r in lake.read("train_runs").to_pylist() if r["dataset_version"] == 0]
    assert [(r["status"], r["step"]) for r in refused] == [("failed", -1)]  # recorded once, never started
    assert "DatasetError" in refused[0]["error"] and "outside the vocabulary" in refused[0]["error"]
    assert pending_versions(lake, ["syn"]) == []
    cli = CliRunner()
    result = cli.invoke(build_app(), ["train", "--retry", "syn@0", "--lake", lake.root])
    assert result.exit_code == 0 and "marked for retry" in result.output
    assert pending_versions(lake, ["syn"]) == [("syn", 0)]  # a follower trains it at its next poll
    again = cli.invoke(build_app(), ["train", "--retry", "syn@1", "--lake", lake.root])
    assert again.exit_code == 1 and "nothing to retry" in again.output
