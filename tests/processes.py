"""Helpers for tests that signal a ``trajlake`` process."""

from __future__ import annotations

import signal
import time


def wait_until_it_catches_sigterm(pid: int, timeout_s: float = 60.0) -> None:
    """Block until the process has a SIGTERM handler (``SigCgt`` in /proc): the CLI installs it first thing
    for long-running commands; before that, no program could stop cleanly (Python is starting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never installed a SIGTERM handler")


def wait_until_it_has_computed(pid: int, cpu_s: float, timeout_s: float = 120.0) -> None:
    """Block until the process has used ``cpu_s`` seconds of CPU (all its threads): past its start-up, inside the
    long computation the test gave it, on a busy machine too."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        if (int(fields[11]) + int(fields[12])) / tick >= cpu_s:  # utime, stime
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} used less than {cpu_s} s of CPU in {timeout_s} s")
