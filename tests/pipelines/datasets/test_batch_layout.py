"""The build's batch layout of samples (array operations) against a plain per-sample fill."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.datasets.merging import Call, Sample, merge_calls, sample_arrays


def reference_fill(sample: Sample, *, observations: bool) -> tuple[list[int], list[int], list[float]]:
    """One sample's columns span by span, the way the per-sample path wrote them."""
    ids = sample.tokens.astype(np.int32)
    mask, logprobs = np.zeros(len(ids), np.int8), np.zeros(len(ids), np.float32)
    if observations:
        for start, length in sample.observed:
            mask[start : start + length] = 1
    else:
        for start, values, length in sample.trained:
            mask[start : start + length] = 1
            if values is not None:
                logprobs[start : start + length] = values
    return ids.tolist(), mask.tolist(), logprobs.tolist()


def random_rollout(rng: np.random.Generator, n_calls: int) -> list[Call]:
    """Calls of up to three agent contexts: most extend their context exactly, some rewrite or cut it; int32
    and int64 ids, responses with and without logprobs (allow_non_engine), empty responses."""
    contexts: dict[str, np.ndarray] = {}
    calls = []
    for i in range(n_calls):
        span = f"s{rng.integers(3)}"
        held = contexts.get(span, rng.integers(0, 50, rng.integers(1, 6)))
        roll = rng.random()
        if roll < 0.15:
            held = held[: len(held) // 2]  # cut: no open sample is a prefix any more
        elif roll < 0.25:
            held = np.concatenate(([99], held[1:]))  # rewritten first token
        dtype = np.int64 if rng.random() < 0.3 else np.int32
        prompt = np.concatenate((held, rng.integers(0, 50, rng.integers(0, 4)))).astype(dtype)
        response = rng.integers(0, 50, rng.integers(0, 5)).astype(dtype)
        logprobs = None if rng.random() < 0.2 else -rng.random(len(response)).astype(np.float32)
        calls.append(Call(f"c{i}", span, "tok", "tpl", prompt, response, logprobs))
        contexts[span] = np.concatenate((prompt, response))
    return calls


@pytest.mark.parametrize("observations", [False, True])
def test_the_batch_layout_equals_a_per_sample_fill(observations):
    rng = np.random.default_rng(7)
    samples = [s for _ in range(60) for s in merge_calls(random_rollout(rng, int(rng.integers(1, 12))))]
    assert len(samples) > 100 and any(s.observed for s in samples) and any(len(s.call_ids) > 2 for s in samples)
    laid = sample_arrays(samples, observations=observations)
    assert (laid.ids.dtype, laid.mask.dtype, laid.logprobs.dtype) == (np.int32, np.int8, np.float32)
    for j, sample in enumerate(samples):
        row = slice(laid.offsets[j], laid.offsets[j + 1])
        assert (laid.ids[row].tolist(), laid.mask[row].tolist(), laid.logprobs[row].tolist()) == reference_fill(
            sample, observations=observations)
        assert laid.marked[j] == (sample.n_observed if observations else sample.n_trained)


def test_no_samples_lay_out_as_empty_columns():
    laid = sample_arrays([])
    assert laid.offsets.tolist() == [0] and len(laid.ids) == len(laid.mask) == len(laid.logprobs) == 0
