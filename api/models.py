"""Request and response bodies of the query API (one documented model each)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.events import RolloutStatus
from store.trajectory import RolloutSummary

Status = Literal["running", RolloutStatus]
"""A rollout's status as the rollout filters take it: ``running`` until its end event, then how it ended."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SqlRequest(_Body):
    """One SELECT over your views, and which page of its result to return."""

    sql: str = Field(min_length=1, description="One SELECT statement over the views of GET /v1/sql/views.")
    limit: int | None = Field(default=None, ge=0, description="Rows to return (default and cap: server settings).")
    offset: int = Field(default=0, ge=0, le=1_000_000_000, description="Rows to skip first.")


class Column(BaseModel):
    name: str
    type: str


class SqlResponse(BaseModel):
    """A page of a query result. Pages are stable only when the query has an ORDER BY."""

    columns: list[Column]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    """True when more rows follow: ask again with ``offset = next_offset``."""
    limit: int
    offset: int
    next_offset: int | None


class View(BaseModel):
    name: str
    columns: list[Column]


class ViewList(BaseModel):
    """The views your SQL can read: your rows of every table, the joined views, your datasets."""

    views: list[View]


class RolloutPage(BaseModel):
    """Your rollouts, newest first."""

    items: list[RolloutSummary]
    limit: int
    offset: int
    next_offset: int | None


class DatasetVersion(BaseModel):
    """One registered build of a dataset."""

    version: int
    created_at: datetime
    content_hash: str
    n_samples: int
    n_rollouts: int
    n_tokens: int
    n_trained_tokens: int
    code_version: str | None
    history: Literal["kept", "forgotten_rows_removed", "vacuumed"] = "kept"
    """``kept``: its rows as built; ``forgotten_rows_removed``: as built minus rows a forget deleted;
    ``vacuumed``: a forget vacuumed this version, its rows are gone (the manifest stays)."""


class Dataset(BaseModel):
    name: str
    versions: list[DatasetVersion]


class DatasetList(BaseModel):
    """Datasets with versions built from your rollouts only."""

    items: list[Dataset]


class DatasetDetail(BaseModel):
    """One dataset version's manifest (the newest unless ``version`` is given) and every version."""

    name: str
    version: int
    manifest: dict[str, Any]
    versions: list[DatasetVersion]


class DatasetUse(BaseModel):
    dataset: str
    version: int
    used_event: bool | None = None


class CheckpointUse(BaseModel):
    checkpoint_id: str
    dataset: str
    version: int


class EventRef(BaseModel):
    """Where one event came from: its rollout, order and Kafka coordinates."""

    event_id: str
    type: str
    rollout_id: str
    seq: int
    kafka_topic: str
    kafka_partition: int
    kafka_offset: int


class OffsetRange(BaseModel):
    topic: str
    partition: int
    first: int
    last: int
    events: int


class LineageOut(BaseModel):
    """What an id came from and what used it, limited to your rows and your datasets."""

    kind: str
    subject: str
    datasets: list[DatasetUse]
    checkpoints: list[CheckpointUse]
    rollouts: list[str]
    sources: dict[str, int]
    offset_ranges: list[OffsetRange]
    n_events: int
    events: list[EventRef]
    """One page of the events (``limit``/``offset``); ``offset_ranges`` covers them all."""
    limit: int
    offset: int
    next_offset: int | None
