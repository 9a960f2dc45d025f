"""The follower without a reachable broker falls back to registry polling (no training here)."""

from __future__ import annotations

import logging
import threading

from ingest.broker import free_port
from trainer.config import TrainConfig
from trainer.follow import follow


def test_unreachable_kafka_falls_back_to_registry_polling(lake, tiny_model_dir, tmp_path, caplog):
    stop = threading.Event()
    stop.set()  # gather nothing, train nothing: only the start-up path runs
    with caplog.at_level(logging.WARNING, logger="trainer.follow"):
        trained = follow(lake, TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), stop_event=stop,
                         bootstrap_servers=f"127.0.0.1:{free_port()}")  # fmt: skip
    assert trained == []
    assert "event=kafka_unavailable" in caplog.text and "fallback=registry_poll" in caplog.text
