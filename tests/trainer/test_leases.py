"""Leases on dataset versions (no training): one winner of a race, takeover of expired or dead holders, fencing."""

from __future__ import annotations

import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from schemas.tables import TRAIN_LEASES, TRAIN_LEASES_TABLE
from store.claims import ClaimLost, claims_table, commit_claim
from store.lake import Lake
from trainer.leases import Lease, VersionHeld, history, release, renew, take

LEASE = timedelta(minutes=5)


def _held_elsewhere(lake: Lake, *, until: datetime, host: str = "other-host", pid: int = 1) -> Lease:
    """A claim committed by a process on another machine (or a given pid here)."""
    now = datetime.now(UTC)
    lease = Lease("syn", 0, 1, "run-a", f"{host}:{pid}:x", host, pid, "/elsewhere/run-a/claim-1", until, now)
    commit_claim(claims_table(lake, TRAIN_LEASES_TABLE, TRAIN_LEASES), lease.row(), app_id=lease.app_id, claim=1)
    return lease


def test_of_processes_racing_for_a_version_exactly_one_wins(lake, tmp_path):
    def attempt(_: int) -> str:
        try:
            take(lake, "syn", 0, run_id="run-a", out=tmp_path, lease=LEASE)
            return "won"
        except VersionHeld:
            return "held"

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(attempt, range(6)))
    assert sorted(outcomes) == ["held"] * 5 + ["won"]
    assert [r.claim for r in history(lake, "syn", 0)] == [1]


def test_a_live_lease_elsewhere_is_respected_and_an_expired_one_taken_over(lake, tmp_path):
    _held_elsewhere(lake, until=datetime.now(UTC) + LEASE)
    with pytest.raises(VersionHeld, match="syn@0 is being trained by other-host:1:x on other-host"):
        take(lake, "syn", 0, run_id="run-a", out=tmp_path, lease=LEASE)
    lake2 = Lake(str(tmp_path / "lake2"))
    dead = _held_elsewhere(lake2, until=datetime.now(UTC) - timedelta(seconds=1))
    mine, earlier = take(lake2, "syn", 0, run_id="run-a", out=tmp_path, lease=LEASE)
    assert mine.claim == 2 and mine.run_dir == str((tmp_path / "run-a" / "claim-2").resolve())
    assert [e.run_dir for e in earlier] == [dead.run_dir]  # where the takeover looks for a restart point
    with pytest.raises(ClaimLost):  # the old holder, if it still runs, can no longer renew
        renew(lake2, dead, lease=LEASE)
    release(lake2, dead)  # nor release the new holder's lease
    assert history(lake2, "syn", 0)[-1].lease_until == mine.lease_until


def test_a_lease_whose_process_is_gone_on_this_host_is_taken_over_at_once(lake, tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _held_elsewhere(lake, until=datetime.now(UTC) + LEASE, host=socket.gethostname(), pid=int(gone.stdout))
    mine, _ = take(lake, "syn", 0, run_id="run-b", out=tmp_path, lease=LEASE)
    assert mine.claim == 2
    release(lake, mine)
    again, earlier = take(lake, "syn", 0, run_id="run-b", out=tmp_path, lease=LEASE)  # released: free at once
    assert again.claim == 3 and [e.claim for e in earlier] == [2]
