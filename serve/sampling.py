"""Token-by-token sampling on CPU with a KV cache, and the logprobs of what was sampled.

Logprobs are those of the RAW model distribution (``log_softmax`` of the
logits, before temperature, top-k and top-p), which is what vLLM reports by
default and what an RL objective compares against. The token itself is drawn
from the processed distribution (temperature, then top-k, then top-p).
Temperature 0 is greedy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token (one request's options, validated)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    seed: int | None = None
    """None: the engine picks one from the server's seeded stream."""
    top_logprobs: int = 0
    """How many most-likely alternatives to report per position (0: none)."""


@dataclass(frozen=True)
class SampledToken:
    """One sampled token with its raw logprob and the raw top alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def sample_tokens(
    model: torch.nn.Module,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    stop_token_ids: frozenset[int],
    cancel: threading.Event | None = None,
) -> Iterator[SampledToken]:
    """Yield up to ``params.max_tokens`` tokens; the last may be a stop token (it is yielded)."""
    generator = torch.Generator()
    if params.seed is None:
        generator.seed()  # fresh entropy
    else:
        generator.manual_seed(params.seed % 2**64)  # any int a client sends
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        for step in range(params.max_tokens):
            logits = out.logits[0, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            token = _choose(logits, params, generator)
            yield SampledToken(token, float(logprobs[token]), _top(logprobs, params.top_logprobs))
            last = step == params.max_tokens - 1
            if token in stop_token_ids or last or (cancel is not None and cancel.is_set()):
                return
            out = model(
                input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
            )


def _choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (at least one)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)


def _top(logprobs: torch.Tensor, k: int) -> tuple[tuple[int, float], ...]:
    if k <= 0:
        return ()
    values, ids = torch.topk(logprobs, min(k, logprobs.numel()))
    return tuple(zip(ids.tolist(), values.tolist(), strict=True))
