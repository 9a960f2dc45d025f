"""Real DeepSpeed on CPU, each run in its own process: learning, export, resume, follow, two ranks."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from devkit.ports import free_port
from ingest.topics import ensure_topic
from schemas.control import CONTROL_ADAPTER, CheckpointReadyEvent, DatasetVersionEvent
from schemas.tables import SAMPLES
from store.identity import lake_id
from store.lake import Lake
from trainer.config import TrainConfig
from trainer.dataset import DatasetRef, load_samples
from trainer.loop import evaluate
from tests.trainer.driver import Follower, config_for, drive, env, wait_for
from trainer.records import list_checkpoints, run_states
from devkit.synthetic import response_logprob, synthetic_samples

@pytest.fixture(scope="module")
def synthetic(tiny_model_dir):
    return synthetic_samples(str(tiny_model_dir), groups=8)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, synthetic, tmp_path_factory):
    """One uninterrupted run, shared by the tests that inspect its results."""
    root = tmp_path_factory.mktemp("trained")
    lake = Lake(str(root / "lake"))
    lake.append("datasets/syn", synthetic, schema=SAMPLES)
    result = drive({"lake": lake.root, "dataset": "syn", "config": config_for(tiny_model_dir, root / "ckpt")})
    return lake, result


def test_training_raises_the_likelihood_of_high_advantage_responses(trained, tiny_model_dir, synthetic):
    from transformers import AutoModelForCausalLM

    lake, result = trained
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(result["hf"]).eval()
    good = response_logprob(new, synthetic, kind="good") - response_logprob(base, synthetic, kind="good")
    bad = response_logprob(new, synthetic, kind="bad") - response_logprob(base, synthetic, kind="bad")
    assert good > 0.2 and bad < -0.2, (good, bad)
    assert result["metrics"]["eval_loss"] < result["metrics"]["first_loss"] - 0.05


def test_checkpoint_row_run_history_and_hf_reload_give_the_same_eval_loss(trained, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    lake, result = trained
    (record,) = list_checkpoints(lake)
    assert record.checkpoint_id == result["id"] and record.dataset == "syn" and record.dataset_version == 0
    assert record.base_model == str(tiny_model_dir) and record.config["deepspeed"]["zero_optimization"]["stage"] == 0
    assert record.code_version.startswith("trajlake") and record.steps == record.metrics["steps"] > 0
    assert (Path(record.ds_path) / "latest").is_file()
    assert run_states(lake)[record.checkpoint_id].status == "finished"
    config = TrainConfig(**config_for(tiny_model_dir, Path(record.ds_path)))
    samples = load_samples(lake, DatasetRef("syn", 0), vocab_size=2048, max_len=2048)
    reloaded = AutoModelForCausalLM.from_pretrained(record.hf_path, dtype=torch.float32).eval()
    assert evaluate(reloaded, samples, config) == pytest.approx(record.metrics["eval_loss"], abs=1e-5)


def test_a_crash_mid_run_resumes_from_the_last_checkpoint_and_matches(trained, tiny_model_dir, synthetic, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.append("datasets/syn", synthetic, schema=SAMPLES)
    args = {"lake": lake.root, "dataset": "syn", "config": config_for(tiny_model_dir, tmp_path / "ckpt")}
    drive(args | {"crash_after_step": 5}, expect_rc=3)
    (state,) = run_states(lake).values()
    assert state.status == "started" and list_checkpoints(lake) == []
    resumed = drive(args)
    assert resumed["metrics"]["resumed_from_step"] == 4  # the last restart point before the crash
    assert run_states(lake)[resumed["id"]].attempt == 2
    # same inputs, same id; the resumed run ends exactly where the uninterrupted one did
    assert resumed["id"] == trained[1]["id"]
    assert resumed["metrics"]["eval_loss"] == pytest.approx(trained[1]["metrics"]["eval_loss"], abs=1e-6)
    # and its summary covers the whole run, not the part after the resume
    whole, after = trained[1]["metrics"], resumed["metrics"]
    assert (after["tokens"], after["resumes"]) == (whole["tokens"], 1) and whole["resumes"] == 0
    assert after["first_loss"] == pytest.approx(whole["first_loss"], abs=1e-6)


def test_follow_trains_a_version_published_while_it_runs_and_skips_a_trained_one(
    broker, trained, tiny_model_dir, synthetic, tmp_path
):
    lake, first = trained  # syn@0 is trained already
    topic = f"control-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap_servers, topic, partitions=1)
    cfg = config_for(tiny_model_dir, Path(list_checkpoints(lake)[0].ds_path).parents[2], epochs=1, kl_coef=0.1)
    follower = Follower({"lake": lake.root, "config": cfg, "bootstrap": broker.bootstrap_servers, "topic": topic},
                        tmp_path / "follow.log")  # fmt: skip
    try:
        wait_for(lambda: "event=follow_started" in follower.output(), follower, what="the follower's start")
        version = lake.append("datasets/syn", synthetic_samples(str(tiny_model_dir), groups=4, seed=1), schema=SAMPLES)
        _announce(broker.bootstrap_servers, topic, version, lake_id(lake))  # the registry poll is an hour away
        ready = _next_checkpoint_ready(broker.bootstrap_servers, topic, follower)
    finally:
        follower.stop()
    assert ready.dataset_version == version == 1 and ready.lake_id == lake_id(lake)
    rows = list_checkpoints(lake)
    assert [(r.dataset_version, r.parent_checkpoint_id) for r in rows] == [(0, None), (1, first["id"])]
    assert Path(ready.hf_path).is_dir() and rows[1].base_model == first["hf"]
    assert rows[1].metrics["eval_loss"] == ready.metrics["eval_loss"] and rows[1].config["train"]["kl_coef"] == 0.1
    assert [s.attempt for s in run_states(lake).values()] == [1, 1]  # v0 was not trained again


def test_the_cli_under_torchrun_with_two_ranks_sft_bf16_zero2_accumulation(tiny_model_dir, synthetic, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.append("datasets/syn", synthetic, schema=SAMPLES)
    cli = Path(sys.executable).parent / "trajlake"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(cli), "train", "--dataset", "syn@0", "--model", str(tiny_model_dir), "--mode", "sft", "--bf16",
        "--zero-stage", "2", "--grad-accum", "2", "--lr", "1e-3", "--epochs", "3", "--micro-batch-tokens", "40",
        "--lake", lake.root, "--out", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = list_checkpoints(lake)
    assert proc.stdout.count(f"checkpoint {record.checkpoint_id}") == 1  # rank 0 alone prints the summary
    assert record.world_size == 2 and record.mode == "sft" and record.n_samples == 8  # the positive rollouts
    assert record.steps == 3  # 4 micro-batches per epoch / 2 ranks / 2 accumulated, 3 epochs
    assert record.config["deepspeed"]["bf16"]["enabled"] and record.metrics["eval_loss"] < record.metrics["first_loss"]
    assert len(list(Path(record.ds_path).glob("step*/*optim_states.pt"))) == 2  # one ZeRO shard per rank
    assert (Path(record.hf_path) / "model.safetensors").is_file()


def _announce(bootstrap: str, topic: str, version: int, lake: str) -> None:
    event = DatasetVersionEvent(event_id=str(uuid.uuid4()), ts=datetime.now(UTC), dataset="syn", version=version,
                                content_hash="h", lake_id=lake)  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, value=event.model_dump_json().encode(), key=b"syn").get(timeout=30)
    producer.close()


def _next_checkpoint_ready(bootstrap: str, topic: str, follower: Follower) -> CheckpointReadyEvent:
    found: list[CheckpointReadyEvent] = []
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, 0)])

    def ready() -> bool:
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                event = CONTROL_ADAPTER.validate_json(r.value)
                if isinstance(event, CheckpointReadyEvent):
                    found.append(event)
        return bool(found)

    try:
        wait_for(ready, follower, limit_s=180, what="checkpoint.ready")
    finally:
        consumer.close()
    return found[0]
