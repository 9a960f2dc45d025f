"""At TRAJLAKE_LOG_LEVEL=DEBUG the ingester's librdkafka consumer logs its group membership and fetches (it logs
nothing of them otherwise); no broker needed: the client is only configured."""

import logging

import ingest.consumer
from ingest.consumer import DEBUG_CONTEXTS, new_client


def configured(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(ingest.consumer, "Consumer", lambda settings, logger: seen.update(settings))
    new_client({"bootstrap.servers": "127.0.0.1:9"})
    return seen


def test_debug_turns_on_librdkafkas_group_and_fetch_logs(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="ingest.consumer.librdkafka")
    assert configured(monkeypatch)["debug"] == DEBUG_CONTEXTS == "cgrp,fetch"


def test_other_levels_leave_librdkafka_quiet(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ingest.consumer.librdkafka")
    assert "debug" not in configured(monkeypatch)
