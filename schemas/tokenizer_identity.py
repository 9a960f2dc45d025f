"""Stable identity strings for tokenizers and chat templates.

The gateway records them on every ``llm.request``; the pipelines compare them
before trusting that two calls' token ids live in the same vocabulary. Both
are content hashes, so a tokenizer copied into a checkpoint folder keeps its
identity, and any change to the vocabulary, merges, added tokens or
pre-tokenization changes it.

Pure functions over strings, bytes, paths or a tokenizer object: nothing heavy
is imported here (a tokenizer object is used through ``backend_tokenizer``).

>>> chat_template_hash("{{ messages }}")
'f24189f08c85'
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

DIGEST_CHARS = 12
"""Hex characters kept from a sha256: 48 bits, plenty to tell tokenizers apart."""

RUNTIME_KEYS = ("truncation", "padding")
"""tokenizer.json keys that are call-time settings, not part of what a token id means."""


def chat_template_hash(template: str) -> str:
    """The first 12 hex chars of the sha256 of a chat template's exact text."""
    if not isinstance(template, str):
        raise TypeError(f"chat template must be a str, got {type(template).__name__}")
    return hashlib.sha256(template.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def tokenizer_identity(tokenizer_or_path: Any) -> str:
    """``<model kind>-<vocab size>@<sha256 of tokenizer.json>[:12]``, e.g. ``bpe-2048@4f1c09a2e7b3``.

    Accepts a fast tokenizer object (``transformers`` or ``tokenizers``), a
    folder holding ``tokenizer.json``, the file itself, or its text/bytes.
    The hash covers the canonical JSON of everything that decides token ids
    (model vocabulary and merges, added tokens, normalizer, pre-tokenizer,
    post-processor, decoder) and leaves out truncation/padding settings.
    """
    spec = _tokenizer_spec(tokenizer_or_path)
    for key in RUNTIME_KEYS:
        spec.pop(key, None)
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
    return f"{_kind(spec)}-{_vocab_size(spec)}@{digest}"


def _tokenizer_spec(source: Any) -> dict:
    """The parsed tokenizer.json of any accepted source."""
    if isinstance(source, (bytes, bytearray)):
        try:
            text = bytes(source).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"tokenizer.json bytes are not UTF-8 ({exc})") from exc
    elif isinstance(source, (str, os.PathLike)) and not _looks_like_json(source):
        text = _read_tokenizer_json(Path(source))
    elif isinstance(source, str):
        text = source
    else:
        backend = getattr(source, "backend_tokenizer", source)
        to_str = getattr(backend, "to_str", None)
        if to_str is None:
            raise TypeError(
                f"cannot identify a {type(source).__name__}: pass a fast tokenizer, "
                "a folder with tokenizer.json, or that file's text"
            )
        text = to_str()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tokenizer.json is not valid JSON ({exc}); re-save the tokenizer") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise ValueError("tokenizer.json has no 'model' object; is this a tokenizers file?")
    return spec


def _looks_like_json(source: str | os.PathLike) -> bool:
    return isinstance(source, str) and source.lstrip().startswith("{")


def _read_tokenizer_json(path: Path) -> str:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no tokenizer.json at {file}; only fast (tokenizers) tokenizers have an identity"
        )
    return file.read_text(encoding="utf-8")


def _kind(spec: dict) -> str:
    return str(spec["model"].get("type") or "unknown").lower()


def _vocab_size(spec: dict) -> int:
    vocab = spec["model"].get("vocab") or {}
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    ids.update(t["id"] for t in spec.get("added_tokens") or [] if isinstance(t, dict) and "id" in t)
    return len(ids)
