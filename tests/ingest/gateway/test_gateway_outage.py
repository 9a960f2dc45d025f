"""Broker outages and gateway crashes: calls keep succeeding, events are spooled and replayed, nothing lost.

Real components: tansu brokers (stopped and restarted on the same port), the
gateway under uvicorn (in a thread, or as a ``trajlake gateway`` process that
is SIGKILLed), the fake engine over HTTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import httpx
import pytest
from gateway_helpers import KEY, emitter_state, read_topic, serve, wait_for

from devkit.broker import EmbeddedBroker
from devkit.ports import free_port
from ingest.gateway import create_gateway_app
from ingest.gateway.app import build_emitter

AUTH = {"authorization": f"Bearer {KEY}"}
TOPIC = "gw.events"


def call(url: str, n: int, *, prefix: str) -> None:
    for i in range(n):
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"{prefix} call {i}"}]}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10,
                       headers={**AUTH, "idempotency-key": f"{prefix}-{i}", "x-trajlake-rollout-id": prefix})
        assert r.status_code == 200, r.text


def assert_each_call_once(events: list[dict], *, keys: set[str]) -> None:
    seen = Counter((e["payload"]["call_id"], e["type"]) for e in events)
    assert set(seen.values()) == {1}, "an event arrived twice"
    assert {e["payload"]["idempotency_key"] for e in events if e["type"] == "llm.request"} == keys
    assert len(seen) == 2 * len(keys)  # a request and a response per call


def test_broker_down_mid_run_calls_succeed_spool_fills_and_replays_exactly_once(settings, tmp_path):
    first = EmbeddedBroker().start()
    first.create_topic(TOPIC, partitions=4)
    # The replacement broker listens on a second port (the first one sits in TIME_WAIT after the kill);
    # the gateway knows both, like a client of a real cluster.
    second = EmbeddedBroker(port=free_port())
    settings.bootstrap_servers = f"{first.bootstrap_servers},{second.bootstrap_servers}"
    settings.topic = TOPIC
    emitter = build_emitter(settings)
    emitter.retry_interval_s = 0.3
    try:
        with serve(create_gateway_app(settings, emitter=emitter)) as url:
            call(url, 3, prefix="before")
            state = lambda: emitter_state(emitter)  # noqa: E731
            wait_for(lambda: emitter.produced == 6, what="6 events produced", detail=state)
            assert_each_call_once(read_topic(first.bootstrap_servers, TOPIC, count=6),
                                  keys={f"before-{i}" for i in range(3)})
            first.kill()
            call(url, 8, prefix="during")  # every call still answered
            wait_for(lambda: emitter.spooled == 16, what="16 events spooled", detail=state, timeout_s=60)
            ready = httpx.get(f"{url}/readyz").json()
            assert ready["broker"] == "unreachable" and ready["spool"]["events"] == 16
            assert 'trajlake_gateway_spool_depth_events 16.0' in httpx.get(f"{url}/metrics").text

            second.start()
            second.create_topic(TOPIC, partitions=4)
            wait_for(lambda: emitter.spool.depth_records == 0, what="spool replayed", detail=state, timeout_s=60)
            assert httpx.get(f"{url}/readyz").json()["broker"] == "up"
            call(url, 2, prefix="after")
            wait_for(lambda: emitter.produced == 6 + 16 + 4, what="all events produced", detail=state)
            replayed = read_topic(second.bootstrap_servers, TOPIC, count=20)
            assert_each_call_once(replayed, keys={f"during-{i}" for i in range(8)} | {"after-0", "after-1"})
            during = [e for e in replayed if e["rollout_id"] == "during"]
            seqs = [e["seq"] for e in during]
            assert seqs == sorted(seqs)  # replayed in order (one rollout -> one partition)
            assert emitter.dropped == 0
    finally:
        first.kill()
        second.kill()


def start_gateway(env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "trajlake.cli", "gateway", "--port", str(port)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz") or proc.poll() is not None, what="gateway start")
    assert proc.poll() is None, proc.stderr.read().decode()
    return proc


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_gateway_killed_with_a_full_spool_loses_nothing_after_restart(settings, engine, tmp_path):
    broker_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    env = {"TRAJLAKE_UPSTREAM_URL": engine[0], "TRAJLAKE_GATEWAY_KEYS": f"{KEY}=acme",
           "TRAJLAKE_BOOTSTRAP_SERVERS": f"127.0.0.1:{broker_port}", "TRAJLAKE_TOPIC": TOPIC,
           "TRAJLAKE_SPOOL_DIR": str(tmp_path / "spool"), "TRAJLAKE_BROKER_TIMEOUT_S": "0.5"}
    gateway = start_gateway(env, gateway_port)
    try:
        call(url, 5, prefix="crash")
        wait_for(lambda: httpx.get(f"{url}/readyz").json()["spool"]["events"] == 10, what="10 spooled events")
        gateway.send_signal(signal.SIGKILL)
        gateway.wait()
        assert list((tmp_path / "spool").glob("*.seg"))
        with EmbeddedBroker(port=broker_port) as broker:
            broker.create_topic(TOPIC, partitions=4)
            gateway = start_gateway(env, gateway_port)
            wait_for(lambda: httpx.get(f"{url}/readyz").json()["spool"]["events"] == 0, what="replay after restart")
            events = read_topic(broker.bootstrap_servers, TOPIC, count=10)
            assert_each_call_once(events, keys={f"crash-{i}" for i in range(5)})
    finally:
        gateway.kill()
        gateway.wait()


def test_full_spool_keeps_serving_calls_and_says_so(settings, tmp_path, caplog):
    settings.bootstrap_servers = f"127.0.0.1:{free_port()}"
    settings.spool_max_bytes = 30_000  # room for about 20 of the 40 calls
    settings.broker_timeout_s = 0.3
    emitter = build_emitter(settings)
    with serve(create_gateway_app(settings, emitter=emitter)) as url:
        call(url, 40, prefix="flood")  # every call is answered
        wait_for(lambda: emitter.pending == 0 and emitter.dropped > 0, what="drops")
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "spool_full"
        metrics = httpx.get(f"{url}/metrics").text
        assert "trajlake_gateway_events_dropped_total 0.0" not in metrics
        refused = httpx.post(f"{url}/v1/events", json={"events": []}, headers=AUTH)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "spool_full"
    assert "SPOOL FULL" in caplog.text
    assert emitter.spooled + emitter.dropped == 80


@pytest.fixture(autouse=True)
def _quick_kafka_logs(caplog):
    caplog.set_level("ERROR", logger="kafka")
    caplog.set_level("INFO", logger="ingest.gateway")
