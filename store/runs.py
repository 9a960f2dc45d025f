"""The ``runs`` table: the scheduler's history, one row per state change of a run.

A run is one job for one window (``job``, ``window_key``). Its rows are
append-only: ``running`` when an attempt starts (and again on each lease
renewal), ``failed`` when an attempt raised (with the error and, if attempts
remain, ``retry_at``), ``succeeded`` with the results (dataset version,
checkpoint, the rest as JSON), ``gave_up`` when the attempts ran out. The
current state of a run is its newest row (highest ``claim``, then
``recorded_at``).

Exactly once: a row that takes a run is a claim (``store.claims``) on the
app transaction ``run:<job>:<window_key>``: of two schedulers that race for a
window exactly one commits it. Every later row of the run is a fenced commit
under the same claim, so a scheduler whose lease was taken over cannot write
over the new owner.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from schemas.tables import RUNS, RUNS_TABLE
from store.claims import ClaimLost, claims_table, commit_claim, commit_fenced  # noqa: F401  (ClaimLost: re-exported)
from store.lake import Lake


class RunStatus(StrEnum):
    RUNNING = "running"
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    GAVE_UP = "gave_up"


FINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.GAVE_UP})


@dataclass(frozen=True)
class RunRecord:
    """One row of ``runs``."""

    job: str
    window_key: str
    window_start: datetime
    window_end: datetime
    trigger: str
    claim: int
    attempt: int
    status: RunStatus
    owner: str
    started_at: datetime
    recorded_at: datetime
    ended_at: datetime | None = None
    lease_until: datetime | None = None
    retry_at: datetime | None = None
    dataset_version: int | None = None
    checkpoint: str | None = None
    results: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def app_id(self) -> str:
        return claim_app_id(self.job, self.window_key)

    def evolve(self, **changes: Any) -> RunRecord:
        return replace(self, **changes)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["status"] = str(self.status)
        row["results"] = json.dumps(dict(self.results), default=str, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        values = dict(row)
        values["status"] = RunStatus(values["status"])
        values["results"] = json.loads(values["results"] or "{}")
        return cls(**values)


def claim_app_id(job: str, window_key: str) -> str:
    """The Delta app transaction id that owns one run."""
    return f"run:{job}:{window_key}"


class RunsTable:
    """Reads and writes the ``runs`` table of a lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake

    def snapshot(self) -> DeltaTable:
        """The table as of now, created empty on first use."""
        return claims_table(self.lake, RUNS_TABLE, RUNS)

    def history(self, snapshot: DeltaTable | None = None, *, job: str | None = None,
                window_key: str | None = None, window_keys: Collection[str] | None = None) -> list[RunRecord]:
        """Every row (of one job / one run / some of its runs), oldest first."""
        wanted = [pc.field(name) == value for name, value in (("job", job), ("window_key", window_key)) if value is not None]
        if window_keys is not None:
            wanted.append(pc.field("window_key").isin(sorted(window_keys)))
        table = self.lake.read(snapshot or self.snapshot(), filter=functools.reduce(operator.and_, wanted) if wanted else None)
        records = [RunRecord.from_row(row) for row in table.to_pylist()]
        return sorted(records, key=_order)

    def current(self, snapshot: DeltaTable | None = None, *, job: str | None = None,
                window_keys: Collection[str] | None = None) -> dict[tuple[str, str], RunRecord]:
        """The newest row of every run (of one job; of the windows ``window_keys``), by (job, window_key)."""
        latest: dict[tuple[str, str], RunRecord] = {}
        if window_keys is not None and not window_keys:  # e.g. a backfill range in which a job never fires
            return latest
        for record in self.history(snapshot, job=job, window_keys=window_keys):
            latest[(record.job, record.window_key)] = record
        return latest

    def latest(self, snapshot: DeltaTable, job: str, window_key: str) -> RunRecord | None:
        """The newest row of one run, None when it was never taken."""
        rows = self.history(snapshot, job=job, window_key=window_key)
        return rows[-1] if rows else None

    def claim(self, record: RunRecord, snapshot: DeltaTable) -> None:
        """Commit ``record`` as a new claim on its run, on top of ``snapshot``.

        Raises ``ClaimLost`` when a claim on the same run is already in
        ``snapshot`` or was committed concurrently.
        """
        commit_claim(snapshot, _rows(record), app_id=record.app_id, claim=record.claim)

    def record(self, record: RunRecord) -> None:
        """Append a later row of a run this process holds (fenced on the claim)."""
        self.snapshot()
        commit_fenced(self.lake, RUNS_TABLE, _rows(record), app_id=record.app_id, claim=record.claim)


def _rows(record: RunRecord) -> pa.Table:
    return pa.Table.from_pylist([record.to_row()], schema=RUNS)


_STATUS_RANK = {RunStatus.RUNNING: 0, RunStatus.FAILED: 1, RunStatus.SUCCEEDED: 2, RunStatus.GAVE_UP: 2}


def _order(record: RunRecord) -> tuple[Any, ...]:
    """Rows of one run in the order their owner wrote them (robust to equal timestamps)."""
    return (record.job, record.window_key, record.claim, record.attempt, record.recorded_at, _STATUS_RANK[record.status])
