"""Prometheus metrics of one ingester process (``trajlake ingest --metrics-port``).

Counters follow the ingester's ``on_progress(IngestStats)`` reports (running
totals, turned into increments here). Two families are measured at scrape
time instead, from the lake and the broker, so they hold across restarts and
across ingester instances:

- ``trajlake_ingester_consumer_lag_messages{partition}``: the topic's high
  watermark minus the next offset the Delta markers say is committed (the
  furthest of the ``events`` and ``quarantine`` markers of this group). Against
  the embedded tansu broker the watermark is the last record batch's base
  offset + 1, so lag reads low there; Apache Kafka answers the true end;
- ``trajlake_quarantine_rows{field}``: rows of the ``quarantine`` table by the
  field their reason names (list indices dropped: ``payload.prompt_token_ids``),
  re-read only when the table's Delta version changed.

Events per second is ``rate(trajlake_ingester_events_total[1m])``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter as Tally
from collections.abc import Iterator

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest.ingester import IngesterConfig, IngestStats, OnProgress
from schemas.tables import EVENTS_TABLE, QUARANTINE_TABLE
from store.app_transactions import AppTransactions
from store.commit import marker_app_id
from store.lake import Lake

log = logging.getLogger(__name__)

_COMMIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SCRAPE_TIMEOUT_MS = 3_000
"""Longest a scrape waits for the broker (Prometheus' default scrape timeout is 10 s)."""
_PROGRESS_TABLES = (EVENTS_TABLE, QUARANTINE_TABLE)
_INDEX = re.compile(r"\.\d+(?=\.|$)")
_COUNTED = {
    "consumed": ("messages", "Kafka messages consumed and committed"),
    "bytes": ("bytes", "bytes of Kafka message values consumed and committed"),
    "events": ("events", "events written to the events table (first copies)"),
    "duplicates": ("duplicates", "repeated event ids dropped"),
    "quarantined": ("quarantined", "invalid messages written to the quarantine table"),
    "batches": ("batches", "batches committed"),
    "commit_retries": ("commit_retries", "Delta commits retried after losing to a concurrent change"),
}


class IngesterMetrics:
    """The registry of one ingester; ``observe`` is its ``on_progress`` callback."""

    def __init__(self, config: IngesterConfig) -> None:
        self.registry = CollectorRegistry()
        self._counters = {
            field: Counter(f"trajlake_ingester_{name}", doc, registry=self.registry)
            for field, (name, doc) in _COUNTED.items()
        }
        self._replays = Counter("trajlake_ingester_replays", "re-seeks to the Delta markers (each replays from "
                                "there; markers keep the rows single) by cause", ["cause"], registry=self.registry)
        self._commit = Histogram("trajlake_ingester_commit_seconds", "time to commit one batch to every table",
                                 buckets=_COMMIT_BUCKETS, registry=self.registry)
        self._partitions = Gauge("trajlake_ingester_assigned_partitions", "partitions assigned to this ingester",
                                 registry=self.registry)
        self._last = IngestStats()
        self.registry.register(LakeCollector(config))

    def feeding(self, on_progress: OnProgress) -> OnProgress:
        """``on_progress`` that also updates these metrics."""

        def both(stats: IngestStats) -> None:
            on_progress(stats)
            self.observe(stats)

        return both

    def observe(self, stats: IngestStats) -> None:
        """Fold a progress report (running totals) into the counters."""
        last = self._last
        for field, counter in self._counters.items():
            counter.inc(max(getattr(stats, field) - getattr(last, field), 0))
        self._replays.labels("assignment").inc(max(stats.assignments - last.assignments, 0))
        self._replays.labels("offset_conflict").inc(max(stats.conflicts - last.conflicts, 0))
        if stats.batches > last.batches:
            self._commit.observe(stats.last_commit_s)
        self._partitions.set(len(stats.partitions))
        self._last = IngestStats(**{f: getattr(stats, f) for f in ("consumed", "bytes", "events", "duplicates",
                                                                    "quarantined", "batches", "assignments",
                                                                    "conflicts", "commit_retries")})


class LakeCollector(Collector):
    """Lag per partition (broker high watermarks against the Delta markers) and quarantine rows by field."""

    def __init__(self, config: IngesterConfig) -> None:
        self.config = config
        self.lake = Lake(config.lake)
        self._consumer: KafkaConsumer | None = None
        self._quarantine: tuple[int | None, dict[str, int]] = (None, {})
        self._markers = {t: AppTransactions(self.lake, t) for t in _PROGRESS_TABLES}
        """The group's markers per progress table, read from the log entries since the last scrape (as the
        ingester's commits read them: ``store.app_transactions``)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._lag()
        yield self._quarantine_rows()

    def _lag(self) -> Iterator[Metric]:
        c = self.config
        up = GaugeMetricFamily("trajlake_ingester_broker_up", "1 when the broker answered the lag query")
        try:
            ends = self._high_watermarks()
        except KafkaError as exc:
            log.debug("lag query failed error=%s", exc)
            self._close()
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        lag = GaugeMetricFamily("trajlake_ingester_consumer_lag_messages",
                                "messages on the topic past the group's Delta markers", labels=["partition"])
        committed = GaugeMetricFamily("trajlake_ingester_committed_offset",
                                      "next offset to ingest, per the Delta markers", labels=["partition"])
        apps = {p: marker_app_id(c.group, c.topic, p) for p in ends}
        versions = [self._markers[t].versions(self.lake.table(t), apps.values())
                    for t in _PROGRESS_TABLES if self.lake.exists(t)]
        for partition, end in sorted(ends.items()):
            marks = [v[apps[partition]] for v in versions if v[apps[partition]] is not None]
            next_offset = max(marks) + 1 if marks else 0
            committed.add_metric([str(partition)], next_offset)
            lag.add_metric([str(partition)], max(end - next_offset, 0))
        yield lag
        yield committed

    def _high_watermarks(self) -> dict[int, int]:
        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=self.config.bootstrap_servers, enable_auto_commit=False,
                                           client_id="trajlake-ingest-metrics", bootstrap_timeout_ms=_SCRAPE_TIMEOUT_MS,
                                           request_timeout_ms=_SCRAPE_TIMEOUT_MS)
        parts = self._consumer.partitions_for_topic(self.config.topic) or set()
        ends = self._consumer.end_offsets([TopicPartition(self.config.topic, p) for p in sorted(parts)])
        return {tp.partition: offset for tp, offset in ends.items()}

    def _close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()

    def _quarantine_rows(self) -> Metric:
        family = GaugeMetricFamily("trajlake_quarantine_rows", "rows of the quarantine table by the field their "
                                   "reason names", labels=["field"])
        version = self.lake.version(QUARANTINE_TABLE)
        cached_version, counts = self._quarantine
        if version is not None and version != cached_version:
            fields = self.lake.read(QUARANTINE_TABLE, columns=["field"]).column("field").to_pylist()
            counts = dict(Tally(_INDEX.sub("", f or "(event)") for f in fields))
            self._quarantine = (version, counts)
        for field, n in sorted(counts.items()):
            family.add_metric([field], n)
        return family


def serve_metrics(config: IngesterConfig, *, port: int, host: str = "0.0.0.0") -> IngesterMetrics:
    """Metrics of the ingester of ``config``, served on ``http://host:port/metrics`` from a daemon thread.

    Raises ``OSError`` when the port cannot be bound.
    """
    metrics = IngesterMetrics(config)
    start_http_server(port, addr=host, registry=metrics.registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return metrics
