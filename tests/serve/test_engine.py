"""The engine's generation steps: why a generation ended, and what the last step carries."""

from __future__ import annotations

import pytest
import torch

from serve.engine import ServeEngine
from serve.protocol import ServeError
from serve.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0)


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> ServeEngine:
    return ServeEngine(tiny_model_dir, max_new_tokens_cap=10)


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    return engine.chat_prompt([{"role": "user", "content": "hi"}], None)


def test_end_tokens_come_from_the_generation_config(engine):
    ids = {engine.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert engine.eos_token_ids == ids


def test_running_out_of_tokens_ends_with_length(engine, prompt):
    steps = list(engine.generate(prompt, GREEDY))
    assert len(steps) == 10 and [s.finish_reason for s in steps] == [None] * 9 + ["length"]
    assert steps[-1].stop_reason is None
    assert "".join(s.text for s in steps) == engine.tokenizer.decode([s.token.token_id for s in steps])


def test_a_requested_stop_token_is_kept_in_the_ids_and_named(engine, prompt):
    greedy = [s.token.token_id for s in engine.generate(prompt, GREEDY)]
    chosen = greedy[4]
    steps = list(engine.generate(prompt, GREEDY, stop_token_ids=frozenset({chosen})))
    assert [s.token.token_id for s in steps] == greedy[: greedy.index(chosen) + 1]
    assert (steps[-1].finish_reason, steps[-1].stop_reason) == ("stop", chosen)


def test_eos_ends_with_stop_and_no_stop_reason_as_in_vllm(tiny_model_dir, prompt):
    engine = ServeEngine(tiny_model_dir)
    greedy = [s.token.token_id for s in engine.generate(prompt, GREEDY)]
    engine.eos_token_ids = frozenset({greedy[2]})  # pretend the model's EOS is what it greedily says third
    steps = list(engine.generate(prompt, GREEDY))
    assert [s.token.token_id for s in steps] == greedy[: greedy.index(greedy[2]) + 1]
    assert (steps[-1].finish_reason, steps[-1].stop_reason) == ("stop", None)


def test_limits_name_the_parameter_and_what_to_do(engine):
    assert engine.max_tokens(None, 2000, param="prompt") == 10
    assert engine.max_tokens(None, 2045, param="prompt") == 3
    with pytest.raises(ServeError, match="cap of 10") as caught:
        engine.max_tokens(11, 5, param="prompt")
    assert caught.value.param == "max_tokens"
    with pytest.raises(ServeError, match="context is 2048 tokens") as caught:
        engine.max_tokens(None, 2048, param="prompt")
    assert (caught.value.param, caught.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(ServeError, match="maximum context length is 2048"):
        engine.max_tokens(5, 2044, param="prompt")


def test_the_model_name_must_be_the_served_one_or_absent(engine):
    engine.check_model(None)
    engine.check_model(engine.identity.served_name)
    with pytest.raises(ServeError) as caught:
        engine.check_model("gpt-4o")
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")


def test_generation_leaves_the_callers_torch_threads_alone(engine, prompt):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        list(engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0)))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_unseeded_requests_replay_after_a_restart_with_the_same_server_seed(tiny_model_dir, prompt):
    def session(server_seed: int) -> list[list[int]]:
        engine = ServeEngine(tiny_model_dir, seed=server_seed)
        unseeded = SamplingParams(max_tokens=6)
        return [[s.token.token_id for s in engine.generate(prompt, unseeded)] for _ in range(2)]

    first = session(5)
    assert first[0] != first[1]  # each request draws its own seed
    assert session(5) == first
    assert session(6) != first
