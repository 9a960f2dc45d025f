"""The soak's processes die with it, however it dies (SIGTERM, SIGKILL, a crash).

Linux's parent-death signal follows the *thread* that started a child, and the
soak starts and restarts its processes from two threads (the load's and the
fault thread, which ends before the drain), so it cannot be used. Instead a
watchdog process, in a session of its own, holds the read end of a pipe whose
write end only the soak holds: when the soak exits by any means, the pipe
closes and the watchdog SIGKILLs every process (and its process group) it was
told about. ``Reaper.adopt`` tells it about the soak's children as they are now
(new ones added, ended ones dropped, so a reused pid is never killed); children
the process had before the reaper started are never adopted (under pytest the
session's S3 server and broker are children of the same worker).

>>> with Reaper() as reaper:  # doctest: +SKIP
...     subprocess.Popen(["sleep", "600"], start_new_session=True)
...     reaper.adopt()
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

WATCHDOG = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
pids = set()
for line in sys.stdin:
    sign, pid = line[:1], int(line[1:])
    (pids.add if sign == "+" else pids.discard)(pid)
for pid in pids:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


class Reaper:
    """A watchdog that SIGKILLs the processes it was told about once this process is gone."""

    def __init__(self, *, spare: frozenset[int] = frozenset()) -> None:
        self.spare = spare | _children()
        """Children that must outlive this process: ``spare`` (e.g. an S3 server the caller owns) and every
        child this process had before the reaper (in a test run: the session's S3 server and broker)."""
        self._watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=subprocess.PIPE,
                                          start_new_session=True, text=True)
        self._known: set[int] = set()
        self._lock = threading.Lock()

    def adopt(self) -> None:
        """Tell the watchdog about this process's children as they are now (the watchdog aside)."""
        with self._lock:
            now = _children() - {self._watchdog.pid, *self.spare}
            lines = [f"+{p}\n" for p in now - self._known] + [f"-{p}\n" for p in self._known - now]
            if lines and self._watchdog.stdin is not None:
                self._watchdog.stdin.write("".join(lines))
                self._watchdog.stdin.flush()
            self._known = now

    def close(self) -> None:
        """Kill what is still running of the adopted processes now, and end the watchdog."""
        self.adopt()  # drops the ones that ended: their pids may be another process's by now
        with self._lock:
            if self._watchdog.stdin is not None:
                self._watchdog.stdin.close()
        self._watchdog.wait()

    def __enter__(self) -> Reaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _children() -> set[int]:
    """Pids of this process's children (every thread's), from /proc."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out
