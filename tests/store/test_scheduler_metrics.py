"""Scheduler metrics, read from the ``runs`` table: last success per job, failures, give-ups."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devkit.ports import free_port
from store.lake import Lake
from store.scheduler import Job, Scheduler
from store.scheduler_metrics import SchedulerCollector, serve_metrics

NOW = datetime(2026, 11, 30, 7, 30, tzinfo=timezone.utc)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def failing(window) -> dict:
    raise RuntimeError("the lake is read-only")


def test_last_success_failures_and_give_ups_per_job(lake: Lake):
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(lake, jobs=["nightly", "compact", "idle"]))
    assert samples(generate_latest(registry).decode())[("trajlake_scheduler_failures_total", (("job", "idle"),))] == 0

    jobs = [Job("nightly", "0 2 * * *", run=lambda w: {"rows": 1}),
            Job("compact", "0 4 * * *", run=failing, max_attempts=2, backoff=timedelta(0))]
    Scheduler(lake, jobs, clock=lambda: NOW, sleep=lambda s: None).run_pending()
    got = samples(generate_latest(registry).decode())
    assert got[("trajlake_scheduler_last_success_timestamp_seconds", (("job", "nightly"),))] == NOW.timestamp()
    assert ("trajlake_scheduler_last_success_timestamp_seconds", (("job", "compact"),)) not in got
    assert got[("trajlake_scheduler_failures_total", (("job", "compact"),))] == 2  # a retry, then the give-up
    assert got[("trajlake_scheduler_gave_up_total", (("job", "compact"),))] == 1
    assert got[("trajlake_scheduler_failures_total", (("job", "nightly"),))] == 0
    assert got[("trajlake_scheduler_running", (("job", "nightly"),))] == 0


def test_served_over_http(lake: Lake):
    port = free_port()
    serve_metrics(lake, jobs=["nightly"], port=port, host="127.0.0.1")
    got = samples(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    assert got[("trajlake_scheduler_running", (("job", "nightly"),))] == 0
    assert not lake.exists("runs")  # a scrape never writes
