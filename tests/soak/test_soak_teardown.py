"""A soak killed hard leaves no process behind (S3 server, broker, engine, gateway, ingesters, its watchdog).

The long run is started as an operator would (``python -m tests.soak``), with a marker in its environment
that every process it starts inherits; once all of its processes run, it gets SIGTERM or SIGKILL, and no
process holding the marker may remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 180.0
"""How long to wait for a state (processes started, processes gone); only bounds a failing run."""


def carrying(marker: str) -> set[int]:
    """Pids of live processes whose environment holds ``marker``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.add(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {BOUND_S:.0f} s: {what}")
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_soak_leaves_no_process(tmp_path, sig):
    marker = f"TRAJLAKE_SOAK_TEARDOWN_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    harness = subprocess.Popen(
        [sys.executable, "-m", "tests.soak", "--minutes", "10", "--rate", "1", "--workdir", str(tmp_path)],
        cwd=ROOT, env={**os.environ, name: value}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        # the last processes it starts are the ingesters: S3 server, broker, engine, gateway, 2 ingesters, watchdog
        wait_for(lambda: (tmp_path / "ingester-1.log").exists() and len(carrying(marker) - {harness.pid}) >= 7,
                 "the soak's processes running")
        harness.send_signal(sig)
        harness.wait(BOUND_S)
        wait_for(lambda: not carrying(marker), "every process of the soak gone")
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        for pid in carrying(marker):  # a failed run's leftovers
            os.kill(pid, signal.SIGKILL)


def test_the_reaper_spares_children_its_process_had_before_it():
    """Under pytest the session's S3 server and broker are children of the worker that runs the CI soak: the
    soak's watchdog killed them with its own processes (seen in CI: the next S3 test could not connect)."""
    from tests.soak.reaper import Reaper

    session_server = subprocess.Popen(["sleep", "120"])
    try:
        with Reaper() as reaper:
            soak_child = subprocess.Popen(["sleep", "120"], start_new_session=True)
            reaper.adopt()
        assert soak_child.wait(timeout=30) == -signal.SIGKILL
        assert session_server.poll() is None
    finally:
        session_server.kill()
        session_server.wait()


class _RecordingBroker:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def kill(self) -> None:
        self.calls.append("kill")

    def start(self, timeout_s: float) -> None:
        self.calls.append("start")


@pytest.mark.parametrize("kind", ["broker_down", "store_freeze"])
def test_a_fault_in_progress_ends_once_the_run_is_torn_down(kind):
    """A SIGTERM during a 60-s broker outage waited it out (and the broker's restart, retried up to 5 minutes)
    before the soak stopped its processes: the teardown test saw the harness alive 180 s after SIGTERM."""
    import random
    import threading

    from tests.soak.harness import Cluster, Fault, _inject

    cluster = Cluster.__new__(Cluster)  # only the parts a fault touches
    cluster.broker, cluster.frozen = _RecordingBroker(), False
    cluster.freeze_store = lambda: cluster.broker.calls.append("freeze")
    cluster.thaw_store = lambda: cluster.broker.calls.append("thaw")
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_inject(cluster, Fault(0.0, kind, hold_s=3600.0),
                                                      random.Random(1), stop), done.set()), daemon=True)
    worker.start()
    worker.join(BOUND_S)
    assert done.is_set(), f"the {kind} fault was still holding after the run was torn down"
    assert cluster.broker.calls == {"broker_down": ["kill"], "store_freeze": ["freeze", "thaw"]}[kind]
