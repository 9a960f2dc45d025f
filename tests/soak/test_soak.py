"""The mixed-fault soak, short: about a minute of calls through the gateway while the ingester, the broker and
the gateway are SIGKILLed, the object store freezes and the broker stays down a while; then every answered
call must be in the lake exactly once (``tests/soak/harness.py`` says how it is checked).

``TRAJLAKE_SOAK_SEED`` picks another fault schedule; the long run is ``python -m tests.soak --minutes 30``.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest

from tests.soak.check import account_for_log
from tests.soak.harness import FAULT_KINDS, Process, SoakPlan, fault_schedule, run_soak
from tests.soak.reaper import Reaper

SEED = int(os.environ.get("TRAJLAKE_SOAK_SEED", "1"))


def test_the_schedule_is_the_seeds_and_has_every_fault_kind():
    plan = SoakPlan(seed=SEED)
    assert fault_schedule(plan) == fault_schedule(plan)
    assert {f.kind for f in fault_schedule(plan)} == set(FAULT_KINDS)
    assert fault_schedule(plan) != fault_schedule(SoakPlan(seed=SEED + 1))


@pytest.mark.slow
@pytest.mark.timeout(900)  # a failing run waits out its drain bounds (~10 min) and still stops its processes
def test_mixed_faults_lose_and_duplicate_nothing(tmp_path):
    report = run_soak(SoakPlan(seed=SEED), workdir=tmp_path)
    print(report.render())
    assert report.answered > 0 and set(report.faults) == set(FAULT_KINDS), report.render()
    assert report.drained, report.render()
    assert not report.lost, report.render()
    assert not any(report.duplicated.values()), report.render()
    assert report.log_accounting["unaccounted"] == 0 and report.log_accounting["moved"] == 0, report.render()
    assert report.quarantined == 0 and not report.notes and report.ok, report.render()


def test_every_message_of_the_log_is_accounted_for():
    stored = {(0, 0): "a", (0, 1): "b", (1, 5): "c"}
    log = [(0, 0, "a"), (0, 1, "b"), (0, 2, "a"), (0, 3, "x"), (1, 4, "q"), (1, 5, "c"), (1, 6, "z")]
    assert account_for_log(log, stored, quarantined={(1, 4)}) == Counter(
        stored=3, duplicate=1, quarantined=1, unaccounted=2, moved=0)
    assert account_for_log([(0, 0, "b")], {(0, 0): "a", (0, 9): "c"}, set())["moved"] == 2
    # with the events markers: past a marker is not ingested yet ("behind"), at or below it is dropped
    assert account_for_log(log, stored, quarantined={(1, 4)}, markers={0: 3, 1: 5}) == Counter(
        stored=3, duplicate=1, quarantined=1, unaccounted=1, behind=1, moved=0)
    assert account_for_log([(2, 0, "x")], {}, set(), markers={})["behind"] == 1


def test_an_ingester_that_exits_with_an_error_says_why_in_the_report(tmp_path):
    """A failed soak in CI has no logs to read: the report carries each self-exit's code and last words."""
    log_path = tmp_path / "ingester-0.log"
    log_path.write_text("\n==== start 0 at 00:00:00\nearlier run: fine\n")
    script = ("import sys; print('2026-01-01 DEBUG noise'); "
              "print('error: topic t no longer matches the lake\\'s markers:'); print('  partition 0: marker 4'); "
              "sys.exit(3)")
    with Reaper() as reaper:
        process = Process("ingester-0", [sys.executable, "-c", script], {}, log_path, reaper)
        process.start()
        process.proc.wait(30)
        assert process.reap()
    assert process.exits == Counter({3: 1})
    assert process.failures == [
        "ingester-0 exited 3: error: topic t no longer matches the lake's markers: partition 0: marker 4"]
