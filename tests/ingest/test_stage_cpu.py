"""The ingester's CPU split by stage charges each stage with the CPU of the threads that did its work."""

import ctypes
import threading
import time

from ingest.ingester import IngestStats, _cpu, _cpu_but
from ingest.thread_cpu import ThreadsCpu

PR_SET_NAME = 15


def spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class Spinner:
    """A thread named ``name`` (as the kernel sees it) that burns ``seconds`` of CPU when told to, then stays alive
    until ``end`` (``/proc`` lists live threads only, as librdkafka's live as long as the consumer)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.ready, self.go, self.spun, self.done = (threading.Event() for _ in range(4))
        self.thread = threading.Thread(target=self._run, args=(name.encode(), seconds))
        self.thread.start()
        self.ready.wait()

    def _run(self, name: bytes, seconds: float) -> None:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
        self.ready.set()
        self.go.wait()
        spin(seconds)
        self.spun.set()
        self.done.wait()

    def run(self) -> None:
        self.go.set()
        self.spun.wait()

    def end(self) -> None:
        self.done.set()
        self.thread.join()


def test_threads_cpu_counts_only_the_named_threads():
    mine = ThreadsCpu("rdk:")
    before = mine()
    other = Spinner("tokio-test", 0.3)
    other.run()
    assert mine() - before < 0.05
    fetcher = Spinner("rdk:test", 0.3)
    fetcher.run()
    assert mine() - before >= 0.25
    other.end()
    fetcher.end()


def test_a_loop_stage_is_not_charged_with_a_fetch_thread_running_meanwhile():
    stats = IngestStats()
    fetcher = Spinner("rdk:fetch", 0.4)
    with _cpu(stats, "decode"):
        spin(0.05)
        fetcher.run()  # runs while the stage waits: librdkafka prefetching during a decode
    fetcher.end()
    assert 0.04 <= stats.cpu_s["decode"] < 0.2


def test_a_commit_is_charged_with_its_worker_threads_but_not_the_fetch_threads():
    stats = IngestStats()
    writer, fetcher = Spinner("commit_0", 0.3), Spinner("rdk:broker1", 0.3)
    with _cpu_but(stats, "commit", ThreadsCpu("rdk:")):
        writer.run()
        fetcher.run()
    writer.end()
    fetcher.end()
    assert 0.25 <= stats.cpu_s["commit"] < 0.45


def test_a_fetch_thread_that_ends_during_a_commit_keeps_its_cpu_out_of_the_commit():
    """librdkafka ends a broker's thread when the broker leaves the cluster's metadata (review2)."""
    stats, kafka = IngestStats(), ThreadsCpu("rdk:")
    broker = Spinner("rdk:broker7", 0.5)
    broker.run()
    kafka()  # read while it lives, as the ingester reads before each commit
    with _cpu_but(stats, "commit", kafka):
        broker.done.set()
        broker.thread.join()
    assert stats.cpu_s["commit"] < 0.2
