"""The content hash over record batches: the documented bytes, whatever the batch boundaries or slicing."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa

from pipelines.datasets.content_hash import ContentHash
from schemas.tables import SAMPLES

ROWS = [
    {"rollout_id": "r1", "sample_index": 0, "start_reason": "first", "call_ids": ["c1", "c2"], "policy_version": "p1",
     "tokenizer": "tok", "ids": [1, 2, 3, 4], "mask": [0, 0, 1, 1], "lps": [0.0, 0.0, -0.5, -0.25],
     "advantage": 0.1, "token_weight": 1 / 3, "reward": 1.0},
    {"rollout_id": "r1", "sample_index": 1, "start_reason": "truncation", "call_ids": ["c3"], "policy_version": None,
     "tokenizer": None, "ids": [7], "mask": [1], "lps": [-1.5], "advantage": 0.1, "token_weight": 1 / 3,
     "reward": 1.0},
    {"rollout_id": "r2", "sample_index": 0, "start_reason": "first", "call_ids": [], "policy_version": "p2",
     "tokenizer": "tok", "ids": [], "mask": [], "lps": [], "advantage": -0.7, "token_weight": 0.5, "reward": 0.0},
]
IDENTITY = {"advantage": "grpo", "mask": "trained"}


def samples_batch(rows: list[dict]) -> pa.RecordBatch:
    column = lambda key: [row[key] for row in rows]  # noqa: E731
    return pa.RecordBatch.from_pydict(
        {
            "sample_id": [f"{r['rollout_id']}/{r['sample_index']}" for r in rows],
            "tenant": ["t"] * len(rows), "task_id": ["task"] * len(rows), "rollout_id": column("rollout_id"),
            "group_id": ["g"] * len(rows), "sample_index": column("sample_index"),
            "start_reason": column("start_reason"), "call_ids": column("call_ids"),
            "policy_version": column("policy_version"), "tokenizer": column("tokenizer"),
            "input_ids": column("ids"), "loss_mask": column("mask"), "old_logprobs": column("lps"),
            "advantage": column("advantage"), "token_weight": column("token_weight"), "reward": column("reward"),
            "n_tokens": [len(r["ids"]) for r in rows], "n_trained_tokens": [sum(r["mask"]) for r in rows],
        },
        schema=SAMPLES,
    )


def expected_hash(rows: list[dict]) -> str:
    """The hash as documented, row by row (float32 columns as their float32 value)."""
    digest = hashlib.sha256(json.dumps(IDENTITY, sort_keys=True).encode())
    for r in rows:
        head = [r["rollout_id"], r["sample_index"], r["start_reason"], r["call_ids"], r["policy_version"],
                r["tokenizer"], float(np.float32(r["advantage"])), float(np.float32(r["token_weight"])),
                float(r["reward"])]
        digest.update(json.dumps(head).encode())
        for values, dtype in ((r["ids"], np.int32), (r["mask"], np.int8), (r["lps"], np.float32)):
            digest.update(len(values).to_bytes(8, "little"))
            digest.update(np.array(values, dtype).tobytes())
    return digest.hexdigest()


def test_hash_is_the_documented_bytes():
    content = ContentHash(IDENTITY)
    content.update(samples_batch(ROWS))
    assert content.hexdigest() == expected_hash(ROWS)


def test_batch_boundaries_and_sliced_batches_do_not_change_the_hash():
    whole = ContentHash(IDENTITY)
    whole.update(samples_batch(ROWS))
    split = ContentHash(IDENTITY)
    split.update(samples_batch(ROWS[:1]))
    split.update(samples_batch(ROWS[1:]))
    sliced = ContentHash(IDENTITY)
    batch = samples_batch(ROWS)
    sliced.update(batch.slice(0, 2))
    sliced.update(batch.slice(2))
    assert whole.hexdigest() == split.hexdigest() == sliced.hexdigest()


def test_any_token_changes_the_hash():
    changed = [dict(ROWS[0], lps=[0.0, 0.0, -0.5, -0.26]), *ROWS[1:]]
    first, second = ContentHash(IDENTITY), ContentHash(IDENTITY)
    first.update(samples_batch(ROWS))
    second.update(samples_batch(changed))
    assert first.hexdigest() != second.hexdigest()
