"""One training process per dataset version at a time: leases in the ``train_leases`` table.

Before a run touches its folder, rank 0 claims the version (``store.claims``:
a Delta commit carrying the app transaction ``train:<dataset>@<version>``;
of processes racing for it exactly one commits). The holder renews its
lease every third of ``lease`` while it trains and releases it when it
stops. A version whose lease is held is refused (``VersionHeld``); a lease
that expired (its holder died or hung), or whose holder is a dead process on
this host, is taken over by the next claim.

Each claim writes into its own folder ``<out>/<run id>/claim-<n>``, so no
two processes ever write the same folder and nothing is deleted at start.
A takeover resumes from the newest restart point any earlier claim of the
same run left behind (their folders are recorded in the claim rows).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from schemas.tables import TRAIN_LEASES, TRAIN_LEASES_TABLE
from store.claims import ClaimLost, Heartbeat, claims_table, commit_claim, commit_fenced
from store.lake import Lake
from trainer.errors import TrainerError

log = logging.getLogger(__name__)

CLAIM_RACES = 5
"""Claims lost to a concurrent commit before giving the version up for now."""


class VersionHeld(TrainerError):
    """Another process holds the version's lease (it is training it now)."""


class LeaseLost(TrainerError):
    """This process's lease was taken over: another process trains the version now."""


@dataclass(frozen=True)
class Lease:
    """One ``train_leases`` row."""

    dataset: str
    dataset_version: int
    claim: int
    run_id: str
    owner: str
    host: str
    pid: int
    run_dir: str
    lease_until: datetime | None
    recorded_at: datetime

    @property
    def app_id(self) -> str:
        return lease_app_id(self.dataset, self.dataset_version)

    def held(self, now: datetime) -> bool:
        """Still held: not released, not expired, and (on this host) its process is alive."""
        if self.lease_until is None or self.lease_until <= now:
            return False
        return self.host != socket.gethostname() or _alive(self.pid)

    def row(self) -> pa.Table:
        return pa.Table.from_pylist([vars(self)], schema=TRAIN_LEASES)


def lease_app_id(dataset: str, version: int) -> str:
    """The Delta app transaction id that owns the training of one dataset version."""
    return f"train:{dataset}@{version}"


def history(lake: Lake, dataset: str, version: int) -> list[Lease]:
    """Every row of one version, in claim order."""
    if not lake.exists(TRAIN_LEASES_TABLE):
        return []
    return _rows(lake, lake.table(TRAIN_LEASES_TABLE), dataset, version)


def _rows(lake: Lake, snapshot: DeltaTable, dataset: str, version: int) -> list[Lease]:
    table = lake.read(snapshot, filter=(pc.field("dataset") == dataset) & (pc.field("dataset_version") == version))
    rows = [Lease(**r) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: (r.claim, r.recorded_at, r.lease_until is None))


def take(lake: Lake, dataset: str, version: int, *, run_id: str, out: Path, lease: timedelta) -> tuple[Lease, list[Lease]]:
    """Claim the version for ``run_id``; returns the lease and the earlier claims of the same run (newest first).

    Raises ``VersionHeld`` when another process holds it (or keeps winning the race for it).
    """
    current: Lease | None = None
    for _ in range(CLAIM_RACES):
        snapshot = claims_table(lake, TRAIN_LEASES_TABLE, TRAIN_LEASES)
        rows = _rows(lake, snapshot, dataset, version)
        now = datetime.now(UTC)
        current = rows[-1] if rows else None
        if current is not None and current.held(now):
            break
        claim = (snapshot.transaction_version(lease_app_id(dataset, version)) or 0) + 1
        mine = Lease(
            dataset=dataset, dataset_version=version, claim=claim, run_id=run_id, owner=_owner(),
            host=socket.gethostname(), pid=os.getpid(), run_dir=str((out / run_id / f"claim-{claim}").resolve()),
            lease_until=now + lease, recorded_at=now,
        )  # fmt: skip
        try:
            commit_claim(snapshot, mine.row(), app_id=mine.app_id, claim=claim)
        except ClaimLost:
            continue
        if current is not None:
            log.info("event=lease_taken_over dataset=%s version=%d claim=%d from=%s", dataset, version, claim, current.owner)
        earlier = [r for r in reversed(rows) if r.run_id == run_id]
        return mine, list({r.claim: r for r in earlier}.values())
    until = f" until {current.lease_until:%Y-%m-%d %H:%M:%S} UTC" if current and current.lease_until else ""
    who = f"{current.owner} on {current.host}" if current else "another process"
    raise VersionHeld(
        f"{dataset}@{version} is being trained by {who} (lease{until}, renewed while it runs): "
        "wait for it, or stop that process; a dead holder's lease expires on its own"
    )


def renew(lake: Lake, held: Lease, *, lease: timedelta) -> Lease:
    """Extend the lease; ``ClaimLost`` once another process took the version over."""
    now = datetime.now(UTC)
    renewed = replace(held, lease_until=now + lease, recorded_at=now)
    commit_fenced(lake, TRAIN_LEASES_TABLE, renewed.row(), app_id=held.app_id, claim=held.claim)
    return renewed


def release(lake: Lake, held: Lease) -> None:
    """Give the version up (finished, failed or stopped); a lease already taken over stays with its new holder."""
    released = replace(held, lease_until=None, recorded_at=datetime.now(UTC))
    try:
        commit_fenced(lake, TRAIN_LEASES_TABLE, released.row(), app_id=held.app_id, claim=held.claim)
    except ClaimLost:
        log.warning("event=lease_already_taken_over dataset=%s version=%d", held.dataset, held.dataset_version)


class LeaseKeeper(Heartbeat):
    """Renews a lease in a thread while the run trains; ``check()`` raises ``LeaseLost`` once it was taken over."""

    def __init__(self, lake: Lake, held: Lease, *, lease: timedelta) -> None:
        super().__init__(self._renew, every_s=lease.total_seconds() / 3, name=held.app_id)
        self.lake, self.held, self.lease = lake, held, lease

    def _renew(self) -> None:
        self.held = renew(self.lake, self.held, lease=self.lease)

    def check(self) -> None:
        if self.lost is not None:
            raise LeaseLost(
                f"{self.held.dataset}@{self.held.dataset_version}: this process lost its lease ({self.lost}); "
                "another process trains the version now, so this one stops without writing anything more"
            )


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
