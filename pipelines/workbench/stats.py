"""Paired statistics over per-task differences (numpy only, seeded, reproducible).

Every function takes ``diffs``: one number per task, arm B's value minus arm
A's. Tasks are the unit of resampling: rollouts of one task are correlated,
tasks are (assumed) independent draws from the task distribution.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

BOOTSTRAP_CHUNK = 2_000_000
"""Resampled indices drawn per chunk (bounds memory to ~16 MB for any task count)."""
EXACT_FLIP_LIMIT = 16
"""Up to this many non-zero differences the sign-flip test enumerates all 2^n flips exactly."""


def bootstrap_ci(diffs: np.ndarray, *, confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean difference over ``resamples`` task resamples (with replacement).

    >>> bootstrap_ci(np.array([1.0, 1.0, 1.0]), confidence=0.95, resamples=100, seed=0)
    (1.0, 1.0)
    """
    n = len(diffs)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, BOOTSTRAP_CHUNK // n)
    means = np.empty(resamples)
    for start in range(0, resamples, per_chunk):
        count = min(per_chunk, resamples - start)
        means[start:start + count] = diffs[rng.integers(0, n, size=(count, n))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def normal_ci(diffs: np.ndarray, *, confidence: float) -> tuple[float, float]:
    """Mean difference +- z * standard error (sample sd, n - 1): the analytic cross-check."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    mean, se = float(diffs.mean()), _sd(diffs) / math.sqrt(len(diffs))
    return mean - z * se, mean + z * se


def sign_flip_p_value(diffs: np.ndarray, *, permutations: int, seed: int) -> float:
    """Two-sided p-value of "mean difference = 0" by a paired sign-flip permutation test.

    Under the null each task's difference is as likely to be negative, so
    its sign is flipped at random. Exact (all 2^n flips) when at most
    ``EXACT_FLIP_LIMIT`` differences are non-zero, otherwise ``permutations``
    seeded draws with the (1 + hits) / (1 + draws) correction, which never
    returns 0. Zero differences do not move the mean and are left out.
    """
    nonzero = diffs[diffs != 0]
    if len(nonzero) == 0:
        return 1.0
    observed = abs(nonzero.sum()) * (1 - 1e-12)  # float slack: a flip equal to the observed sum counts
    if len(nonzero) <= EXACT_FLIP_LIMIT:
        signs = ((np.arange(2 ** len(nonzero))[:, None] >> np.arange(len(nonzero))) & 1) * 2 - 1
        return float(np.mean(np.abs(signs @ nonzero) >= observed))
    rng = np.random.default_rng(seed)
    hits = 0
    per_chunk = max(1, BOOTSTRAP_CHUNK // len(nonzero))
    for start in range(0, permutations, per_chunk):
        count = min(per_chunk, permutations - start)
        signs = rng.integers(0, 2, size=(count, len(nonzero))) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ nonzero) >= observed))
    return (1 + hits) / (1 + permutations)


def tasks_for_power(diffs: np.ndarray, *, alpha: float, power: float) -> int | None:
    """Tasks a paired test needs to detect the observed mean difference (normal approximation).

    n = ((z_{1-alpha/2} + z_{power}) * sd / mean)^2, rounded up, with the
    observed mean and sd of the per-task differences as the effect. None
    when there is no effect to detect (mean 0) or one task cannot give an sd;
    1 when every task moved the same way by the same amount (sd 0).
    """
    mean = float(diffs.mean())
    if mean == 0 or len(diffs) < 2:
        return None
    unit = NormalDist()
    z = unit.inv_cdf(1 - alpha / 2) + unit.inv_cdf(power)
    return max(1, math.ceil((z * _sd(diffs) / abs(mean)) ** 2))


def _sd(diffs: np.ndarray) -> float:
    return float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0
