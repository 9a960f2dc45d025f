"""Services stop cleanly: SIGTERM (what docker stop sends) ends gateway, query-api and serve-model with exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from devkit.ports import free_port


def serve(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trajlake.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200", **env})


def wait_for(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> bytes:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read()
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{url} never answered (rc={proc.poll()}): {proc.communicate()[0][-2000:]}")
            time.sleep(0.1)


def stop(proc: subprocess.Popen, sig: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0]
    return proc.returncode, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_gateway_exits_0_on_sigterm_and_takes_the_connection_flags(tmp_path, sig):
    port = free_port()
    proc = serve(["gateway", "--port", str(port), "--spool-dir", str(tmp_path / "spool"),
                  "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topic", "other.events"],
                 {"TRAJLAKE_ALLOW_ANONYMOUS": "true"})
    wait_for(f"http://127.0.0.1:{port}/healthz", proc)
    rc, out = stop(proc, sig)
    assert rc == 0, out
    assert "topic other.events" in out and "Traceback" not in out and "Aborted" not in out


def test_query_api_exits_0_on_sigterm(tmp_path):
    port = free_port()
    proc = serve(["query-api", "--port", str(port), "--lake", str(tmp_path / "lake")],
                 {"TRAJLAKE_QUERY_API_KEYS": "k=t"})
    wait_for(f"http://127.0.0.1:{port}/healthz", proc)
    rc, out = stop(proc)
    assert rc == 0, out


def test_serve_model_exits_0_on_sigterm(tiny_model_dir):
    port = free_port()
    proc = serve(["serve-model", "--model", str(tiny_model_dir), "--port", str(port)], {})
    assert json.loads(wait_for(f"http://127.0.0.1:{port}/v1/models", proc))["data"]
    rc, out = stop(proc)
    assert rc == 0, out


def test_gateway_with_bad_settings_exits_2_without_a_traceback(tmp_path):
    proc = serve(["gateway", "--port", str(free_port()), "--spool-dir", str(tmp_path / "spool")],
                 {"TRAJLAKE_UPSTREAM_RETRIES": "many", "TRAJLAKE_ALLOW_ANONYMOUS": "true"})
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "gateway not started" in out and "Traceback" not in out


def _worker_args(worker: str, request: pytest.FixtureRequest, tmp_path) -> list[str]:
    lake = ["--lake", str(tmp_path / "lake")]
    if worker == "ingest":
        broker = request.getfixturevalue("broker")
        return ["ingest", "--bootstrap-servers", broker.bootstrap_servers, "--topic", request.getfixturevalue("topic"),
                "--group", request.getfixturevalue("group"), *lake]
    if worker == "scheduler":
        return ["scheduler", "--job", "compact", *lake]
    return ["train", "--follow", "--no-kafka", "--model", str(request.getfixturevalue("tiny_model_dir")), *lake]


@pytest.mark.parametrize("worker, family", [("ingest", "trajlake_ingester_events"),
                                            ("scheduler", "trajlake_scheduler_failures"),
                                            ("train", "trajlake_trainer_steps")])
def test_workers_serve_prometheus_metrics_on_metrics_port(worker, family, request, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    proc = serve([*_worker_args(worker, request, tmp_path), "--metrics-port", str(port)], {})
    text = wait_for(f"http://127.0.0.1:{port}/metrics", proc).decode()
    assert family in {f.name for f in text_string_to_metric_families(text)}, text
    if worker == "train":  # its stop handler comes after the metrics port (train is no SERVICE: see trajlake.signals)
        assert any(line.startswith("following") for line in proc.stdout), proc.communicate()[0]
    rc, out = stop(proc)
    assert rc == 0, out
