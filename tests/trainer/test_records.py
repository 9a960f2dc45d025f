"""Run status transitions, checkpoint rows, version discovery and the DeepSpeed config merge."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from schemas.tables import SAMPLES
from trainer.config import TrainConfig, deepspeed_dict, load_deepspeed_json
from trainer.records import (
    CheckpointRecord, IllegalTransition, find_checkpoint, list_checkpoints, record_status, run_states,
    write_checkpoint,
)  # fmt: skip
from trainer.versions import registry_versions


def test_run_status_follows_the_transition_table(lake):
    record_status(lake, "r1", dataset="d", version=0, status="started", step=0)
    again = record_status(lake, "r1", dataset="d", version=0, status="started", step=4)
    assert again.attempt == 2
    record_status(lake, "r1", dataset="d", version=0, status="finished", step=9)
    assert run_states(lake)["r1"].status == "finished"
    with pytest.raises(IllegalTransition, match="from finished to started"):
        record_status(lake, "r1", dataset="d", version=0, status="started", step=0)
    with pytest.raises(IllegalTransition, match="from nothing to finished"):
        record_status(lake, "r2", dataset="d", version=0, status="finished", step=0)


def test_checkpoint_rows_are_idempotent_and_round_trip(lake):
    rec = CheckpointRecord(
        checkpoint_id="ckpt-d-v0-abc", dataset="d", dataset_version=0, base_model="m", parent_checkpoint_id=None,
        mode="pg", config={"train": {"lr": 0.1}}, code_version="x", metrics={"eval_loss": 1.5}, ds_path="p",
        hf_path="h", tokenizer="bpe", world_size=1, n_samples=2, n_tokens=10, steps=3,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    write_checkpoint(lake, rec)
    write_checkpoint(lake, rec)
    assert list_checkpoints(lake) == [rec] == list_checkpoints(lake, dataset="d")
    assert find_checkpoint(lake, "nope") is None and list_checkpoints(lake, dataset="other") == []


def test_versions_come_from_the_delta_log_without_a_registry(lake):
    empty = pa.Table.from_pylist([], schema=SAMPLES)
    for _ in range(3):
        lake.append("datasets/a", empty, schema=SAMPLES)
    lake.append("datasets/b", empty, schema=SAMPLES)
    assert registry_versions(lake) == {("a", 0), ("a", 1), ("a", 2), ("b", 0)}
    assert registry_versions(lake, ["b"]) == {("b", 0)}


def test_versions_come_from_the_registry_when_it_exists(lake):
    from schemas.tables import DATASET_VERSIONS, DATASET_VERSIONS_TABLE

    row = {"dataset": "a", "version": 7, "content_hash": "h", "created_at": datetime.now(UTC), "n_samples": 1,
           "n_rollouts": 1, "n_tokens": 1, "n_trained_tokens": 1, "code_version": None, "manifest": "{}"}  # fmt: skip
    lake.append(DATASET_VERSIONS_TABLE, pa.Table.from_pylist([row], schema=DATASET_VERSIONS))
    lake.append("datasets/a", pa.Table.from_pylist([], schema=SAMPLES))
    assert registry_versions(lake) == {("a", 7)}


def test_deepspeed_json_keeps_authority_unless_a_flag_overrides(tmp_path):
    user = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "gradient_accumulation_steps": 4,
            "train_batch_size": 64}  # fmt: skip
    ds = deepspeed_dict(TrainConfig(model="m", deepspeed_config=user))
    assert (ds["zero_optimization"]["stage"], ds["bf16"]["enabled"], ds["gradient_accumulation_steps"]) == (3, True, 4)
    assert "train_batch_size" not in ds and ds["train_micro_batch_size_per_gpu"] == 1
    ds = deepspeed_dict(TrainConfig(model="m", deepspeed_config=user, zero_stage=1, bf16=False, grad_accum=2))
    assert (ds["zero_optimization"]["stage"], ds["bf16"]["enabled"], ds["gradient_accumulation_steps"]) == (1, False, 2)
    plain = deepspeed_dict(TrainConfig(model="m"))
    assert (plain["zero_optimization"]["stage"], plain["gradient_accumulation_steps"]) == (0, 1)
    with pytest.raises(ValueError, match="fp16 is not supported"):
        deepspeed_dict(TrainConfig(model="m", deepspeed_config={"fp16": {"enabled": True}}))


def test_bad_deepspeed_json_and_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_deepspeed_json(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_deepspeed_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(ValueError, match="JSON object"):
        load_deepspeed_json(tmp_path / "list.json")
    for bad in ({"mode": "rl"}, {"zero_stage": 4}, {"lr": -1.0}, {"micro_batch_tokens": "many"},
                {"reference_model": "r"}, {"unknown": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            TrainConfig(model="m", **bad)


def test_fingerprint_changes_with_what_changes_the_result():
    a = TrainConfig(model="m")
    assert a.fingerprint(base_model="m") == TrainConfig(model="m", out="elsewhere").fingerprint(base_model="m")
    assert a.fingerprint(base_model="m") != TrainConfig(model="m", lr=1.0).fingerprint(base_model="m")
    assert a.fingerprint(base_model="m") != a.fingerprint(base_model="other")
