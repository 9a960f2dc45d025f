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
    """CPU seconds run so far by the threads whose name starts with ``prefix`` (Linux ``/proc``, nanosecond run
    times from ``schedstat``; 0.0 where ``/proc`` cannot be read). A thread is known by its id and start time (Linux
    reuses ids), and one that ended keeps its last reading, so the figure never falls when a thread ends (librdkafka
    ends a broker's thread when the broker leaves the cluster): what it ran after its last reading is lost."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._seen: dict[tuple[str, str], int] = {}
        """(thread id, start time) of each matching thread seen -> its nanoseconds at the last reading."""

    def __call__(self) -> float:
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return 0.0
        for tid in tids:
            try:
                stat = (_TASKS / tid / "stat").read_text()
                name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                if name.startswith(self.prefix):
                    self._seen[(tid, rest[19])] = int((_TASKS / tid / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended meanwhile
                continue
        return sum(self._seen.values()) / 1e9
