"""Load the base model and its tokenizer, and refuse a dataset tokenized differently."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from schemas.tokenizer_identity import tokenizer_identity
from trainer.errors import ModelLoadError, TokenizerMismatch


@dataclass(frozen=True)
class ModelInfo:
    """What the trainer needs to know about a model folder before loading weights."""

    path: str
    tokenizer_identity: str
    vocab_size: int
    max_positions: int
    pad_id: int


def inspect_model(path: str) -> ModelInfo:
    """Read the config and tokenizer of a local HF causal-LM folder (no weights loaded)."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{path} is not a Hugging Face model folder (no config.json): pass --model with a local "
            "folder written by save_pretrained (the demo's tiny model is the default)"
        )
    try:
        config = AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        identity = tokenizer_identity(tokenizer)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the model config or tokenizer from {path}: {exc}") from exc
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return ModelInfo(
        path=str(folder),
        tokenizer_identity=identity,
        vocab_size=int(config.vocab_size),
        max_positions=int(getattr(config, "max_position_embeddings", 1 << 20)),
        pad_id=int(pad or 0),
    )


def check_tokenizer(dataset_identities: list[str], model: ModelInfo) -> None:
    """Raise ``TokenizerMismatch`` unless every identity the dataset records equals the model's.

    Rows without a recorded identity are not evidence either way; a dataset
    where no row records one is accepted (the vocabulary bound still holds).
    """
    foreign = [t for t in dataset_identities if t != model.tokenizer_identity]
    if foreign:
        raise TokenizerMismatch(foreign, model.tokenizer_identity, model.path)


def load_causal_lm(path: str, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The model's weights as a trainable module (fp32 master weights by default)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model weights from {path}: {exc}") from exc
