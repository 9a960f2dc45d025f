"""Prometheus metrics of the trainer (``trajlake train --metrics-port``; rank 0 serves them).

Steps feed counters and gauges through the loop's ``on_step(StepLog)``
callback; the checkpoint age is measured at scrape time from the
``checkpoints`` table (re-read only when its Delta version changed), so it is
right across restarts and while a follower waits for the next dataset version:

- ``trajlake_trainer_steps_total``, ``trajlake_trainer_tokens_total`` (tokens/s:
  ``rate(...[1m])``), ``trajlake_trainer_tokens_per_second`` (the last step),
  ``trajlake_trainer_loss`` (the last step), ``trajlake_trainer_step_seconds``;
- ``trajlake_trainer_last_checkpoint_timestamp_seconds``,
  ``trajlake_trainer_checkpoint_age_seconds`` (absent before the first checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.tables import CHECKPOINTS_TABLE
from store.lake import Lake
from trainer.records import list_checkpoints

if TYPE_CHECKING:  # torch loads only when a command trains
    from trainer.loop import StepLog

OnStep = Callable[["StepLog"], None]
_STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class CheckpointCollector(Collector):
    """Newest checkpoint's time and age, from the lake."""

    def __init__(self, lake: Lake, *, clock: Callable[[], float] = time.time) -> None:
        self.lake, self.clock = lake, clock
        self._cache: tuple[int | None, float | None] = (None, None)

    def _newest(self) -> float | None:
        version = self.lake.version(CHECKPOINTS_TABLE)
        if version is not None and version != self._cache[0]:
            records = list_checkpoints(self.lake)
            self._cache = (version, records[-1].created_at.timestamp() if records else None)
        return self._cache[1]

    def collect(self) -> Iterator[Metric]:
        newest = self._newest()
        if newest is None:
            return
        yield GaugeMetricFamily("trajlake_trainer_last_checkpoint_timestamp_seconds",
                                "creation of the newest checkpoint (Unix time)", value=newest)
        yield GaugeMetricFamily("trajlake_trainer_checkpoint_age_seconds", "seconds since the newest checkpoint",
                                value=max(self.clock() - newest, 0.0))


class TrainMetrics:
    """The trainer's registry; ``feeding(on_step)`` hooks it into the loop's step callback."""

    def __init__(self, lake: Lake, *, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter("trajlake_trainer_steps", "optimizer steps taken", registry=self.registry)
        self.tokens = Counter("trajlake_trainer_tokens", "real (unpadded) tokens trained on, this rank",
                              registry=self.registry)
        self.tokens_per_s = Gauge("trajlake_trainer_tokens_per_second", "tokens/s of the last step",
                                  registry=self.registry)
        self.loss = Gauge("trajlake_trainer_loss", "loss of the last step", registry=self.registry)
        self.step_seconds = Histogram("trajlake_trainer_step_seconds", "wall time of one optimizer step",
                                      buckets=_STEP_BUCKETS, registry=self.registry)
        self.registry.register(CheckpointCollector(lake, clock=clock))

    def observe(self, entry: StepLog) -> None:
        self.steps.inc()
        self.tokens.inc(entry.tokens)
        self.tokens_per_s.set(entry.tokens_per_s)
        if "loss" in entry.metrics:
            self.loss.set(entry.metrics["loss"])
        self.step_seconds.observe(entry.seconds)

    def feeding(self, on_step: OnStep) -> OnStep:
        """``on_step`` that also updates these metrics."""

        def both(entry: StepLog) -> None:
            on_step(entry)
            self.observe(entry)

        return both


def serve_metrics(lake: Lake, *, port: int, host: str = "0.0.0.0") -> TrainMetrics:
    """The trainer's metrics on ``http://host:port/metrics`` (daemon thread); ``OSError`` if the port is taken."""
    metrics = TrainMetrics(lake)
    start_http_server(port, addr=host, registry=metrics.registry)
    return metrics
