"""Training runs as OpenLineage runs ``train.<dataset>``: input the dataset version, output the checkpoint."""

from __future__ import annotations

from typing import Any

from pipelines.lineage.openlineage import lake_dataset, traced_run, uri_dataset
from schemas.tables import dataset_table
from store.lake import Lake
from trainer.config import TrainConfig
from trainer.records import CheckpointRecord


def traced_train(lake: Lake, dataset: str, version: int | None, config: TrainConfig, **options: Any
                 ) -> CheckpointRecord:
    """``train_dataset`` as a run of the active lineage (``pipelines.lineage.openlineage``); plain training without one.
    The checkpoint is the exported folder, versioned by its checkpoint id."""
    from trainer.loop import train_dataset  # torch loads only when something trains

    with traced_run(f"train.{dataset}") as scope:
        record = train_dataset(lake, dataset, version, config, **options)
        if scope is not None:
            scope.inputs = [lake_dataset(lake.root, dataset_table(dataset), record.dataset_version)]
            scope.outputs = [uri_dataset(record.hf_path, record.checkpoint_id)]
    return record
