"""The nightly job: build a dataset version for a scheduler window, then train it.

``store.scheduler`` runs it once per cron window. The build takes the rollouts
that started in the window shifted back by ``lag`` (so rollouts still running
at the fire time finish first); a retry of the window reuses the version
already built for exactly that range. Training starts from the dataset's
latest checkpoint when there is one, else from ``base_model``. A window
without trainable rollouts succeeds with ``skipped``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pipelines import BuildConfig, EmptyDataset, Selection, SourceMissing, get_manifest
from pipelines.lineage.openlineage import traced_build
from pipelines.datasets.registry import DatasetNotFound, check_name
from store.lake import Lake
from store.scheduler import Window
from trainer.config import TrainConfig
from trainer.records import list_checkpoints
from trainer.train_lineage import traced_train


@dataclass(frozen=True)
class NightlyConfig:
    dataset: str
    lag: timedelta
    train: bool
    train_out: str
    base_model: Callable[[], str]
    """The first checkpoint's base model folder; called only when one is needed."""


def nightly_job(lake: Lake, config: NightlyConfig) -> Callable[[Window], dict[str, Any]]:
    """The job's ``run(window) -> results`` (dataset version, checkpoint) for ``store.scheduler.Job``."""
    name = check_name(config.dataset)

    def run(window: Window) -> dict[str, Any]:
        since, until = window.start - config.lag, window.end - config.lag
        version = version_built_for(lake, name, since, until)
        if version is None:
            try:
                version = traced_build(lake, name, BuildConfig(selection=Selection(since=since, until=until))).version
            except (EmptyDataset, SourceMissing) as exc:
                return {"dataset": name, "skipped": str(exc)}
        results: dict[str, Any] = {"dataset": name, "dataset_version": version}
        if config.train:
            parents = list_checkpoints(lake, dataset=name)
            base = parents[-1].hf_path if parents else config.base_model()
            record = traced_train(lake, name, version, TrainConfig(model=base, out=config.train_out),
                                  parent_checkpoint_id=parents[-1].checkpoint_id if parents else None)
            results |= {"checkpoint": record.checkpoint_id, "steps": record.steps, "hf_path": record.hf_path}
        return results

    return run


def version_built_for(lake: Lake, name: str, since: datetime, until: datetime) -> int | None:
    """The latest version of ``name`` when it was built for exactly this range (a retry)."""
    try:
        manifest = get_manifest(lake, name)
    except DatasetNotFound:
        return None
    filters = manifest.get("filters", {})
    built = [filters.get("since"), filters.get("until")]
    wanted = [since, until]
    same = all(b is not None and datetime.fromisoformat(b.replace("Z", "+00:00")) == w for b, w in zip(built, wanted))
    return int(manifest["version"]) if same else None
