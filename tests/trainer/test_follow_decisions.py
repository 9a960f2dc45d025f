"""The follower's decisions that need no training: Kafka fallback, giving up a crash loop, what is pending."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from devkit.ports import free_port
from schemas.tables import SAMPLES
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer import follow as follow_module
from trainer.follow import follow, pending_versions
from trainer.records import CheckpointRecord, record_status, request_retry, run_states, write_checkpoint
from devkit.synthetic import synthetic_samples


def test_unreachable_kafka_falls_back_to_registry_polling(lake, tiny_model_dir, tmp_path, caplog):
    stop = threading.Event()
    stop.set()  # gather nothing, train nothing: only the start-up path runs
    with caplog.at_level(logging.WARNING, logger="trainer.follow"):
        trained = follow(lake, TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), stop_event=stop,
                         bootstrap_servers=f"127.0.0.1:{free_port()}")  # fmt: skip
    assert trained == []
    assert "event=kafka_unavailable" in caplog.text and "fallback=registry_poll" in caplog.text


def test_a_version_that_keeps_crashing_is_given_up_not_retried_forever(lake, tiny_model_dir, tmp_path, caplog):
    lake.append("datasets/syn", synthetic_samples(str(tiny_model_dir), groups=2), schema=SAMPLES)
    for _ in range(3):  # three starts, never finished (killed each time)
        record_status(lake, "ckpt-syn-v0-x", dataset="syn", version=0, status="started", step=0)
    stop = threading.Event()
    timer = threading.Timer(1.5, stop.set)  # let the loop see the version, give it up and idle
    timer.start()
    with caplog.at_level(logging.ERROR, logger="trainer.follow"):
        trained = follow(lake, TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), stop_event=stop,
                         poll_interval_s=0.2, max_attempts=3)  # fmt: skip
    timer.join()
    assert trained == [] and "event=follow_give_up version=syn@0" in caplog.text
    assert run_states(lake)["ckpt-syn-v0-x"].attempt == 3  # not started a fourth time


def test_a_failure_that_left_no_record_is_tried_again_not_skipped_for_good(lake, tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    """syn@0 fails before a run is recorded (the lake or the parent model briefly unreachable): the follower tries it
    again at its next poll, before syn@1; trained past it, syn@0 would be older than the newest and never trained."""
    for seed in (0, 1):
        lake.append("datasets/syn", synthetic_samples(str(tiny_model_dir), groups=1, seed=seed), schema=SAMPLES)
    calls: list[tuple[str, int]] = []

    def flaky_train(lake, dataset, version, config, **_) -> CheckpointRecord:
        calls.append((dataset, version))
        if calls == [("syn", 0)]:
            raise OSError("the lake's storage did not answer")
        record = _checkpoint(f"ckpt-syn-v{version}-a", version)
        write_checkpoint(lake, record)
        return record

    monkeypatch.setattr(follow_module, "traced_train", flaky_train)
    stop = threading.Event()
    give_up = threading.Timer(60, stop.set)  # a follower that never trains syn@1 must not hang the suite
    give_up.start()
    trained = follow(lake, TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), stop_event=stop,
                     poll_interval_s=0.1, on_checkpoint=lambda r: r.dataset_version == 1 and stop.set())
    give_up.cancel()
    assert calls == [("syn", 0), ("syn", 0), ("syn", 1)]
    assert [r.dataset_version for r in trained] == [0, 1]


def test_pending_versions_come_from_the_lake_newer_than_the_last_trained_and_not_failed(lake):
    empty = pa.Table.from_pylist([], schema=SAMPLES)
    for _ in range(5):
        lake.append("datasets/syn", empty, schema=SAMPLES)  # syn@0..4
    write_checkpoint(lake, _checkpoint("ckpt-syn-v1-a", 1))
    record_status(lake, "ckpt-syn-v2-a", dataset="syn", version=2, status="failed", step=-1, error="refused")
    assert pending_versions(lake, ["syn"], chain=False) == [("syn", 3), ("syn", 4)]  # not 0 (older), not 2 (failed)
    assert pending_versions(lake, ["syn"]) == [("syn", 3)]  # a chain trains its oldest version first
    request_retry(lake, "syn", 2)
    assert pending_versions(lake, ["syn"]) == [("syn", 2)]
    assert run_states(lake)["ckpt-syn-v2-a"].status == "retry"
    with pytest.raises(TrainerError, match="nothing to retry"):
        request_retry(lake, "syn", 3)


def _checkpoint(checkpoint_id: str, version: int) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=checkpoint_id, dataset="syn", dataset_version=version, base_model="m", parent_checkpoint_id=None,
        mode="pg", config={}, code_version="x", metrics={}, ds_path="p", hf_path="h", tokenizer="bpe", world_size=1,
        n_samples=1, n_tokens=1, steps=1, created_at=datetime.now(UTC),
    )  # fmt: skip
