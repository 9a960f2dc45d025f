"""Prometheus metrics of the query API: requests by route and outcome, latency (served by ``routes/metrics``).

``outcome`` is ``ok`` for answers below 400, else the error body's stable
``code`` (``query_timeout``, ``query_refused``, ``query_error``, ``busy``,
``not_found``, ...), so a dashboard tells a slow query from a bad one. The
route is the path template (``/v1/rollouts/{rollout_id}``), never the raw path.
"""

from __future__ import annotations

import json
import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class QueryApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("trajlake_query_api_requests", "requests answered, by route and outcome",
                                ["route", "outcome"], registry=self.registry)
        self.latency = Histogram("trajlake_query_api_request_seconds", "time to answer, by route", ["route"],
                                 buckets=_BUCKETS, registry=self.registry)


class MetricsMiddleware:
    """Pure ASGI: times every HTTP request and reads the outcome from the status and the error body."""

    def __init__(self, app: ASGIApp, *, metrics: QueryApiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = {"status": 500, "outcome": None}

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and state["outcome"] is None:
                state["outcome"] = _outcome(state["status"], message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            route = getattr(scope.get("route"), "path", None) or "(unmatched)"
            outcome = state["outcome"] or _outcome(state["status"], b"")
            self.metrics.requests.labels(route, outcome).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


def _outcome(status: int, body: bytes) -> str:
    if status < 400:
        return "ok"
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return code if isinstance(code, str) and code.isidentifier() else f"http_{status}"

