"""``trajlake train`` / ``trajlake checkpoints``: arguments, refusals, listings (no training in this process)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from schemas.tables import SAMPLES
from trainer.model import inspect_model
from trainer.records import CheckpointRecord, write_checkpoint
from devkit.synthetic import synthetic_samples
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


def test_tokenizer_mismatch_is_refused_by_the_cli_with_both_identities(lake, tiny_model_dir, tmp_path):
    lake.append("datasets/foreign", synthetic_samples(str(tiny_model_dir), groups=2, tokenizer="bpe-9@feedbeef0000"),
                schema=SAMPLES)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    cli = Path(sys.executable).parent / "trajlake"
    proc = subprocess.run(
        [str(cli), "train", "--dataset", "foreign", "--model", str(tiny_model_dir), "--lake", lake.root,
         "--out", str(tmp_path / "ckpt")],
        env=env | {"COLUMNS": "400"}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tokenizer mismatch" in proc.stderr and "bpe-9@feedbeef0000" in proc.stderr
    assert inspect_model(str(tiny_model_dir)).tokenizer_identity in proc.stderr
    assert not (tmp_path / "ckpt").exists()  # refused before anything was written


def _follow_output(broker, lake, tiny_model_dir, *extra: str) -> str:
    """Start ``train --follow`` at TRAJLAKE_LOG_LEVEL=INFO, stop it once it follows; all it printed."""
    cli = Path(sys.executable).parent / "trajlake"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"TRAJLAKE_LOG_LEVEL": "INFO", "TRAJLAKE_CONTROL_TOPIC": f"control-{os.urandom(4).hex()}", "COLUMNS": "200"}
    cmd = [str(cli), *extra, "train", "--follow", "--lake", lake.root, "--bootstrap-servers", broker.bootstrap_servers,
           "--model", str(tiny_model_dir)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:  # the follower runs until stopped: read up to its start line
            lines.append(line)
            if "event=follow_started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        lines += proc.stdout.readlines()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    return "".join(lines)


def test_info_logs_show_the_follower_but_kafka_python_only_with_debug(broker, lake, tiny_model_dir):
    quiet = _follow_output(broker, lake, tiny_model_dir)
    assert "event=follow_started" in quiet and "follower stopped" in quiet
    assert not re.search(r" (DEBUG|INFO) kafka\.", quiet), quiet
    loud = _follow_output(broker, lake, tiny_model_dir, "--debug")
    assert re.search(r" INFO kafka\.", loud)  # the same run shows them when asked
