"""``trajlake serve-model`` as users run it: a real process on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
from typer.testing import CliRunner

from trajlake.cli import build_app


def test_serve_model_defaults_to_the_tiny_model_and_prints_its_url(tiny_model_dir):
    env = {**os.environ, "TRAJLAKE_SERVE_POLICY_VERSION": "from-env", "TRAJLAKE_HOME": str(tiny_model_dir.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "serve-model", "--port", "0", "--served-name", "tiny-cli"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        lines = []
        while not (line := proc.stdout.readline()).startswith("export OPENAI_BASE_URL="):
            assert line, f"serve-model exited early: {''.join(lines)} {proc.stderr.read()}"
            lines.append(line)
        url = line.strip().split("=", 1)[1]
        assert f"{tiny_model_dir}" in "".join(lines) and "tiny-cli" in "".join(lines)
        [entry] = httpx.get(url + "/models", timeout=60).json()["data"]
        assert (entry["id"], entry["policy_version"]) == ("tiny-cli", "from-env")
        answer = httpx.post(url + "/completions", json={"prompt": "x", "max_tokens": 2, "return_token_ids": True})
        assert len(answer.json()["choices"][0]["token_ids"]) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        returncode, errors = proc.wait(), proc.stderr.read()
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert returncode == 0 and "Traceback" not in errors


def test_a_folder_that_is_not_a_model_is_refused_with_advice(tmp_path):
    result = CliRunner().invoke(build_app(), ["serve-model", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a Hugging Face model folder" in result.output


def test_a_busy_port_or_a_bad_setting_fails_fast_with_a_message(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        result = CliRunner().invoke(build_app(), ["serve-model", "--port", port])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output
    monkeypatch.setenv("TRAJLAKE_SERVE_THREADS", "many")
    result = CliRunner().invoke(build_app(), ["serve-model", "--port", "0"])
    assert result.exit_code == 2 and "threads" in result.output
