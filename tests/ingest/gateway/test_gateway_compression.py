"""The gateway's record batches are compressed (``kafka_compression``), and every reader of the topic reads them.

Real broker (tansu), real ingester (librdkafka consumer, kafka-python log
probe), real Delta lake: what the broker serves back is the compressed
batches; the ingester writes every event; a restarted ingester's log probe
reads the record at its marker out of a zstd batch.
"""

from __future__ import annotations

import uuid

from gateway_helpers import KEY, serve
from openai import OpenAI

from devkit.kafka_bytes import topic_bytes
from ingest.gateway import create_gateway_app
from ingest.ingester import IngesterConfig, ingest_until_idle

QUESTION = "Summarise the weather in Paris for the whole week, day by day, please. " * 8


def run_calls(settings, broker, topic: str, *, compression: str, calls: int) -> None:
    settings.bootstrap_servers, settings.topic, settings.broker_timeout_s = broker.bootstrap_servers, topic, 10.0
    settings.kafka_compression = compression
    with serve(create_gateway_app(settings)) as url:
        llm = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                     default_headers={"x-trajlake-task-id": "task-1", "x-trajlake-rollout-id": "ro-zstd"})
        for n in range(calls):
            llm.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": f"{n}: {QUESTION}"}])


def test_zstd_batches_are_stored_compressed_and_ingested(settings, broker, topic, group, lake):
    plain = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(plain, partitions=4)
    run_calls(settings, broker, plain, compression="none", calls=5)
    run_calls(settings, broker, topic, compression="zstd", calls=5)

    uncompressed = topic_bytes(broker.bootstrap_servers, plain, records=10)
    compressed = topic_bytes(broker.bootstrap_servers, topic, records=10)
    assert uncompressed.served_bytes > uncompressed.value_bytes  # stored as sent, framing on top
    assert compressed.served_bytes * 2 < compressed.value_bytes  # the broker holds the compressed batches

    config = IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group)
    stats = ingest_until_idle(config, idle_s=1.5)
    assert stats.events == 10 and stats.quarantined == 0
    assert lake.read("llm_requests").num_rows == 5 and lake.read("llm_responses").num_rows == 5
    again = ingest_until_idle(config, idle_s=1.5)  # the log probe (kafka-python) checks the markers' records
    assert again.events == 0 and lake.read("events").num_rows == 10
