"""``trajlake query-api``: refuses to start without keys; serves the lake over real HTTP (a uvicorn process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from devkit.ports import free_port
from trajlake.cli import Shell
from trajlake.commands import query_api

REPO = Path(__file__).parents[2]


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer(cls=Shell, pretty_exceptions_enable=False)  # the shell's error handler

    @app.callback()
    def _root() -> None:
        """trajlake"""

    query_api.register(app)
    return app


@pytest.mark.parametrize("args,env,message", [
    ([], {}, "no query API keys configured"),
    (["--keys-file", "/nonexistent/keys"], {}, "cannot read keys file"),
    ([], {"TRAJLAKE_QUERY_API_KEYS": "just-a-key"}, "is not key=tenant"),
    ([], {"TRAJLAKE_QUERY_API_KEYS": "k=t", "TRAJLAKE_DEFAULT_PAGE_ROWS": "5000"}, "default_page_rows"),
    ([], {"TRAJLAKE_QUERY_API_KEYS": "k=t", "TRAJLAKE_QUERY_TIMEOUT_S": "soon"}, "query_timeout_s"),
    ([], {"TRAJLAKE_QUERY_API_KEYS": "k=t", "TRAJLAKE_MAX_QUERIES_PER_TENANT": "9"}, "could take every slot"),
])
def test_bad_configuration_stops_the_command_with_a_message(cli, tmp_path, args, env, message):
    env = {"TRAJLAKE_QUERY_API_KEYS": None, "TRAJLAKE_QUERY_API_KEYS_FILE": None, **env}
    result = CliRunner(env=env).invoke(cli, ["query-api", "--lake", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_the_command_serves_the_lake_to_each_key_over_http(api_lake, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nsk-acme=acme\nsk-beta=beta\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRAJLAKE_QUERY_API_KEYS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "query-api", "--port", str(port),
         "--lake", api_lake.root, "--keys-file", str(keys)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(base, proc)
        query = {"sql": "SELECT DISTINCT tenant FROM rollouts"}
        acme = httpx.post(f"{base}/v1/sql", json=query, headers={"Authorization": "Bearer sk-acme"})
        assert acme.json()["rows"] == [["acme"]]
        beta = httpx.get(f"{base}/v1/rollouts", headers={"X-Api-Key": "sk-beta"})
        assert [r["rollout_id"] for r in beta.json()["items"]] == ["r1", "r9"]
        assert httpx.post(f"{base}/v1/sql", json=query).status_code == 401
        long_headers = httpx.get(f"{base}/healthz", headers={"X-Big": "a" * 100_000})
        assert long_headers.status_code == 431 and long_headers.json()["error"]["code"] == "headers_too_large"
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0]
    assert "query API" in output


def _wait_until_up(base: str, proc: subprocess.Popen) -> None:
    """Poll /healthz until the server answers (gives up after 60 s, or at once when the process exits)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"query-api exited with {proc.returncode}: {proc.communicate()[0]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail("query-api did not answer /healthz within 60 s")
