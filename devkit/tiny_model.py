"""The tiny default model: a ~2M-parameter Llama with a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on the
CPython standard library's own source (it ships with every Python), wrapped
in a ``PreTrainedTokenizerFast`` with ChatML special tokens and a chat
template that renders ``tools`` and tool messages the Hermes way
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``). The model is
built from a ``LlamaConfig`` with a fixed seed: its weights are random, so its
text is gibberish, but its token ids and logprobs are real, which is what the
gateway, pipelines and trainer tests need.

>>> from devkit.tiny_model import build_tiny_model, default_model_dir
>>> path = build_tiny_model(default_model_dir())   # ~3 s the first time, then reused
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

BUILDER_VERSION = 1
"""Bump when the build recipe changes, so existing folders are rebuilt."""
MARKER_FILE = "trajlake-tiny-model.json"
"""Written last into a built folder: the build parameters (reuse only on an exact match)."""
CORPUS_BYTES = 1_000_000
"""Tokenizer training text: 1 MB trains a 2k BPE in ~1-2 s on 2 cores (2.9 chars/token on code)."""
MIN_VOCAB = 512
"""256 byte symbols, the special and tool tokens, and room for merges."""
MIN_CORPUS_BYTES = 200_000
"""Below this the stdlib is missing or stripped and the tokenizer would be poor."""

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
"""Ids 0, 1, 2. ``<|im_end|>`` ends an assistant turn (the generation stop token)."""
TEXT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
"""Added as whole, non-special tokens: they survive ``skip_special_tokens`` decoding."""

DEFAULT_SYSTEM = "You are a helpful assistant."

CHAT_TEMPLATE = """\
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content -%}
    {%- for part in content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = '""" + DEFAULT_SYSTEM + """' -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
  {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in rest -%}
  {%- if message.role == 'tool' -%}
    {%- if loop.first or rest[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}
    {%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- else -%}
    {%- set content = text(message.content) -%}
    {{- '<|im_start|>' + message.role + '\\n' + content -}}
    {%- for call in message.tool_calls or [] -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
"""ChatML with Hermes tool calls (the Qwen 2.5 convention, simplified)."""


def default_model_dir(home: Path | None = None) -> Path:
    """``home/tiny-model``; without ``home`` (callers outside the shell): ``$TRAJLAKE_HOME``, else
    ``~/.cache/trajlake`` (the shell passes its ``home`` setting, the same variable)."""
    home = home or os.environ.get("TRAJLAKE_HOME") or Path.home() / ".cache" / "trajlake"
    return Path(home).expanduser() / "tiny-model"


def model_or_tiny(model: str | Path | None, *, home: Path | None = None) -> str:
    """``model``, or, when it is None, the tiny default model (built under ``home`` on first use).

    >>> model_or_tiny("/models/qwen")
    '/models/qwen'
    """
    return str(model) if model is not None else str(build_tiny_model(default_model_dir(home)))


def build_tiny_model(
    out_dir: Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    hidden: int = 256,
    intermediate: int = 512,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 2048,
) -> Path:
    """Build (or reuse) the tiny model and its tokenizer in ``out_dir``; return ``out_dir``.

    Idempotent: a folder whose marker file holds the same parameters (and the
    same training-corpus digest) is reused as is. Safe to call from several
    processes at once: the build happens under a file lock in a temporary
    sibling folder that is renamed into place.
    """
    out_dir = Path(out_dir).expanduser()
    shape = {"vocab_size": vocab_size, "hidden": hidden, "intermediate": intermediate, "layers": layers,
             "heads": heads, "max_positions": max_positions}
    _check_shape(seed, shape)
    corpus = training_corpus()
    params = {"builder_version": BUILDER_VERSION, "seed": seed, **shape,
              "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest()}
    if _read_marker(out_dir) == params:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out_dir):
        if _read_marker(out_dir) == params:
            return out_dir
        _refuse_foreign_folder(out_dir)
        log.info("event=tiny_model_build out_dir=%s seed=%d vocab_size=%d", out_dir, seed, vocab_size)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
        try:
            tokenizer = _train_tokenizer(corpus, vocab_size=vocab_size)
            tokenizer.save_pretrained(staging)
            _build_model(tokenizer, params).save_pretrained(staging)
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared
            (staging / MARKER_FILE).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
            if out_dir.exists():
                shutil.rmtree(out_dir)
            staging.rename(out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def training_corpus(max_bytes: int = CORPUS_BYTES) -> str:
    """The first ``max_bytes`` of the stdlib's top-level ``.py`` files, in name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for file in sorted(stdlib.glob("*.py")):
        text = file.read_text(encoding="utf-8", errors="replace")
        parts.append(text[: max_bytes - size])
        size += len(parts[-1])
        if size >= max_bytes:
            break
    if size < MIN_CORPUS_BYTES:
        raise RuntimeError(
            f"only {size} bytes of Python source under {stdlib}; the tiny tokenizer trains on the "
            "standard library's source: install the full Python (not a stripped/minimal build)"
        )
    return "".join(parts)


def _check_shape(seed: int, shape: dict[str, int]) -> None:
    for name, value in {"seed": seed, **shape}.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < (0 if name == "seed" else 1):
            raise ValueError(f"{name}={value} must be {'>= 0' if name == 'seed' else 'positive'}")
    if shape["vocab_size"] < MIN_VOCAB:
        raise ValueError(f"vocab_size={shape['vocab_size']} is too small for a byte-level BPE; use >= {MIN_VOCAB}")
    if shape["hidden"] % shape["heads"]:
        raise ValueError(f"hidden={shape['hidden']} must be a multiple of heads={shape['heads']}")


def _refuse_foreign_folder(out_dir: Path) -> None:
    """Never replace a folder this builder did not make (it is deleted on rebuild)."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).exists():
        raise FileExistsError(
            f"{out_dir} exists and is not a tiny-model folder (no {MARKER_FILE}); "
            "pass a new or empty folder, the builder replaces its contents"
        )


def _read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _train_tokenizer(corpus: str, *, vocab_size: int):
    """A byte-level BPE with ChatML special tokens and the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=10**6,
        clean_up_tokenization_spaces=False,
    )


def _build_model(tokenizer, params: dict):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    end_ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, END_OF_TEXT)]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=params["hidden"],
        intermediate_size=params["intermediate"],
        num_hidden_layers=params["layers"],
        num_attention_heads=params["heads"],
        num_key_value_heads=params["heads"],
        max_position_embeddings=params["max_positions"],
        bos_token_id=None,
        eos_token_id=end_ids,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(params["seed"])
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=end_ids, pad_token_id=tokenizer.pad_token_id)
    return model
