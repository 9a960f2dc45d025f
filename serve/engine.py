"""One Hugging Face causal LM served on CPU: prompts, limits, and generation steps.

Requests are serialised by a lock (one model, one generation at a time);
``generate`` runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity
from serve.protocol import ServeError
from serve.sampling import SampledToken, SamplingParams, sample_tokens
from serve.text import IncrementalText, TokenStrings

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048
"""Context length for a config that states none."""


@dataclass(frozen=True)
class Step:
    """One generated token, the text it released, and whether it ended the generation."""

    token: SampledToken
    text: str
    text_offset: int
    """Characters of generated text before this token."""
    finish_reason: str | None = None
    """``stop`` or ``length`` on the last step, else None."""
    stop_reason: str | int | None = None
    """The stop string or requested stop token id that ended it; None for EOS (vLLM's field)."""


@dataclass(frozen=True)
class ModelIdentity:
    """What the server tells clients about the model it serves."""

    served_name: str
    policy_version: str
    tokenizer: str
    chat_template_hash: str | None
    max_model_len: int
    loaded_at: int
    """Unix time the model was loaded (``created`` in /v1/models)."""

    def headers(self) -> dict[str, str]:
        headers = {"x-policy-version": self.policy_version, "x-tokenizer": self.tokenizer}
        if self.chat_template_hash:
            headers["x-chat-template-hash"] = self.chat_template_hash
        return headers


class ServeEngine:
    """Loads a ``save_pretrained`` folder and generates from it, one request at a time."""

    def __init__(
        self, model_dir: Path, *, served_name: str | None = None, policy_version: str | None = None,
        max_new_tokens_cap: int = 512, seed: int = 0, threads: int = 1,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{model_dir} is not a Hugging Face model folder (no config.json); "
                "pass a save_pretrained directory, or omit --model for the tiny default model"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.strings = TokenStrings(self.tokenizer)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.max_new_tokens_cap = max_new_tokens_cap
        self.threads = threads
        self.eos_token_ids = frozenset(_end_token_ids(self.model, self.tokenizer))
        name = served_name or model_dir.name
        template = self.tokenizer.chat_template
        self.identity = ModelIdentity(
            served_name=name,
            policy_version=policy_version or name,
            tokenizer=_tokenizer_identity(self.tokenizer),
            chat_template_hash=chat_template_hash(template) if isinstance(template, str) else None,
            max_model_len=getattr(self.model.config, "max_position_embeddings", None) or DEFAULT_CONTEXT,
            loaded_at=int(time.time()),
        )
        self._lock = threading.Lock()
        self._seeds = random.Random(seed)
        log.info("event=serve_model_loaded name=%s tokenizer=%s", name, self.identity.tokenizer)

    def check_model(self, requested: str | None) -> None:
        """404 unless the request names the served model (or names none)."""
        if requested is not None and requested != self.identity.served_name:
            raise ServeError(
                404, f"The model `{requested}` does not exist; this server serves "
                f"`{self.identity.served_name}` (see GET /v1/models)", param="model", code="model_not_found",
            )

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt token ids of the chat template with the generation prompt."""
        import jinja2

        if not self.tokenizer.chat_template:
            raise ServeError(400, "this model has no chat template; use POST /v1/completions", param="messages")
        try:
            return list(self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False,
            ))
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise ServeError(400, f"the chat template rejected these messages: {exc}", param="messages") from exc

    def text_prompt(self, prompt: str | list[int], *, add_special_tokens: bool = True) -> list[int]:
        """The prompt's token ids: token ids as given (checked), text encoded."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ServeError(400, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", param="prompt")
        return list(prompt)

    def max_tokens(self, requested: int | None, prompt_len: int, *, param: str) -> int:
        """How many tokens to generate: the request's, within the cap and the context."""
        context = self.identity.max_model_len
        room = context - prompt_len
        if room <= 0:
            raise ServeError(
                400, f"the prompt has {prompt_len} tokens but this model's context is {context} tokens; "
                "shorten it", param=param, code="context_length_exceeded",
            )
        if requested is None:
            return min(self.max_new_tokens_cap, room)
        if requested > self.max_new_tokens_cap:
            raise ServeError(
                400, f"max_tokens={requested} is over this server's cap of {self.max_new_tokens_cap}; "
                "ask for fewer (or restart serve-model with a higher --max-new-tokens)", param="max_tokens",
            )
        if requested > room:
            raise ServeError(
                400, f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} in the completion). "
                "Please reduce the prompt or max_tokens.", param="max_tokens", code="context_length_exceeded",
            )
        return requested

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, stop: tuple[str, ...] = (),
        stop_token_ids: frozenset[int] = frozenset(),
        cancel: threading.Event | None = None,
    ) -> Iterator[Step]:
        """Sample tokens and release their text; the last step carries the finish reason.

        A request without a seed takes the next one from the server's seeded
        stream, so a restarted server replays the same sequence of requests.
        """
        text = IncrementalText(self.tokenizer, stop)
        with self._lock, _torch_threads(self.threads):
            if params.seed is None:
                params = replace(params, seed=self._seeds.getrandbits(63))
            ends = self.eos_token_ids | stop_token_ids
            tokens = sample_tokens(self.model, prompt_ids, params, stop_token_ids=ends, cancel=cancel)
            for count, token in enumerate(tokens, start=1):
                offset = len(text.text)
                delta = text.push(token.token_id)
                if text.stop_string is not None:
                    yield Step(token, delta, offset, "stop", text.stop_string)
                    return
                if token.token_id in ends:
                    reason = None if token.token_id in self.eos_token_ids else token.token_id
                    yield Step(token, delta + text.finish(), offset, "stop", reason)
                    return
                if count == params.max_tokens or (cancel is not None and cancel.is_set()):
                    yield Step(token, delta + text.finish(), offset, "length")
                    return
                yield Step(token, delta, offset)


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """Torch intra-op threads for one generation, restored after (OpenMP keeps it per thread).

    One thread decodes a small model ~30x faster than two on a busy 2-core box
    (two spin-wait on each other for every tiny matmul).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _tokenizer_identity(tokenizer) -> str:
    """The content identity, or ``unknown`` for a tokenizer without a tokenizer.json behind it."""
    try:
        return tokenizer_identity(tokenizer)
    except (TypeError, ValueError) as exc:
        log.warning("event=tokenizer_unidentified reason=%r", str(exc))
        return "unknown"


def _end_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a generation: the generation config's EOS ids, else the tokenizer's."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in ids if i is not None]
