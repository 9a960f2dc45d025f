"""``trajlake train`` / ``trajlake checkpoints`` argument handling (no training in this process)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from typer.testing import CliRunner

from trainer.records import CheckpointRecord, write_checkpoint
from trajlake.cli import build_app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(build_app(), list(args), env={"COLUMNS": "250"})


def test_train_needs_a_dataset_or_follow():
    result = invoke("train")
    assert result.exit_code == 2 and "--dataset" in result.output


def test_bad_options_are_refused_before_training(tmp_path, tiny_model_dir):
    (tmp_path / "ds.json").write_text("{not json")
    result = invoke("train", "--dataset", "d", "--model", str(tiny_model_dir), "--deepspeed-config", str(tmp_path / "ds.json"))
    assert result.exit_code == 2 and "not valid JSON" in result.output
    result = invoke("train", "--dataset", "d", "--model", str(tiny_model_dir), "--mode", "rl")
    assert result.exit_code == 2 and "mode" in result.output
    result = invoke("train", "--dataset", "bad/name", "--model", str(tiny_model_dir))
    assert result.exit_code == 2 and "bad dataset name" in result.output
    result = invoke("train", "--dataset", "d@x", "--model", str(tiny_model_dir))
    assert result.exit_code == 2 and "NAME@VERSION" in result.output


def test_checkpoints_lists_rows_as_a_table_and_as_json(lake):
    assert "no checkpoints yet" in invoke("checkpoints", "--lake", lake.root).output
    write_checkpoint(lake, CheckpointRecord(
        checkpoint_id="ckpt-d-v3-abcd1234", dataset="d", dataset_version=3, base_model="m", parent_checkpoint_id=None,
        mode="pg", config={}, code_version="x", metrics={"final_loss": 0.5, "eval_loss": 0.25, "tokens_per_s": 1000.0},
        ds_path="/p/ds", hf_path="/p/hf", tokenizer="bpe", world_size=1, n_samples=2, n_tokens=10, steps=3,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    ))  # fmt: skip
    table = invoke("checkpoints", "--lake", lake.root)
    assert table.exit_code == 0 and "ckpt-d-v3-abcd1234" in table.output and "d@3" in table.output
    rows = [json.loads(line) for line in invoke("checkpoints", "--lake", lake.root, "--json").output.splitlines()]
    assert rows[0]["checkpoint_id"] == "ckpt-d-v3-abcd1234" and json.loads(rows[0]["metrics"])["eval_loss"] == 0.25
