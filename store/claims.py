"""Claims: one owner per key at a time, decided by Delta app transactions.

A claim on a key is an append that carries the app transaction
``app_id -> n`` (n = the key's previous claim + 1). delta-rs rejects a commit
whose app transaction id was also written by a commit that landed after the
writer's snapshot ("Concurrent transaction failed", a ``CommitFailedError``),
and a writer whose snapshot already holds claim n sees it and stays away. So
of several processes racing for a key exactly one commits claim n, on local
disk (atomic no-overwrite rename) and on S3 (conditional put, see
``store.storage``). Every later row of the owner (a lease renewal, a result)
is written with the same app transaction after checking that the table still
names claim n (fencing): an owner that was taken over can no longer write.

Used by the scheduler (``store.runs``: one run per window) and the trainer
(one training run per dataset version). ``Heartbeat`` renews a lease in a
thread while the owner works.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from store.lake import Lake
from schemas.errors import Conflict

log = logging.getLogger(__name__)


class ClaimLost(Conflict):
    """Another process committed a claim on this key first (or took it over)."""


def claims_table(lake: Lake, name: str, schema: pa.Schema) -> DeltaTable:
    """The table as of now, created empty on first use (losing the creation race is fine)."""
    if not lake.exists(name):
        try:
            DeltaTable.create(lake.write_uri(name), schema, mode="ignore", storage_options=dict(lake.storage_options))
        except DeltaError:
            pass  # another process created it at the same moment
    return lake.table(name)


def commit_claim(snapshot: DeltaTable, rows: pa.Table, *, app_id: str, claim: int) -> None:
    """Append ``rows`` as claim number ``claim`` on ``app_id``, on top of ``snapshot``.

    Raises ``ClaimLost`` when ``snapshot`` already holds that claim (or a later
    one) or another process committed one concurrently.
    """
    held = snapshot.transaction_version(app_id) or 0
    if held >= claim:
        raise ClaimLost(f"{app_id} already claimed (claim {held})")
    _write(snapshot, rows, app_id, claim)


def commit_fenced(lake: Lake, table: str, rows: pa.Table, *, app_id: str, claim: int) -> None:
    """Append a later row of a claim this process holds; ``ClaimLost`` once it was taken over."""
    snapshot = lake.table(table)
    held = snapshot.transaction_version(app_id)
    if held != claim:
        raise ClaimLost(f"{app_id} is now claim {held}, not ours ({claim})")
    _write(snapshot, rows, app_id, claim)


def _write(snapshot: DeltaTable, rows: pa.Table, app_id: str, claim: int) -> None:
    txn = Transaction(app_id=app_id, version=claim)
    try:
        write_deltalake(snapshot, rows, mode="append", commit_properties=CommitProperties(app_transactions=[txn]))
    except CommitFailedError as exc:
        raise ClaimLost(f"{app_id}: concurrent commit on the same key ({exc})") from exc


class Heartbeat:
    """Calls ``renew`` every ``every_s`` seconds in a thread while the owner works.

    The first ``ClaimLost`` stops it and is kept in ``lost``: the owner checks
    it before it writes anything that only the holder may write.

    >>> with Heartbeat(lambda: None, every_s=60, name="demo") as beat:  # doctest: +SKIP
    ...     work()
    """

    def __init__(self, renew: Callable[[], None], *, every_s: float, name: str) -> None:
        self.lost: ClaimLost | None = None
        self._renew = renew
        self._every_s = every_s
        self._name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{name}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._renew()
            except ClaimLost as exc:
                log.error("claim.lease_lost name=%s reason=%r", self._name, str(exc))
                self.lost = exc
                return
            except Exception as exc:  # the store is briefly unreachable: the lease may still hold, try again
                log.warning("claim.renew_failed name=%s error=%r", self._name, str(exc))
