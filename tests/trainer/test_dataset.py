"""Dataset loading and batching: every malformed input is refused with the row named."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from schemas.tables import SAMPLES
from trainer.batching import collate, epoch_order, plan_batches, rank_share
from trainer.dataset import DatasetRef, load_samples
from trainer.errors import DatasetError


def row(i: int, n: int = 5, **over) -> dict:
    base = {
        "sample_id": f"s{i}", "tenant": "t", "task_id": "k", "rollout_id": f"r{i}", "group_id": "k",
        "sample_index": 0, "start_reason": "first", "call_ids": ["c"], "policy_version": None,
        "tokenizer": "bpe-64@abc", "input_ids": list(range(1, n + 1)), "loss_mask": [0] * (n - 2) + [1, 1],
        "old_logprobs": [0.0] * (n - 2) + [-0.5, -1.5], "advantage": 1.0, "token_weight": 0.1,
        "reward": 1.0, "n_tokens": n, "n_trained_tokens": 2,
    }  # fmt: skip
    return base | over


def write(lake, rows, schema=SAMPLES, name="d"):
    lake.append(f"datasets/{name}", pa.Table.from_pylist(rows, schema=schema))


def load(lake, name="d", version=None, vocab=64, max_len=32):
    return load_samples(lake, DatasetRef(name, version), vocab_size=vocab, max_len=max_len)


def test_loads_a_version_by_time_travel(lake):
    write(lake, [row(0), row(1, n=7)])
    write(lake, [row(2)])
    s0, s1 = load(lake, version=0), load(lake, version=1)
    assert (len(s0), len(s1)) == (2, 3) and s1.version == 1
    assert s0.input_ids[1].tolist() == list(range(1, 8)) and s0.tokenizers == ["bpe-64@abc"]
    assert load(lake).version == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"loss_mask": [1, 1]}, "loss_mask length"),
        ({"old_logprobs": [0.0]}, "old_logprobs length"),
        ({"input_ids": [1, 2, 3, 4, 99]}, "outside the vocabulary"),
        ({"input_ids": [1, 2, 3, 4, -1]}, "outside the vocabulary"),
        ({"loss_mask": [0, 0, 0, 2, 1]}, "0/1"),
        ({"old_logprobs": [0, 0, 0, float("nan"), -1]}, "finite log-probability"),
        ({"old_logprobs": [0, 0, 0, 0.5, -1]}, "finite log-probability"),
        ({"loss_mask": [0, 0, 0, 0, 0]}, "no token with loss_mask 1"),
        ({"advantage": float("inf")}, "advantage not finite"),
        ({"token_weight": -1.0}, "token_weight negative"),
        ({"input_ids": [1], "loss_mask": [1], "old_logprobs": [0.0]}, "fewer than 2 tokens"),
    ],
)
def test_malformed_rows_are_refused_naming_the_sample(lake, bad, message):
    write(lake, [row(0), row(1, **bad)])
    with pytest.raises(DatasetError, match=message) as info:
        load(lake)
    assert "s1" in str(info.value)


def test_oversized_sample_is_refused(lake):
    write(lake, [row(0, n=40)])
    with pytest.raises(DatasetError, match="longer than 32 tokens"):
        load(lake)


def test_missing_columns_and_wrong_types_are_refused(lake):
    lake.append("datasets/d", pa.table({"sample_id": ["a"], "input_ids": [[1, 2]]}))
    with pytest.raises(DatasetError, match="lacks columns"):
        load(lake)
    wrong = pa.table({**{k: [v] for k, v in row(0).items()}, "advantage": ["high"]})
    lake.append("datasets/w", wrong)
    with pytest.raises(DatasetError, match="column advantage has type string"):
        load(lake, name="w")


def test_nulls_in_required_columns_are_refused(lake):
    loose = pa.schema([f.with_nullable(True) for f in SAMPLES])
    write(lake, [row(0, advantage=None)], schema=loose)
    with pytest.raises(DatasetError, match="advantage has 1 null"):
        load(lake)


def test_missing_dataset_version_and_bad_names(lake):
    with pytest.raises(DatasetError, match="does not exist"):
        load(lake)
    write(lake, [row(0)])
    with pytest.raises(DatasetError, match="no version 5: the latest is 0"):
        load(lake, version=5)
    for spec in ("", "a/b", "x@-1", "x@v2", "../etc"):
        with pytest.raises(DatasetError):
            DatasetRef.parse(spec)
    assert DatasetRef.parse("math-1.v@12") == DatasetRef("math-1.v", 12)


def test_empty_version_is_refused(lake):
    write(lake, [])
    with pytest.raises(DatasetError, match="no rows"):
        load(lake)


def test_batches_respect_the_token_budget_and_cover_every_row():
    lengths = [3, 9, 4, 4, 8, 2, 7]
    batches = plan_batches(lengths, budget=12)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert all(len(b) * max(lengths[i] for i in b) <= 12 for b in batches)
    with pytest.raises(DatasetError, match="more than --micro-batch-tokens"):
        plan_batches([20], budget=12)


def test_rank_share_is_equal_and_disjoint():
    order = epoch_order(11, seed=1, epoch=0)
    assert order == epoch_order(11, seed=1, epoch=0) != epoch_order(11, seed=1, epoch=1)
    a, b = (rank_share(order, rank=r, world=2, grad_accum=2) for r in (0, 1))
    assert len(a) == len(b) == 4 and not set(a) & set(b)
    with pytest.raises(DatasetError, match="cannot feed"):
        rank_share([0, 1], rank=0, world=2, grad_accum=2)


def test_collate_pads_right_and_shifts_targets(lake):
    write(lake, [row(0, n=3), row(1, n=5, advantage=-1.0, token_weight=0.2)])
    s = load(lake)
    b = collate(s, [0, 1], pad_id=0)
    assert b.input_ids.shape == (2, 5) and b.attention_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert b.loss_mask.tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]
    assert b.old_logprobs[1].tolist() == [0.0, 0.0, -0.5, -1.5]
    assert torch.allclose(b.weight[1], torch.tensor([0, 0, 0.2, 0.2]))
    assert b.advantage[1].tolist() == [-1.0] * 4 and b.n_tokens == 8
