"""The training objectives: token-level clipped policy gradient, and masked NLL.

Policy gradient, per target token t of a row with advantage A:

    r_t   = exp(logp_t - old_t)                      importance ratio vs the engine's logprob
    pg_t  = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A)      PPO clip
    pg_t  = min(pg_t, -is_cap A)        when A < 0: the ratio of a stale sample is truncated
                                        at is_cap (dual clip), so one old sample cannot blow up
    l_t   = pg_t + kl_coef * k3(ref_t, logp_t),   k3 = exp(ref - logp) - (ref - logp) - 1

The micro-batch loss is sum_t(w_t l_t) / sum_t(w_t), w_t = token_weight x loss_mask:
the rollout-level token mean (a rollout split into five samples weighs once),
normalised over the micro-batch. SFT uses l_t = -logp_t with the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batching import Batch
from trainer.config import TrainConfig

MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: enough to clip, never inf


@dataclass
class LossOutput:
    """The scalar to backpropagate plus detached statistics for the log."""

    loss: torch.Tensor
    metrics: dict[str, float]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every position: [rows, length - 1], fp32."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _weighted_mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (values * weight).sum() / weight.sum().clamp_min(1e-12)


def policy_gradient_loss(
    logp: torch.Tensor, batch: Batch, config: TrainConfig, *, ref_logp: torch.Tensor | None = None
) -> LossOutput:
    """Clipped, truncated, token-weighted policy-gradient loss (see module doc)."""
    mask, adv = batch.loss_mask, batch.advantage
    log_ratio = ((logp - batch.old_logprobs) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    pg = -torch.minimum(ratio * adv, clipped * adv)
    pg = torch.where(adv < 0, torch.minimum(pg, -config.is_cap * adv), pg)
    per_token = pg
    metrics: dict[str, float] = {}
    if ref_logp is not None and config.kl_coef > 0:
        d = (ref_logp - logp) * mask
        kl = torch.exp(d) - d - 1
        per_token = pg + config.kl_coef * kl
        metrics["kl"] = float(_weighted_mean(kl.detach(), batch.weight))
    loss = _weighted_mean(per_token, batch.weight)
    with torch.no_grad():
        on = mask > 0
        r = ratio[on]
        clip_hit = ((adv > 0) & (ratio > 1 + config.clip_high)) | (
            (adv < 0) & ((ratio < 1 - config.clip_low) | (ratio > config.is_cap))
        )
        metrics |= {
            "pg_loss": float(_weighted_mean(pg.detach(), batch.weight)),
            "clip_frac": float(clip_hit[on].float().mean()) if r.numel() else 0.0,
            "ratio_mean": float(r.mean()) if r.numel() else 1.0,
            "ratio_min": float(r.min()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
        }
    return LossOutput(loss, metrics)


def sft_loss(logp: torch.Tensor, batch: Batch) -> LossOutput:
    """Masked NLL, rollout-level token mean (rows are already the positive rollouts)."""
    loss = _weighted_mean(-logp, batch.weight)
    return LossOutput(loss, {"nll": float(loss.detach())})


def forward_loss(
    model: torch.nn.Module,
    batch: Batch,
    config: TrainConfig,
    *,
    ref_model: torch.nn.Module | None = None,
) -> LossOutput:
    """One forward pass of ``model`` (a plain module or a DeepSpeed engine) and the objective."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = token_logprobs(logits, batch.input_ids)
    if config.mode == "sft":
        out = sft_loss(logp, batch)
    else:
        ref_logp = None
        if ref_model is not None:
            with torch.no_grad():
                ref_logits = ref_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                ref_logp = token_logprobs(ref_logits, batch.input_ids)
        out = policy_gradient_loss(logp, batch, config, ref_logp=ref_logp)
    out.metrics["loss"] = float(out.loss.detach())
    return out
