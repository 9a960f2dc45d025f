"""Advantage and weight arithmetic against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.datasets.advantages import group_advantages, token_weights

REWARDS = np.array([1.0, 0.0, 0.5, 2.0, 2.0, 7.0])
GROUPS = np.array(["a", "a", "a", "b", "b", "c"])


def test_grpo_normalises_by_group_mean_and_population_std():
    adv = group_advantages(REWARDS, GROUPS, mode="grpo")
    # group a: mean 0.5, std sqrt((0.25 + 0.25 + 0) / 3) = 0.408248...
    std = np.sqrt(0.5 / 3)
    assert adv.values[:3] == pytest.approx([0.5 / std, -0.5 / std, 0.0])
    # group b: zero std -> 0; group c: a single rollout -> 0
    assert adv.values[3:].tolist() == [0.0, 0.0, 0.0]
    assert adv.degenerate.tolist() == [False, False, False, True, True, True]
    assert (adv.n_groups, adv.n_singleton_groups, adv.n_zero_std_groups) == (3, 1, 1)


def test_mean_only_centres_without_scaling():
    adv = group_advantages(REWARDS, GROUPS, mode="mean")
    assert adv.values.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    # zero std is no problem without a division: only the singleton is degenerate
    assert adv.degenerate.tolist() == [False] * 5 + [True]
    assert adv.n_zero_std_groups == 0


def test_raw_passes_rewards_through():
    adv = group_advantages(REWARDS, GROUPS, mode="raw")
    assert adv.values.tolist() == REWARDS.tolist()
    assert not adv.degenerate.any()


def test_epsilon_decides_a_near_zero_std():
    rewards, groups = np.array([1.0, 1.0 + 1e-9]), np.array(["g", "g"])
    assert group_advantages(rewards, groups, mode="grpo").degenerate.all()
    assert not group_advantages(rewards, groups, mode="grpo", epsilon=0.0).degenerate.any()


def test_weights_make_each_rollout_count_once():
    # R = 3 rollouts with tokens; T = 2, 4, 10; one rollout without trained tokens
    weights = token_weights(np.array([2, 4, 0, 10]))
    assert weights.tolist() == pytest.approx([1 / 6, 1 / 12, 0.0, 1 / 30])
    per_rollout = weights * np.array([2, 4, 0, 10])
    assert per_rollout.tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])
    assert per_rollout.sum() == pytest.approx(1.0)


def test_weights_of_nothing_are_zero():
    assert token_weights(np.array([0, 0])).tolist() == [0.0, 0.0]
