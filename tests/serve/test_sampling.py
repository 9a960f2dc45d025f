"""Sampling with a KV cache: logprobs are the raw model's, seeds reproduce, filters behave."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import AutoModelForCausalLM

from serve.sampling import SamplingParams, _nucleus, sample_tokens

PROMPT = [1, 85, 91, 1107, 79, 201, 2, 10]
NO_STOP: frozenset[int] = frozenset()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Decode on one thread, as the server does (much faster on a busy box); restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _run(model, **options) -> list:
    params = SamplingParams(**{"max_tokens": 12, "seed": 7, **options})
    return list(sample_tokens(model, PROMPT, params, stop_token_ids=NO_STOP))


def test_logprobs_are_the_raw_distribution_of_a_full_forward_pass(model):
    sampled = _run(model, temperature=1.5, top_k=50, top_logprobs=3)
    ids = PROMPT + [t.token_id for t in sampled]
    with torch.inference_mode():
        raw = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    for i, token in enumerate(sampled):
        position = raw[len(PROMPT) - 1 + i]
        assert token.logprob == pytest.approx(float(position[token.token_id]), abs=1e-4)
        best = torch.topk(position, 3)
        assert [t for t, _ in token.top] == best.indices.tolist()
        assert [lp for _, lp in token.top] == pytest.approx(best.values.tolist(), abs=1e-4)


def test_same_seed_same_tokens_other_seed_other_tokens(model):
    first = [t.token_id for t in _run(model)]
    assert [t.token_id for t in _run(model)] == first
    assert [t.token_id for t in _run(model, seed=8)] != first
    assert len(first) == 12


def test_temperature_zero_top_k_one_and_tiny_top_p_are_all_greedy(model):
    greedy = [t.token_id for t in _run(model, temperature=0)]
    assert [t.token_id for t in _run(model, top_k=1, seed=1)] == greedy
    assert [t.token_id for t in _run(model, top_p=1e-6, seed=2)] == greedy
    assert [t.token_id for t in _run(model, temperature=0, seed=3)] == greedy


def test_generation_ends_on_a_stop_token_which_is_yielded(model):
    greedy = [t.token_id for t in _run(model, temperature=0)]
    stop = greedy[3]
    tokens = list(sample_tokens(model, PROMPT, SamplingParams(max_tokens=12, temperature=0),
                                stop_token_ids=frozenset({stop})))
    assert [t.token_id for t in tokens] == greedy[: greedy.index(stop) + 1]


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    probs = torch.tensor([0.1, 0.5, 0.3, 0.1])
    assert _nucleus(probs, 0.5).tolist() == [0.0, 0.5, 0.0, 0.0]
    assert _nucleus(probs, 0.6).tolist() == pytest.approx([0.0, 0.5, 0.3, 0.0])
    assert _nucleus(probs, 1.0).tolist() == pytest.approx(probs.tolist())
