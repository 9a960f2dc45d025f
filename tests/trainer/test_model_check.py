"""The base model is inspected and the dataset's tokenizer checked before any training."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas.tables import SAMPLES
from trainer.config import TrainConfig
from trainer.dataset import DatasetRef
from trainer.distributed import Dist
from trainer.errors import ModelLoadError, TokenizerMismatch
from trainer.loop import prepare_run
from trainer.model import inspect_model
from devkit.synthetic import synthetic_samples

DIST = Dist(rank=0, world_size=1, local_rank=0, device="cpu")


def test_tokenizer_mismatch_is_refused_with_a_clear_message(lake, tiny_model_dir, tmp_path):
    table = synthetic_samples(str(tiny_model_dir), groups=2, tokenizer="bpe-151643@0123456789ab")
    lake.append("datasets/foreign", table, schema=SAMPLES)
    with pytest.raises(TokenizerMismatch) as info:
        prepare_run(lake, DatasetRef("foreign"), TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), DIST)
    message = str(info.value)
    assert "bpe-151643@0123456789ab" in message and inspect_model(str(tiny_model_dir)).tokenizer_identity in message
    assert "--model" in message


def test_matching_dataset_prepares_a_run_with_a_stable_id(lake, tiny_model_dir, tmp_path):
    lake.append("datasets/ok", synthetic_samples(str(tiny_model_dir), groups=2), schema=SAMPLES)
    config = TrainConfig(model=str(tiny_model_dir), out=str(tmp_path), micro_batch_tokens=40)
    run = prepare_run(lake, DatasetRef("ok"), config, DIST)
    assert run.checkpoint_id == prepare_run(lake, DatasetRef("ok", 0), config, DIST).checkpoint_id
    assert run.checkpoint_id.startswith("ckpt-ok-v0-") and len(run.samples) == 4
    assert sum(len(b) for b in run.batches) == 4


def test_sft_without_positive_rollouts_is_refused(lake, tiny_model_dir, tmp_path):
    table = synthetic_samples(str(tiny_model_dir), groups=2)
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array([0.0] * 4))
    lake.append("datasets/neg", table, schema=SAMPLES)
    with pytest.raises(Exception, match="no rollout with reward > 0"):
        prepare_run(lake, DatasetRef("neg"), TrainConfig(model=str(tiny_model_dir), mode="sft", out=str(tmp_path)), DIST)


def test_a_folder_that_is_no_model_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        inspect_model(str(tmp_path))


def _register(lake, name: str, manifest: dict) -> None:
    """A registry row as a build writes it (only the fields the trainer reads matter)."""
    import json
    from datetime import datetime, timezone

    from schemas.tables import DATASET_VERSIONS, DATASET_VERSIONS_TABLE

    row = {"dataset": name, "version": 0, "content_hash": "x", "created_at": datetime.now(timezone.utc),
           "n_samples": 4, "n_rollouts": 4, "n_tokens": 0, "n_trained_tokens": 0, "code_version": None,
           "manifest": json.dumps(manifest)}
    lake.append(DATASET_VERSIONS_TABLE, pa.Table.from_pylist([row], schema=DATASET_VERSIONS), schema=DATASET_VERSIONS)


def test_an_observation_dataset_is_refused_for_policy_gradient(lake, tiny_model_dir, tmp_path):
    lake.append("datasets/obs", synthetic_samples(str(tiny_model_dir), groups=2), schema=SAMPLES)
    _register(lake, "obs", {"mask": "observations"})
    with pytest.raises(Exception, match="--mode sft"):
        prepare_run(lake, DatasetRef("obs"), TrainConfig(model=str(tiny_model_dir), out=str(tmp_path)), DIST)


def test_sft_on_an_observation_dataset_keeps_rollouts_without_positive_reward(lake, tiny_model_dir, tmp_path):
    table = synthetic_samples(str(tiny_model_dir), groups=2)
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array([0.0] * 4))
    lake.append("datasets/obs", table, schema=SAMPLES)
    _register(lake, "obs", {"mask": "observations"})
    config = TrainConfig(model=str(tiny_model_dir), mode="sft", out=str(tmp_path))
    assert len(prepare_run(lake, DatasetRef("obs"), config, DIST).samples) == 4
