"""A synthetic, learnable dataset in the SAMPLES shape (tests, the benchmark, smoke runs).

Each group (task) has a random prompt and two rollouts: a "good" response
(reward 1, advantage +1) and a "bad" one (reward 0, advantage -1), both fixed
token sequences per group. ``old_logprobs`` are the model's own logprobs, so
the data is on-policy for that model and the importance ratio starts at 1.
Training should raise the likelihood of the good responses and lower the bad.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from schemas.tables import SAMPLES
from schemas.tokenizer_identity import tokenizer_identity
from trainer.objective import token_logprobs

FIRST_ORDINARY_ID = 8  # skip the special and tool-tag tokens at the low ids


def synthetic_samples(
    model_dir: str, *, groups: int = 8, prompt_len: int = 12, response_len: int = 6, seed: int = 0,
    tokenizer: str | None = None,
) -> pa.Table:  # fmt: skip
    """SAMPLES rows for ``groups`` x 2 rollouts; ``tokenizer`` overrides the recorded identity."""
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    rng = np.random.default_rng(seed)
    identity = tokenizer or tokenizer_identity(model_dir)
    n_rollouts = groups * 2
    rows = []
    for g in range(groups):
        prompt = rng.integers(FIRST_ORDINARY_ID, vocab, prompt_len)
        for kind, reward in (("good", 1.0), ("bad", 0.0)):
            response = rng.integers(FIRST_ORDINARY_ID, vocab, response_len)
            rows.append({
                "sample_id": f"s-{g}-{kind}", "tenant": "t", "task_id": f"task-{g}",
                "rollout_id": f"r-{g}-{kind}", "group_id": f"task-{g}", "sample_index": 0,
                "start_reason": "first", "call_ids": [f"c-{g}-{kind}"], "policy_version": "base",
                "tokenizer": identity, "input_ids": np.concatenate([prompt, response]).tolist(),
                "loss_mask": [0] * prompt_len + [1] * response_len,
                "advantage": 1.0 if reward else -1.0, "token_weight": 1.0 / (n_rollouts * response_len),
                "reward": reward, "n_tokens": prompt_len + response_len, "n_trained_tokens": response_len,
            })  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([r["input_ids"] for r in rows])
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits, ids)
    for r, row_lp in zip(rows, lp.tolist(), strict=True):
        r["old_logprobs"] = [0.0] + [v if m else 0.0 for v, m in zip(row_lp, r["loss_mask"][1:], strict=True)]
    return pa.Table.from_pylist(rows, schema=SAMPLES)


def response_logprob(model: torch.nn.Module, table: pa.Table, *, kind: str) -> float:
    """Mean logprob per response token of the ``good`` or ``bad`` rollouts under ``model``."""
    rows = [r for r in table.to_pylist() if r["rollout_id"].endswith(kind)]
    ids = torch.tensor([r["input_ids"] for r in rows])
    mask = torch.tensor([r["loss_mask"] for r in rows], dtype=torch.float32)[:, 1:]
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits, ids)
    return float((lp * mask).sum() / mask.sum())
