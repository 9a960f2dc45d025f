"""The follower's decisions that need no training: Kafka fallback, giving up a crash loop."""

from __future__ import annotations

import logging
import threading

from ingest.broker import free_port
from schemas.tables import SAMPLES
from trainer.config import TrainConfig
from trainer.follow import follow
from trainer.records import record_status, run_states
from trainer.synthetic import synthetic_samples


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
