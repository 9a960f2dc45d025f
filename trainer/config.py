"""What one training run needs to know, and the DeepSpeed config built from it.

``TrainConfig`` holds the objective's knobs and the run's shape. The
DeepSpeed JSON a user passes keeps authority over everything DeepSpeed owns
(ZeRO stage, bf16, accumulation, optimizer, scheduler); an explicit option
(``zero_stage=`` / ``bf16=`` / ``grad_accum=``) overrides it, and built-in
defaults fill what neither sets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainConfig(BaseModel):
    """One training run's settings (the ``--`` options of ``trajlake train``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    """Local Hugging Face causal-LM folder (config + weights + tokenizer) to start from."""
    out: str = "./checkpoints"
    """Where checkpoints go: ``<out>/<checkpoint_id>/{ds,hf}``."""
    mode: Literal["pg", "sft"] = "pg"
    """pg: clipped policy gradient on the advantages; sft: masked NLL over positive rollouts."""
    deepspeed_config: dict[str, Any] = Field(default_factory=dict)
    """The user's DeepSpeed JSON (already parsed); see ``deepspeed_dict``."""
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    """ZeRO stage; None = the JSON's, else 0 (plain data parallel)."""
    bf16: bool | None = None
    """bf16 mixed precision; None = the JSON's, else fp32."""
    grad_accum: int | None = Field(default=None, ge=1, le=4096)
    """Micro-batches per optimizer step; None = the JSON's, else 1."""
    micro_batch_tokens: int = Field(default=4096, ge=8, le=1 << 24)
    """Token budget of one micro-batch: rows x padded length never exceeds it."""
    epochs: int = Field(default=1, ge=1, le=1000)
    """Passes over the dataset version."""
    lr: float = Field(default=1e-5, gt=0, le=1.0)
    """AdamW learning rate (used when the DeepSpeed JSON has no optimizer)."""
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    """Gradient-norm clipping; 0 turns it off."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """PPO clip: the ratio is held above 1 - clip_low where the advantage is negative."""
    clip_high: float = Field(default=0.28, ge=0)
    """PPO clip: the ratio is held below 1 + clip_high where the advantage is positive."""
    is_cap: float = Field(default=3.0, gt=1)
    """Truncation of the importance weight for stale samples (dual clip, on negative advantages)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the k3 KL estimate to the reference model; 0 loads no reference."""
    reference_model: str | None = None
    """Reference model folder for the KL term; None = the base model."""
    sft_min_reward: float = 0.0
    """SFT mode trains on rows whose reward is strictly above this (rejection sampling)."""
    max_seq_len: int | None = Field(default=None, ge=2)
    """Longest sample accepted; None = the model's max_position_embeddings."""
    save_every: int = Field(default=50, ge=1)
    """Optimizer steps between DeepSpeed checkpoints (restart points)."""
    eval_after: bool = True
    """Measure the weighted loss over the dataset after training (metric ``eval_loss``)."""
    seed: int = 0

    @model_validator(mode="after")
    def _reference_needs_kl(self) -> TrainConfig:
        if self.reference_model and self.kl_coef == 0:
            raise ValueError("reference_model is set but kl_coef is 0: pass --kl-coef > 0 or drop the reference")
        return self

    def fingerprint(self, *, base_model: str) -> str:
        """Short hash of everything that changes what a run produces (not where it writes)."""
        payload = self.model_dump(exclude={"out", "save_every", "eval_after", "model"})
        payload["base_model"] = base_model
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:8]


def load_deepspeed_json(path: str | Path) -> dict[str, Any]:
    """Read a user's DeepSpeed JSON config, with an error that says what is wrong."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"DeepSpeed config {p} does not exist: check --deepspeed-config") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"DeepSpeed config {p} is not valid JSON ({exc}): fix the file") from None
    if not isinstance(data, dict):
        raise ValueError(f"DeepSpeed config {p} must hold a JSON object, got {type(data).__name__}")
    return data


def deepspeed_dict(config: TrainConfig) -> dict[str, Any]:
    """The DeepSpeed config for this run.

    One micro-batch is one token-budget batch, so ``train_micro_batch_size_per_gpu``
    is 1 and ``train_batch_size`` is left for DeepSpeed to derive.

    >>> deepspeed_dict(TrainConfig(model="m", zero_stage=2))["zero_optimization"]["stage"]
    2
    """
    ds = json.loads(json.dumps(config.deepspeed_config))
    ds.pop("train_batch_size", None)
    ds["train_micro_batch_size_per_gpu"] = 1
    if config.grad_accum is not None or "gradient_accumulation_steps" not in ds:
        ds["gradient_accumulation_steps"] = config.grad_accum or 1
    zero = ds.setdefault("zero_optimization", {})
    if config.zero_stage is not None or "stage" not in zero:
        zero["stage"] = config.zero_stage or 0
    if config.bf16 is not None:
        ds["bf16"] = {**ds.get("bf16", {}), "enabled": config.bf16}
    if ds.get("fp16", {}).get("enabled"):
        raise ValueError("fp16 is not supported (loss scaling breaks the ratio statistics): use bf16 or fp32")
    if config.grad_clip and "gradient_clipping" not in ds:
        ds["gradient_clipping"] = config.grad_clip
    ds.setdefault("steps_per_print", 1 << 30)
    ds.setdefault("wall_clock_breakdown", False)
    return ds


def uses_bf16(ds: dict[str, Any]) -> bool:
    return bool(ds.get("bf16", {}).get("enabled"))
