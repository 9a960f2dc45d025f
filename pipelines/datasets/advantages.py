"""Group-relative advantages and rollout-level loss weights.

Advantages belong to the rollout: every trained token of a rollout gets its
rollout's advantage, whatever number of samples the rollout split into.

Degenerate groups, the stated rule: a group of one rollout has no baseline,
and under ``grpo`` a group whose rewards all agree (std <= epsilon) has no
scale; both give advantage 0 to their rollouts (no policy gradient, but the
rollouts stay in the dataset and in R) unless the build drops them. ``raw``
has no degenerate groups. The std is the population std (ddof=0), as in GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.datasets.config import AdvantageMode


@dataclass(frozen=True)
class Advantages:
    values: np.ndarray
    """float64, one per rollout, in input order."""
    degenerate: np.ndarray
    """bool, one per rollout: its group is degenerate under the mode."""
    n_groups: int
    n_singleton_groups: int
    n_zero_std_groups: int


def group_advantages(
    rewards: np.ndarray, groups: np.ndarray, *, mode: AdvantageMode, epsilon: float = 1e-6
) -> Advantages:
    """Advantage of each rollout relative to its group.

    >>> a = group_advantages(np.array([1.0, 0.0, 5.0]), np.array(["t", "t", "u"]), mode="grpo")
    >>> a.values.tolist(), a.degenerate.tolist()
    ([1.0, -1.0, 0.0], [False, False, True])
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    keys, inverse, sizes = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=rewards, minlength=len(keys))
    means = sums / sizes
    centered = rewards - means[inverse]
    stds = np.sqrt(np.bincount(inverse, weights=centered**2, minlength=len(keys)) / sizes)
    singleton = sizes == 1
    zero_std = ~singleton & (stds <= epsilon) if mode == "grpo" else np.zeros(len(keys), dtype=bool)
    if mode == "raw":
        return Advantages(rewards.copy(), np.zeros(len(rewards), dtype=bool), len(keys), 0, 0)
    degenerate_group = singleton | zero_std
    if mode == "grpo":
        scale = np.where(degenerate_group, 1.0, stds)
        values = centered / scale[inverse]
    else:
        values = centered
    degenerate = degenerate_group[inverse]
    values = np.where(degenerate, 0.0, values)
    return Advantages(values, degenerate, len(keys), int(singleton.sum()), int(zero_std.sum()))


def token_weights(trained_tokens: np.ndarray) -> np.ndarray:
    """Per-token weight of each rollout: 1 / (R x T_r), R = rollouts with T_r > 0.

    Each rollout's trained tokens then sum to 1/R, and the whole dataset to 1.

    >>> token_weights(np.array([2, 4])).tolist()
    [0.25, 0.125]
    """
    trained_tokens = np.asarray(trained_tokens, dtype=np.float64)
    n_rollouts = int((trained_tokens > 0).sum())
    if n_rollouts == 0:
        return np.zeros_like(trained_tokens)
    with np.errstate(divide="ignore"):
        return np.where(trained_tokens > 0, 1.0 / (n_rollouts * trained_tokens), 0.0)
