"""The README's main job: ``trajlake demo`` runs every real component end to end."""

from __future__ import annotations

import os
import subprocess
import sys

from pipelines import read_dataset
from store.lake import Lake
from store.sql import run_query


def test_demo_runs_end_to_end_and_leaves_a_traceable_checkpoint(tmp_path):
    workdir = tmp_path / "demo"
    env = {**os.environ, "COLUMNS": "120", "TRAJLAKE_LOG_LEVEL": "WARNING"}
    proc = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "demo", "--workdir", str(workdir),
         "--agent-tasks", "2", "--rollouts-per-task", "2", "--workload-tasks", "2"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in ("embedded broker", "ingested into Delta", "SQL answers", "dataset version",
                  "trained checkpoint", "checkpoint lineage", "harness A/B", "scheduled run", "demo finished",
                  "token sessions: demo-agent@1.0 before/after"):
        assert stage in proc.stdout, stage

    lake = Lake(str(workdir / "lake"))
    calls = run_query(lake, "SELECT count(*) AS n, count(response_token_ids) AS with_ids FROM llm_calls "
                            "WHERE harness_name = 'demo-agent'").to_pylist()[0]
    assert calls["n"] == 2 * 2 * 3 and calls["with_ids"] == calls["n"]  # 3 turns per rollout, all token-exact
    samples = read_dataset(lake, "demo", columns=["rollout_id", "start_reason"]).to_pylist()
    tokens_in = [s for s in samples if s["rollout_id"].endswith("-1")]  # rollout k=1: harness 1.1, tokens in/out
    assert sorted(s["rollout_id"] for s in tokens_in) == ["demo-0-1", "demo-1-1"]  # one merged sample each
    chat = [s for s in samples if s["rollout_id"].endswith("-0")]  # harness 1.0, chat messages: token sessions
    assert sorted(s["rollout_id"] for s in chat) == ["demo-0-0", "demo-1-0"]  # one merged sample each too
    checkpoints = lake.read("checkpoints", columns=["checkpoint_id", "dataset"]).to_pylist()
    assert {c["dataset"] for c in checkpoints} == {"demo", "nightly"}
    assert (workdir / "checkpoints").is_dir()
