"""``trajlake scheduler``: exit codes a cron or CI job can trust, clean stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from store.lake import Lake
from store.runs import RunsTable, RunStatus


def corrupt_lake(root: Path) -> str:
    """A lake whose one table has an unreadable Delta log: compacting it fails."""
    log = root / "rollouts" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("garbage\n")
    return str(root)


def scheduler(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trajlake.cli", "scheduler", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200", "TRAJLAKE_LOG_LEVEL": "INFO", **env})


def test_once_exits_1_when_a_window_gives_up(tmp_path):
    proc = scheduler("--once", "--job", "compact", "--lake", corrupt_lake(tmp_path / "lake"),
                     TRAJLAKE_SCHEDULER_MAX_ATTEMPTS="1")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, out + err
    assert "gave_up" in out and "1 window(s) did not succeed: compact" in err and "Traceback" not in err


def test_once_exits_0_when_every_window_succeeds(tmp_path):
    proc = scheduler("--once", "--job", "compact", "--lake", str(tmp_path / "lake"))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err
    assert "succeeded" in out


def test_sigterm_while_waiting_for_a_retry_stops_cleanly_and_leaves_the_retry(tmp_path):
    lake = corrupt_lake(tmp_path / "lake")
    proc = scheduler("--once", "--job", "compact", "--lake", lake,
                     TRAJLAKE_SCHEDULER_MAX_ATTEMPTS="3", TRAJLAKE_SCHEDULER_BACKOFF_S="3600")
    for line in proc.stderr:
        if "run.failed" in line:  # attempt 1 failed; the scheduler now waits an hour for attempt 2
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    [run] = RunsTable(Lake(lake)).current().values()
    assert run.status is RunStatus.FAILED and run.retry_at is not None  # a later pass retries it


def test_serving_scheduler_exits_0_on_sigterm(tmp_path):
    proc = scheduler("--job", "compact", "--lake", str(tmp_path / "lake"))
    for line in proc.stdout:
        if "running" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "scheduler stopped" in out


def test_backfill_takes_rfc3339_and_names_the_flag(tmp_path):
    proc = scheduler("--once", "--job", "compact", "--backfill", "last week", "--lake", str(tmp_path / "lake"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "--backfill 'last week' is not an RFC 3339 time" in err
