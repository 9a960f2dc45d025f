"""The trainer's distinct failures, each saying what to do next."""

from __future__ import annotations

from schemas.errors import TrajlakeError


class TrainerError(TrajlakeError, RuntimeError):
    """Base of every error the trainer raises on purpose."""


class DatasetError(TrainerError):
    """A dataset version that cannot be trained on as it is (missing, malformed, empty)."""


class TokenizerMismatch(TrainerError):
    """The dataset's token ids come from a different tokenizer than the model's."""

    def __init__(self, dataset_identities: list[str], model_identity: str, model: str) -> None:
        self.dataset_identities = dataset_identities
        self.model_identity = model_identity
        shown = ", ".join(dataset_identities[:3]) + (" ..." if len(dataset_identities) > 3 else "")
        super().__init__(
            f"tokenizer mismatch: the dataset's samples were tokenized by [{shown}] but the model {model} "
            f"uses {model_identity}; train a model that shares the dataset's tokenizer (--model) or rebuild "
            "the dataset from rollouts served by this model"
        )


class ModelLoadError(TrainerError):
    """The base model folder cannot be loaded as a Hugging Face causal LM with a tokenizer."""
