"""``trajlake ingest`` exit codes: SIGTERM at any point of start-up is a clean stop (0); no broker is one
clear line and exit 1; the codes are in ``--help``."""

import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.processes import wait_until_it_catches_sigterm


def start(broker_address: str, lake, topic: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", lake.root, "--bootstrap-servers", broker_address,
         "--topic", topic, "--group", f"g-{uuid.uuid4().hex[:10]}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
    )


@pytest.mark.parametrize("when", ["starting up", "joining the group"])
def test_sigterm_during_start_up_is_a_clean_stop(broker, topic, lake, when):
    proc = start(broker.bootstrap_servers, lake, topic)
    if when == "starting up":
        wait_until_it_catches_sigterm(proc.pid)
    else:
        assert proc.stdout.readline().startswith(b"ingesting")  # printed just before the consumer starts
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err


def test_no_broker_is_one_clear_line_and_exit_1(lake):
    proc = start("127.0.0.1:1", lake, "t", TRAJLAKE_BOOTSTRAP_TIMEOUT_MS="1500")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "no Kafka broker answers at 127.0.0.1:1" in lines[0]


def test_help_documents_the_exit_codes():
    out = subprocess.run([sys.executable, "-m", "trajlake.cli", "ingest", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    text = " ".join(out.split())
    assert "Exit codes: 0 stopped cleanly" in text and "3 the log went backwards" in text and "--recover" in text


def test_a_lake_storage_failure_mid_run_is_one_clear_line_and_exit_1(monkeypatch, tmp_path):
    """Seen in the soak: an S3 read timing out while the store was frozen ended with "a bug" (OSError unhandled)."""
    from typer.testing import CliRunner

    import ingest.ingester
    from trajlake.cli import build_app

    def store_times_out(*args, **kwargs):
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached")

    monkeypatch.setattr(ingest.ingester, "run_ingester", store_times_out)
    result = CliRunner().invoke(build_app(), ["ingest", "--lake", str(tmp_path / "lake"), "--bootstrap-servers",
                                              "127.0.0.1:1", "--topic", "t"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "the lake's storage failed while ingesting: AWS Error NETWORK_CONNECTION" in result.output
    assert "nothing is lost" in result.output and "a bug" not in result.output and "Traceback" not in result.output
