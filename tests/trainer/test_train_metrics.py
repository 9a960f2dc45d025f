"""Trainer metrics: steps, tokens, loss from the step callback; checkpoint age from the checkpoints table."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from store.lake import Lake
from trainer.loop import StepLog
from trainer.records import CheckpointRecord, write_checkpoint
from trainer.train_metrics import TrainMetrics

CREATED = datetime(2026, 11, 30, 3, 0, tzinfo=timezone.utc)


def samples(metrics: TrainMetrics) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
            for s in family.samples}


def checkpoint(n: int) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=f"ckpt-{n}", dataset="nightly", dataset_version=n, base_model="tiny", parent_checkpoint_id=None,
        mode="pg", config={}, code_version="test", metrics={}, ds_path="/ds", hf_path="/hf", tokenizer="tok",
        world_size=1, n_samples=4, n_tokens=100, steps=2, created_at=CREATED.replace(hour=3 + n),
    )


def test_steps_tokens_loss_and_checkpoint_age(lake: Lake):
    metrics = TrainMetrics(lake, clock=lambda: CREATED.timestamp() + 7200)
    seen = []
    on_step = metrics.feeding(seen.append)
    on_step(StepLog(step=1, total_steps=2, epoch=0, metrics={"loss": 2.5}, tokens=300, seconds=0.5))
    on_step(StepLog(step=2, total_steps=2, epoch=0, metrics={"loss": 2.0}, tokens=100, seconds=0.25))
    got = samples(metrics)
    assert len(seen) == 2
    assert got["trajlake_trainer_steps_total"] == 2 and got["trajlake_trainer_tokens_total"] == 400
    assert got["trajlake_trainer_loss"] == 2.0 and got["trajlake_trainer_tokens_per_second"] == 400
    assert got["trajlake_trainer_step_seconds_count"] == 2
    assert "trajlake_trainer_checkpoint_age_seconds" not in got  # no checkpoint yet

    write_checkpoint(lake, checkpoint(0))
    write_checkpoint(lake, checkpoint(1))
    got = samples(metrics)
    assert got["trajlake_trainer_last_checkpoint_timestamp_seconds"] == CREATED.timestamp() + 3600
    assert got["trajlake_trainer_checkpoint_age_seconds"] == 3600
