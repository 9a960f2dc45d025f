"""The loop keeps its consumer polled while the log check of a new assignment runs (soak finding F8).

A group member that stops polling does not rejoin a rebalance, and every other member's join waits for it: two
ingesters checking their markers against a slow broker (tansu on ``s3://`` after a restart) took turns holding
up each other's joins for minutes. Fakes for the consumer and the probe, a real (empty) lake; no broker.
"""

import threading

from ingest.consumer import AssignmentFlag
from ingest.dedupe import SeenEventIds
from ingest.ingester import IngesterConfig, _Loop, _Tables
from ingest.log_check import LogUnverifiable

BOUND_S = 60.0
"""How long a fake waits for what the loop should do; it only bounds how long a failing run takes."""


class Consumer:
    """Polls return nothing; ``on_poll`` runs at each poll; ``seek`` records where the loop positioned it."""

    def __init__(self, partitions, flag: AssignmentFlag, stop: threading.Event):
        self.partitions_owned, self.flag, self.stop = set(partitions), flag, stop
        self.polled = threading.Event()
        self.sought: dict[int, int | None] = {}
        self.on_poll = lambda: None

    def partitions(self):
        return sorted(self.partitions_owned)

    def heard_from_broker(self):
        return True

    def poll(self, *, timeout_ms, max_records):
        self.polled.set()
        self.on_poll()
        if self.sought:
            self.stop.set()
        return []

    def seek(self, resume):
        self.sought = dict(resume)


class Probe:
    """``read`` runs ``reads[n]`` for its n-th call (what a slow broker does meanwhile)."""

    def __init__(self, *reads):
        self.interrupted = threading.Event()
        self.reads, self.calls = list(reads), 0

    def read(self, offsets):
        self.calls += 1
        self.reads.pop(0)()
        return {p: None for p in offsets}

    def end_offsets(self, partitions):
        return {p: 1 for p in partitions}


def run_loop(lake, consumer: Consumer, probe: Probe, flag: AssignmentFlag) -> _Loop:
    config = IngesterConfig(lake=lake.root, bootstrap_servers="unused", topic="t")
    loop = _Loop(config, lake, _Tables(lake, group="g", topic="t"), consumer, None, flag, None, probe)
    flag.raise_()  # as after the first assignment
    try:
        loop.run(consumer.stop)
    finally:
        loop.check.close()
    return loop


def test_the_consumer_is_polled_while_the_markers_are_checked(lake):
    flag, stop = AssignmentFlag(), threading.Event()
    consumer = Consumer([0, 1], flag, stop)
    polled_during_check = []
    probe = Probe(lambda: polled_during_check.append(consumer.polled.wait(BOUND_S)))
    loop = run_loop(lake, consumer, probe, flag)
    assert polled_during_check == [True]
    assert consumer.sought == {0: None, 1: None} and loop.stats.assignments == 1


def test_the_consumer_is_polled_while_the_lake_is_read_for_a_new_assignment(lake, monkeypatch):
    """The markers, dedupe ids and quarantine are read on the check's thread too: on a loaded object store those
    reads took 14-48 s per assignment, and the loop did not poll meanwhile (soak, 30-minute run)."""
    flag, stop = AssignmentFlag(), threading.Event()
    consumer = Consumer([0, 1], flag, stop)
    polled_during_reads = []
    load = SeenEventIds.load

    def slow_load(self, *args, **kwargs):
        polled_during_reads.append(consumer.polled.wait(BOUND_S))
        return load(self, *args, **kwargs)

    monkeypatch.setattr(SeenEventIds, "load", slow_load)
    loop = run_loop(lake, consumer, Probe(lambda: None, lambda: None), flag)  # the check's read, a later recheck's
    assert polled_during_reads == [True]
    assert consumer.sought == {0: None, 1: None} and loop.stats.assignments == 1


def test_a_rebalance_during_the_check_interrupts_it_and_the_new_assignment_is_checked(lake):
    flag, stop = AssignmentFlag(), threading.Event()
    consumer = Consumer([0, 1], flag, stop)

    def rebalance_once():
        consumer.on_poll = lambda: None
        consumer.partitions_owned = {2}
        flag.raise_()  # what the rebalance listener does inside poll

    consumer.on_poll = rebalance_once
    interrupted = []

    def slow_read():  # the broker does not answer until the check is interrupted
        interrupted.append(probe.interrupted.wait(BOUND_S))
        raise LogUnverifiable("interrupted")

    probe = Probe(slow_read, lambda: None)
    loop = run_loop(lake, consumer, probe, flag)
    assert interrupted == [True] and probe.calls == 2
    assert consumer.sought == {2: None} and loop.stats.partitions == (2,) and loop.stats.assignments == 1
