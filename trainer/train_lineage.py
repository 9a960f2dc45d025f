"""Training runs as OpenLineage runs ``train.<dataset>``: input the dataset version, output the checkpoint."""

from __future__ import annotations

from typing import Any

from openlineage.client.event_v2 import OutputDataset
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet

from pipelines.openlineage import dataset_id, table_dataset, traced_run
from store.lake import Lake
from trainer.config import TrainConfig
from trainer.records import CheckpointRecord


def checkpoint_dataset(record: CheckpointRecord) -> OutputDataset:
    """The exported checkpoint folder, versioned by its checkpoint id."""
    namespace, name = dataset_id(record.hf_path)
    return OutputDataset(namespace=namespace, name=name,
                         facets={"version": DatasetVersionDatasetFacet(datasetVersion=record.checkpoint_id)})


def traced_train(lake: Lake, dataset: str, version: int | None, config: TrainConfig, **options: Any
                 ) -> CheckpointRecord:
    """``train_dataset`` as a run of the active lineage (``pipelines.openlineage``); plain training without one."""
    from trainer.loop import train_dataset  # torch loads only when something trains

    with traced_run(f"train.{dataset}") as scope:
        record = train_dataset(lake, dataset, version, config, **options)
        if scope is not None:
            scope.inputs = [table_dataset(lake.root, f"datasets/{dataset}", record.dataset_version)]
            scope.outputs = [checkpoint_dataset(record)]
    return record
