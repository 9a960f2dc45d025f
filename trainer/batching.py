"""Token-budget micro-batches: padded rows, no attention across samples.

Rows are sorted by length and cut greedily so that rows x padded length stays
within the budget (little padding, no sample ever sees another). The order of
the micro-batches is shuffled per epoch with the run's seed, so a restarted
run replays exactly the same sequence and can skip what it already did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainer.dataset import Samples
from trainer.errors import DatasetError


@dataclass(frozen=True)
class Batch:
    """One micro-batch; every tensor is [rows, length] except where noted.

    ``loss_mask``/``old_logprobs``/``weight``/``advantage`` are aligned with
    the *predicted* token, i.e. shifted: position t scores token t+1, so they
    have length - 1 columns.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    weight: torch.Tensor
    """token_weight of the row on each masked target (0 elsewhere)."""
    advantage: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """Real (unpadded) tokens."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (
            self.input_ids, self.attention_mask, self.loss_mask, self.old_logprobs, self.weight, self.advantage,
        )))  # fmt: skip


def plan_batches(lengths: list[int], *, budget: int) -> list[list[int]]:
    """Row indices per micro-batch, shortest rows first; each fits ``budget`` padded tokens.

    >>> plan_batches([3, 5, 2, 5], budget=10)
    [[2, 0], [1, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if lengths[i] > budget:
            raise DatasetError(f"a sample has {lengths[i]} tokens, more than --micro-batch-tokens {budget}: raise it")
        if current and (len(current) + 1) * lengths[i] > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def epoch_order(n_batches: int, *, seed: int, epoch: int) -> list[int]:
    """The shuffled micro-batch order of one epoch (same for every rank)."""
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(n_batches).tolist()


def rank_share(order: list[int], *, rank: int, world: int, grad_accum: int) -> list[int]:
    """This rank's micro-batches: every rank gets the same count, a multiple of ``grad_accum``.

    The few micro-batches that would leave ranks unequal are dropped (DeepSpeed
    steps all ranks together); the caller logs how many.
    """
    per_rank = len(order) // world // grad_accum * grad_accum
    if per_rank == 0:
        raise DatasetError(
            f"{len(order)} micro-batches cannot feed {world} rank(s) x {grad_accum} accumulation steps: "
            "lower --micro-batch-tokens, the accumulation or the rank count"
        )
    return order[rank::world][:per_rank]


def collate(samples: Samples, rows: list[int], *, pad_id: int = 0) -> Batch:
    """Right-padded tensors for ``rows`` of ``samples``."""
    length = max(len(samples.input_ids[i]) for i in rows)
    n = len(rows)
    ids = np.full((n, length), pad_id, dtype=np.int64)
    attn = np.zeros((n, length), dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.float32)
    old = np.zeros((n, length), dtype=np.float32)
    for j, i in enumerate(rows):
        k = len(samples.input_ids[i])
        ids[j, :k] = samples.input_ids[i]
        attn[j, :k] = 1
        mask[j, :k] = samples.loss_mask[i]
        old[j, :k] = samples.old_logprobs[i]
    target_mask = torch.from_numpy(mask[:, 1:].copy())
    weight = target_mask * torch.from_numpy(samples.token_weight[rows]).unsqueeze(1)
    advantage = torch.from_numpy(samples.advantage[rows]).unsqueeze(1).expand_as(target_mask).contiguous()
    return Batch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        loss_mask=target_mask,
        old_logprobs=torch.from_numpy(old[:, 1:].copy()),
        weight=weight,
        advantage=advantage,
    )
