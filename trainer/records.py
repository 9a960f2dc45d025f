"""The trainer's two tables: ``train_runs`` (status history) and ``checkpoints`` (lineage).

Both are append-only Delta tables. ``train_runs`` holds one row per status
change of a run; the latest row of a ``run_id`` is its state. Legal changes
are ``RUN_TRANSITIONS``: a run starts (or is refused at validation: failed
at once), may start again (a takeover or restart resumes it from its last
restart point), and ends finished or failed. A follower does not train a
version whose latest row is ``failed`` until ``request_retry`` marks it
``retry``; a failed run may also be started again by hand. ``checkpoints`` holds one row per finished run,
written before the run's ``finished`` row, so a run that is finished always
has its checkpoint. ``run_id`` equals the ``checkpoint_id`` it produces:
``ckpt-<dataset>-v<version>-<hash of config and base model>``.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from schemas.tables import CHECKPOINTS, CHECKPOINTS_TABLE, TRAIN_RUNS, TRAIN_RUNS_TABLE
from store.lake import Lake
from trainer.errors import TrainerError
from schemas.errors import Conflict

RUN_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"started", "failed"}),
    "started": frozenset({"started", "finished", "failed"}),
    "failed": frozenset({"started", "failed", "retry"}),
    "retry": frozenset({"started", "failed"}),
    "finished": frozenset(),
}
"""Status -> statuses it may change to (None: the run has no row yet)."""


@dataclass(frozen=True)
class CheckpointRecord:
    """One ``checkpoints`` row, as Python values (``config``/``metrics`` parsed)."""

    checkpoint_id: str
    dataset: str
    dataset_version: int
    base_model: str
    parent_checkpoint_id: str | None
    mode: str
    config: dict[str, Any]
    code_version: str
    metrics: dict[str, Any]
    ds_path: str
    hf_path: str
    tokenizer: str
    world_size: int
    n_samples: int
    n_tokens: int
    steps: int
    created_at: datetime

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["config"] = json.dumps(self.config, sort_keys=True, default=str)
        row["metrics"] = json.dumps(self.metrics, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> CheckpointRecord:
        return cls(**{**row, "config": json.loads(row["config"]), "metrics": json.loads(row["metrics"])})


@dataclass(frozen=True)
class RunState:
    """The latest ``train_runs`` row of a run."""

    run_id: str
    dataset: str
    dataset_version: int
    status: str
    attempt: int
    step: int
    error: str | None


class IllegalTransition(Conflict):
    """A run status change that ``RUN_TRANSITIONS`` forbids (e.g. starting a finished run)."""


def run_states(lake: Lake) -> dict[str, RunState]:
    """The latest state of every run (rows are append-only; the last one wins)."""
    return {s.run_id: s for s in _latest_rows(lake)}


def _latest_rows(lake: Lake) -> list[RunState]:
    """Every row as a ``RunState``, oldest first (so the last of each key is its state)."""
    if not lake.exists(TRAIN_RUNS_TABLE):
        return []
    rows = lake.read(TRAIN_RUNS_TABLE).sort_by([("ts", "ascending")]).to_pylist()
    return [
        RunState(r["run_id"], r["dataset"], r["dataset_version"], r["status"], r["attempt"], r["step"], r["error"])
        for r in rows
    ]


def version_states(lake: Lake) -> dict[tuple[str, int], RunState]:
    """The latest state of each dataset version: its newest ``train_runs`` row over all its runs."""
    return {(s.dataset, s.dataset_version): s for s in _latest_rows(lake)}


def request_retry(lake: Lake, dataset: str, version: int) -> list[str]:
    """Mark the failed runs of a version ``retry`` so followers train it again; the run ids marked."""
    failed = [s for s in run_states(lake).values()
              if (s.dataset, s.dataset_version) == (dataset, version) and s.status == "failed"]  # fmt: skip
    if version_states(lake).get((dataset, version)) is None or not failed:
        raise TrainerError(
            f"{dataset}@{version} has no failed run: nothing to retry "
            "(trajlake checkpoints lists what was trained; train --dataset NAME@VERSION trains a version by hand)"
        )
    for s in failed:
        record_status(lake, s.run_id, dataset=dataset, version=version, status="retry", step=s.step)
    return [s.run_id for s in failed]


def record_status(lake: Lake, run_id: str, *, dataset: str, version: int, status: str, step: int,
                  error: str | None = None) -> RunState:  # fmt: skip
    """Append a status change after checking it against ``RUN_TRANSITIONS``."""
    current = run_states(lake).get(run_id)
    if status not in RUN_TRANSITIONS[current.status if current else None]:
        raise IllegalTransition(f"run {run_id} cannot go from {current.status if current else 'nothing'} to {status}")
    attempt = (current.attempt if current else 0) + (status == "started")
    row = {
        "run_id": run_id, "dataset": dataset, "dataset_version": version, "status": status,
        "attempt": attempt, "step": step, "error": error, "host": socket.gethostname(),
        "pid": os.getpid(), "ts": datetime.now(UTC),
    }  # fmt: skip
    lake.append(TRAIN_RUNS_TABLE, pa.Table.from_pylist([row], schema=TRAIN_RUNS), schema=TRAIN_RUNS)
    return RunState(run_id, dataset, version, status, attempt, step, error)


def write_checkpoint(lake: Lake, record: CheckpointRecord) -> None:
    """Append the checkpoint row unless that ``checkpoint_id`` is already there (idempotent)."""
    if find_checkpoint(lake, record.checkpoint_id) is not None:
        return
    table = pa.Table.from_pylist([record.to_row()], schema=CHECKPOINTS)
    lake.append(CHECKPOINTS_TABLE, table, schema=CHECKPOINTS)


def list_checkpoints(lake: Lake, *, dataset: str | None = None) -> list[CheckpointRecord]:
    """Every checkpoint (of one dataset), oldest first."""
    if not lake.exists(CHECKPOINTS_TABLE):
        return []
    rows = lake.read(CHECKPOINTS_TABLE).sort_by([("created_at", "ascending")]).to_pylist()
    return [CheckpointRecord.from_row(r) for r in rows if dataset is None or r["dataset"] == dataset]


def checkpoints_trained_on(lake: Lake, dataset: str, versions: Iterable[int]) -> list[str]:
    """Ids of the checkpoints trained on any of ``versions`` of ``dataset``, sorted."""
    wanted = set(versions)
    return sorted(c.checkpoint_id for c in list_checkpoints(lake, dataset=dataset) if c.dataset_version in wanted)


def find_checkpoint(lake: Lake, checkpoint_id: str) -> CheckpointRecord | None:
    return next((c for c in list_checkpoints(lake) if c.checkpoint_id == checkpoint_id), None)
