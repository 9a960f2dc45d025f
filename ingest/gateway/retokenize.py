"""Fallback token ids from the configured HF tokenizer, for engines that return none.

Loaded lazily from a local path on first use (in the emitter thread, never on
the hot path). Prompt ids come from the chat template with
``add_generation_prompt=True``; response ids from encoding the text. These are
*not* what the engine sampled, so such rows say ``token_source="retokenized"``.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from typing import Any

from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity

log = logging.getLogger(__name__)


class Retokenizer:
    """Tokenizes prompts and responses with the tokenizer at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        with self._lock:
            log.info("loading tokenizer path=%s", self.path)
            return AutoTokenizer.from_pretrained(self.path)

    @cached_property
    def identity(self) -> str:
        return tokenizer_identity(self.tokenizer)

    @cached_property
    def template_hash(self) -> str | None:
        template = getattr(self.tokenizer, "chat_template", None)
        return chat_template_hash(template) if isinstance(template, str) else None

    def prompt_ids(self, *, messages: list[dict] | None, prompt: Any, tools: list[dict] | None) -> list[int] | None:
        if messages is not None:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True
            )
            return _as_ids(ids)
        if isinstance(prompt, str):
            return _as_ids(self.tokenizer(prompt)["input_ids"])
        return None

    def response_ids(self, text: str | None) -> list[int] | None:
        if text is None:
            return None
        return _as_ids(self.tokenizer.encode(text, add_special_tokens=False))


def _as_ids(value: Any) -> list[int]:
    if hasattr(value, "keys") and "input_ids" in value:
        value = value["input_ids"]
    return [int(i) for i in value]
