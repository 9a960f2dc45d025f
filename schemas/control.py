"""Control events: what the pipelines and the trainer announce to each other.

They travel on their own topic (``trajlake.control`` by default), not on the
trajectory topic, because they belong to no rollout. Key = dataset name.
Several lakes may share one broker: ``lake_id`` says which lake an event is
about, and the lake's own tables stay the truth (an event is a hint).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

CONTROL_TOPIC = "trajlake.control"


class _Control(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str = Field(min_length=1)
    ts: datetime
    schema_version: int = 1
    lake_id: str | None = None
    """Identity of the lake the event is about (``store.identity``); None from producers that predate it."""


class DatasetVersionEvent(_Control):
    """A build committed a new version of ``datasets/<dataset>``."""

    type: Literal["dataset.version"] = "dataset.version"
    dataset: str
    version: int = Field(ge=0)
    """Delta version of the dataset table."""
    content_hash: str
    manifest: dict[str, Any] = Field(default_factory=dict)


class CheckpointReadyEvent(_Control):
    """The trainer wrote a checkpoint from a dataset version."""

    type: Literal["checkpoint.ready"] = "checkpoint.ready"
    checkpoint_id: str
    dataset: str
    dataset_version: int = Field(ge=0)
    path: str
    hf_path: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)


ControlEvent = Annotated[Union[DatasetVersionEvent, CheckpointReadyEvent], Field(discriminator="type")]
CONTROL_ADAPTER: TypeAdapter[ControlEvent] = TypeAdapter(ControlEvent)
