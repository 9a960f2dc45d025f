"""Prometheus metrics of one gateway app (its own registry, so apps never share state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest.gateway.emitter import Emitter
from ingest.gateway.sessions.state import SessionStore

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _EmitterCollector(Collector):
    """Reads the emitter's counters at scrape time (no work on the hot path)."""

    def __init__(self, emitter: Emitter) -> None:
        self.emitter = emitter

    def collect(self) -> Iterator[Metric]:
        e = self.emitter
        counters = {
            "produced": ("events acknowledged by Kafka (direct or replayed)", e.produced),
            "spooled": ("events written to the on-disk spool while the broker was unreachable", e.spooled),
            "replayed": ("spooled events later delivered to Kafka", e.replayed),
            "dropped": ("events DROPPED because the spool was full", e.dropped),
            "invalid": ("calls whose events could not be built (a gateway bug; see logs)", e.invalid),
            "redacted": ("events a redaction rule changed before they were sent or spooled", e.redacted),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"trajlake_gateway_events_{name}", doc, value=value)
        yield GaugeMetricFamily("trajlake_gateway_spool_depth_bytes", "bytes waiting in the spool", e.spool.depth_bytes)
        yield GaugeMetricFamily(
            "trajlake_gateway_spool_depth_events", "events waiting in the spool", e.spool.depth_records
        )
        yield GaugeMetricFamily("trajlake_gateway_spool_max_bytes", "spool capacity", e.spool.max_bytes)
        yield GaugeMetricFamily("trajlake_gateway_emitter_queue", "calls waiting for event building", e.pending)
        yield GaugeMetricFamily("trajlake_gateway_broker_up", "1 when the last send reached Kafka", int(e.broker_up))


_ROUTES = (("/chat/completions", "chat"), ("/completions", "completions"), ("/models", "models"),
           ("/events", "events"))


def route_label(path: str) -> str:
    """The ``route`` label of a request path (rollout prefixes aside): chat, completions, models, events, other."""
    return next((label for suffix, label in _ROUTES if path.endswith(suffix)), "other")


class _SessionCollector(Collector):
    """Token session state at scrape time."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        s = self.store
        yield GaugeMetricFamily("trajlake_gateway_sessions", "live token sessions", len(s))
        yield GaugeMetricFamily("trajlake_gateway_session_bytes", "bytes held by token sessions", s.bytes)
        yield GaugeMetricFamily("trajlake_gateway_session_max_bytes", "token session capacity", s.max_bytes)
        yield CounterMetricFamily("trajlake_gateway_sessions_evicted", "sessions dropped for room or idleness",
                                  value=s.evicted)


class GatewayMetrics:
    def __init__(self, emitter: Emitter) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "trajlake_gateway_requests", "HTTP requests answered", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "trajlake_gateway_request_seconds", "time to answer (to the first byte for streams)", ["route"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.upstream_errors = Counter(
            "trajlake_gateway_upstream_errors", "upstream failures by kind", ["kind"], registry=self.registry
        )
        self.idempotent_replays = Counter(
            "trajlake_gateway_idempotent_replays", "retried keyed calls answered from the cache",
            registry=self.registry,
        )
        self.batch_events = Counter(
            "trajlake_gateway_batch_events", "events posted to /v1/events by result", ["result"],
            registry=self.registry,
        )
        self.prompts = Counter(
            "trajlake_gateway_prompts", "chat prompts by how they were made (token sessions on): made=stitched, "
            "or made=engine_rendered with the fallback reason", ["made", "reason"], registry=self.registry,
        )
        self._prompts: dict[tuple[str, str], Counter] = {}
        """``prompts`` children by labels: ``labels()`` checks and locks on every call (~5 us of a stitched call)."""
        self.registry.register(_EmitterCollector(emitter))

    def prompt_made(self, made: str, reason: str | None) -> None:
        """Count a chat prompt under token sessions: ``stitched``, or ``engine_rendered`` with its fallback reason."""
        labels = (made, reason or "")
        child = self._prompts.get(labels)
        if child is None:
            child = self._prompts[labels] = self.prompts.labels(*labels)
        child.inc()

    def watch_sessions(self, store: SessionStore) -> None:
        self.registry.register(_SessionCollector(store))

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def refused(self, path: str, status: int) -> None:
        """Count a request refused before its route ran (401): ``requests_total`` only, no latency."""
        self.requests.labels(route_label(path), str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
