"""The objectives against hand-computed values (pure torch, no DeepSpeed)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.batching import Batch
from trainer.config import TrainConfig
from trainer.objective import policy_gradient_loss, sft_loss, token_logprobs

CFG = TrainConfig(model="m", clip_low=0.2, clip_high=0.2, is_cap=3.0)


def batch(old, mask, weight, adv) -> Batch:
    t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    mask_t = t(mask)
    return Batch(
        input_ids=torch.zeros((len(mask), len(mask[0]) + 1), dtype=torch.long),
        attention_mask=torch.ones((len(mask), len(mask[0]) + 1), dtype=torch.long),
        loss_mask=mask_t, old_logprobs=t(old), weight=t(weight) * mask_t, advantage=t(adv),
    )  # fmt: skip


def test_weighted_loss_equals_hand_computed_reference():
    # row 0: A=+1, ratios e^0.1 (unclipped), e^0.5 (clipped at 1.2); row 1: A=-1, ratio e^-0.5 (clipped at 0.8),
    # one unmasked position that must not count; row 1 weighs twice as much per token (shorter rollout)
    old = [[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]]
    new = torch.tensor([[-0.9, -0.5, -3.0], [-2.5, -7.0, -7.0]], requires_grad=True)
    b = batch(old, [[1, 1, 0], [1, 0, 0]], [[0.25, 0.25, 0.25], [0.5, 0.5, 0.5]], [[1, 1, 1], [-1, -1, -1]])
    out = policy_gradient_loss(new, b, CFG)
    terms = [(0.25, -math.exp(0.1)), (0.25, -1.2), (0.5, 0.8)]  # (w, -min(rA, clip(r)A))
    expected = sum(w * v for w, v in terms) / sum(w for w, _ in terms)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    out.loss.backward()
    # clipped tokens get no gradient; the unclipped one gets -w*A*r / sum(w)
    assert new.grad[0, 1].item() == 0.0 and new.grad[1, 0].item() == 0.0 and new.grad[0, 2].item() == 0.0
    assert new.grad[0, 0].item() == pytest.approx(-0.25 * math.exp(0.1) / 1.0, rel=1e-6)


def test_stale_negative_sample_is_truncated_at_is_cap():
    new = torch.tensor([[0.0]], requires_grad=True)
    b = batch([[-5.0]], [[1]], [[1.0]], [[-2.0]])  # ratio e^5 ~ 148 on a negative advantage
    out = policy_gradient_loss(new, b, CFG)
    assert out.loss.item() == pytest.approx(3.0 * 2.0)  # is_cap x |A|, not 148 x 2
    out.loss.backward()
    assert new.grad.item() == 0.0
    assert out.metrics["clip_frac"] == 1.0


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it():
    new = torch.tensor([[-1.0, -2.0]])
    b = batch([[-1.0, -2.0]], [[1, 1]], [[0.5, 0.5]], [[0.0, 0.0]])
    cfg = TrainConfig(model="m", kl_coef=0.5)
    assert policy_gradient_loss(new, b, cfg, ref_logp=new.clone()).loss.item() == pytest.approx(0.0)
    away = policy_gradient_loss(new, b, cfg, ref_logp=new - 1.0)
    k3 = math.exp(-1) + 1 - 1
    assert away.metrics["kl"] == pytest.approx(k3, rel=1e-6)
    assert away.loss.item() == pytest.approx(0.5 * k3, rel=1e-6)


def test_sft_is_weighted_masked_nll():
    new = torch.tensor([[-1.0, -3.0, -9.0]])
    b = batch([[0, 0, 0]], [[1, 1, 0]], [[0.1, 0.1, 0.1]], [[1, 1, 1]])
    assert sft_loss(new, b).loss.item() == pytest.approx(2.0)


def test_token_logprobs_score_the_next_token():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]))
    ids = torch.tensor([[0, 1, 2]])
    got = token_logprobs(logits, ids)
    assert got.shape == (1, 2)
    assert got[0].tolist() == pytest.approx([math.log(0.25), math.log(0.8)], rel=1e-6)


def test_empty_mask_gives_zero_loss_not_nan():
    new = torch.tensor([[-1.0]], requires_grad=True)
    out = policy_gradient_loss(new, batch([[-1.0]], [[0]], [[1.0]], [[1.0]]), CFG)
    assert out.loss.item() == 0.0 and out.metrics["clip_frac"] == 0.0
