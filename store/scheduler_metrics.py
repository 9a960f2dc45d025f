"""Prometheus metrics of the scheduler (``trajlake scheduler --metrics-port``), read from ``runs`` at scrape time.

The ``runs`` table is the scheduler's whole history across restarts and
instances, so the metrics come from it rather than from one process's memory
(re-read only when its Delta version changed):

- ``trajlake_scheduler_last_success_timestamp_seconds{job}``: end of the newest
  succeeded run (alert on ``time() - ... > 26h`` for a nightly job);
- ``trajlake_scheduler_failures_total{job}``: failed attempts (each retry's
  failure and each give-up);
- ``trajlake_scheduler_gave_up_total{job}``: windows that ran out of attempts;
- ``trajlake_scheduler_running{job}``: windows running now.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.tables import RUNS_TABLE
from store.lake import Lake
from store.runs import RunRecord, RunsTable, RunStatus


class SchedulerCollector(Collector):
    """Per-job metrics of the ``runs`` table of ``lake`` (every job in it, plus ``jobs`` at zero)."""

    def __init__(self, lake: Lake, *, jobs: Iterable[str] = ()) -> None:
        self.lake = lake
        self.jobs = tuple(jobs)
        self._cache: tuple[int | None, list[RunRecord]] = (None, [])

    def _history(self) -> list[RunRecord]:
        version = self.lake.version(RUNS_TABLE)
        if version is None:
            return []
        if version != self._cache[0]:
            self._cache = (version, RunsTable(self.lake).history(self.lake.table(RUNS_TABLE)))
        return self._cache[1]

    def collect(self) -> Iterator[Metric]:
        history = self._history()
        jobs = sorted(set(self.jobs) | {r.job for r in history})
        last_success: dict[str, datetime] = {}
        failures = dict.fromkeys(jobs, 0)
        gave_up = dict.fromkeys(jobs, 0)
        current: dict[tuple[str, str], RunRecord] = {}
        for r in history:
            current[(r.job, r.window_key)] = r
            if r.status is RunStatus.SUCCEEDED and r.ended_at is not None:
                last_success[r.job] = max(last_success.get(r.job, r.ended_at), r.ended_at)
            elif r.status in (RunStatus.FAILED, RunStatus.GAVE_UP) and r.error is not None:
                failures[r.job] += 1
            if r.status is RunStatus.GAVE_UP:
                gave_up[r.job] += 1
        success = GaugeMetricFamily("trajlake_scheduler_last_success_timestamp_seconds",
                                    "end of the newest succeeded run (Unix time)", labels=["job"])
        for job, at in sorted(last_success.items()):
            success.add_metric([job], at.timestamp())
        yield success
        yield _per_job(CounterMetricFamily("trajlake_scheduler_failures", "failed attempts (retries and give-ups)",
                                           labels=["job"]), failures)
        yield _per_job(CounterMetricFamily("trajlake_scheduler_gave_up", "windows that ran out of attempts",
                                           labels=["job"]), gave_up)
        running = dict.fromkeys(jobs, 0)
        for r in current.values():
            running[r.job] += r.status is RunStatus.RUNNING
        yield _per_job(GaugeMetricFamily("trajlake_scheduler_running", "windows running now", labels=["job"]),
                       running)


def _per_job(family: CounterMetricFamily | GaugeMetricFamily, values: dict[str, int]) -> Metric:
    for job, value in sorted(values.items()):
        family.add_metric([job], value)
    return family


def serve_metrics(lake: Lake, *, jobs: Iterable[str], port: int, host: str = "0.0.0.0") -> CollectorRegistry:
    """Serve the scheduler's metrics on ``http://host:port/metrics`` (daemon thread).

    Raises ``OSError`` when the port cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(lake, jobs=jobs))
    start_http_server(port, addr=host, registry=registry)
    return registry
