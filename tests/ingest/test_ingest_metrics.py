"""Ingester metrics: counters from the progress reports, lag from the Delta markers, quarantine by field."""

from __future__ import annotations

import random

import httpx
from ingester_support import produce, rollout_events, wire_event
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devkit.ports import free_port
from ingest.ingest_metrics import IngesterMetrics, serve_metrics
from ingest.ingester import IngesterConfig, ingest_until_idle


def produce_one_batch_each(bootstrap_servers: str, topic: str, events: list) -> None:
    """One record batch per message: tansu answers a high watermark of the last batch's base offset + 1
    (BROKER-NOTES quirk 2), which is the true end only when every batch holds one message."""
    for event in events:
        produce(bootstrap_servers, topic, [event])


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(metrics: IngesterMetrics) -> dict[tuple[str, tuple], float]:
    return samples(generate_latest(metrics.registry).decode())


def lag(scraped: dict) -> dict[str, float]:
    return {dict(labels)["partition"]: v for (name, labels), v in scraped.items()
            if name == "trajlake_ingester_consumer_lag_messages"}


def test_counters_lag_and_quarantine_reasons(broker, topic, group, lake):
    good = rollout_events("r-1", rng=random.Random(0), calls=2)
    bad = [wire_event("reward", {"name": "pass", "value": "high"}, rollout="r-1", seq=90),
           wire_event("llm.request", {"call_id": "c", "prompt_token_ids": [1, "x"]}, rollout="r-1", seq=91),
           wire_event("llm.request", {"call_id": "c", "prompt_token_ids": [1, 2, "y"]}, rollout="r-1", seq=92)]
    produce_one_batch_each(broker.bootstrap_servers, topic, [*good, *bad, good[0]])  # the last one: a duplicate
    config = IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group,
                            dlq_topic="")
    metrics = IngesterMetrics(config)
    before = lag(scrape(metrics))
    assert sum(before.values()) == len(good) + len(bad) + 1 and set(before) == {"0", "1", "2", "3"}

    stats = ingest_until_idle(config, idle_s=1.0, on_progress=metrics.feeding(lambda _: None))
    got = scrape(metrics)
    assert got[("trajlake_ingester_events_total", ())] == len(good) == stats.events
    assert got[("trajlake_ingester_quarantined_total", ())] == 3
    assert got[("trajlake_ingester_duplicates_total", ())] == 1
    assert got[("trajlake_ingester_messages_total", ())] == len(good) + len(bad) + 1
    assert got[("trajlake_ingester_commit_seconds_count", ())] == stats.batches >= 1
    assert got[("trajlake_ingester_replays_total", (("cause", "assignment"),))] == stats.assignments >= 1
    assert got[("trajlake_ingester_broker_up", ())] == 1
    assert sum(lag(got).values()) == 0
    assert got[("trajlake_quarantine_rows", (("field", "payload.value"),))] == 1
    assert got[("trajlake_quarantine_rows", (("field", "payload.prompt_token_ids"),))] == 2  # indices dropped

    more = rollout_events("r-2", rng=random.Random(1), calls=1)
    produce_one_batch_each(broker.bootstrap_servers, topic, more)
    assert sum(lag(scrape(metrics)).values()) == len(more)  # measured with no ingester running


def test_served_over_http_and_a_dead_broker_is_a_gauge_not_an_error(lake):
    closed, port = free_port(), free_port()
    config = IngesterConfig(lake=lake.root, bootstrap_servers=f"127.0.0.1:{closed}", topic="t", group="g")
    serve_metrics(config, port=port, host="127.0.0.1")
    got = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text)
    assert got[("trajlake_ingester_broker_up", ())] == 0
    assert got[("trajlake_ingester_events_total", ())] == 0


def test_the_last_progress_report_is_the_final_count_after_an_offset_conflict(broker, topic, group, lake,
                                                                             monkeypatch):
    """A batch whose `events` rows were committed before another table's commit lost to a moved marker counted them,
    but the loop re-seeked without reporting, and nothing was left to commit: the counters stayed behind the stats
    (CI saw events_total 0 against 11 committed)."""
    from ingest.ingester import _Loop
    from store.commit import OffsetConflict

    good = rollout_events("r-1", rng=random.Random(0), calls=2)
    produce_one_batch_each(broker.bootstrap_servers, topic, good)
    real, raised = _Loop._write, []

    def write_then_conflict(self, decoded):
        real(self, decoded)
        if not raised:
            raised.append(True)
            raise OffsetConflict("a marker moved under us", hint="re-seek")

    monkeypatch.setattr(_Loop, "_write", write_then_conflict)
    config = IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group,
                            dlq_topic="")
    metrics = IngesterMetrics(config)
    stats = ingest_until_idle(config, idle_s=1.0, on_progress=metrics.feeding(lambda _: None))
    assert raised and stats.conflicts == 1 and stats.events == len(good)
    assert scrape(metrics)[("trajlake_ingester_events_total", ())] == stats.events
