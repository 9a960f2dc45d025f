"""CPU seconds of some of this process's threads, picked by name: to charge CPU to the stage that spent it.

``time.process_time`` counts every thread. Around a stage of the ingester's loop it also counts librdkafka's
threads fetching the next records meanwhile (and, between commits, whatever delta-rs's runtime still runs):
those seconds landed in whichever stage was running. The main loop's stages are therefore timed with the
thread's own clock, and the commit (done by other threads) as the process's CPU less librdkafka's.
"""

from __future__ import annotations

import os
from pathlib import Path

KAFKA_THREADS = "rdk:"
"""How librdkafka names its threads (``rdk:main``, ``rdk:broker1``, ...)."""
_TASKS = Path("/proc/self/task")


class ThreadsCpu:
    """CPU seconds run so far by the live threads whose name starts with ``prefix`` (Linux ``/proc``, nanosecond
    run times from ``schedstat``; 0.0 where ``/proc`` cannot be read). Names are read once per thread id."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._named: dict[str, bool] = {}

    def __call__(self) -> float:
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return 0.0
        total = 0
        for tid in tids:
            if self._matches(tid):
                try:
                    total += int((_TASKS / tid / "schedstat").read_text().split()[0])
                except (OSError, ValueError, IndexError):  # the thread ended meanwhile
                    continue
        return total / 1e9

    def _matches(self, tid: str) -> bool:
        named = self._named.get(tid)
        if named is None:
            try:
                named = (_TASKS / tid / "comm").read_text().startswith(self.prefix)
            except OSError:
                return False
            self._named[tid] = named
        return named
