"""Tokens/s of the DeepSpeed trainer vs a plain torch loop: same model, same batches, one run.

Both loops run the same objective (``trainer.objective.forward_loss``) over the
same micro-batches in the same order with AdamW and gradient clipping; the
only difference is DeepSpeed's engine (``train_dataset`` with ZeRO stage 0 by
default) versus ``loss.backward(); clip; optimizer.step()``. The two loops
alternate step by step in one process (the plain step runs in the trainer's
step callback, timed apart), so the load of a shared machine hits both sides
alike; the figures are median step times. Warm-up steps are left out.
Goal: overhead = 1 - ds/plain <= 5%.

    .venv/bin/python bench/train/bench_train.py            # ~2 min on 2 idle cores
    .venv/bin/python bench/train/bench_train.py --zero-stage 2 --steps 40

Writes bench/train/results.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.results import Ratio, Recorder  # noqa: E402
from schemas.tables import SAMPLES, dataset_table  # noqa: E402
from store.lake import Lake  # noqa: E402
from trainer.batching import collate  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.dataset import DatasetRef  # noqa: E402
from trainer.distributed import Dist, init_distributed  # noqa: E402
from trainer.loop import StepLog, prepare_run, train_dataset  # noqa: E402
from trainer.model import load_causal_lm  # noqa: E402
from trainer.objective import forward_loss  # noqa: E402
from devkit.synthetic import synthetic_samples  # noqa: E402
from devkit.tiny_model import build_tiny_model, default_model_dir  # noqa: E402


def build_model(out: Path, *, hidden: int, layers: int) -> Path:
    """A Llama from config with the tiny model's tokenizer (so the dataset's identity matches)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(default_model_dir()))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 3,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64), max_position_embeddings=2048,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class PlainLoop:
    """``loss.backward(); clip; optimizer.step()`` on its own copy of the model, one step per call."""

    def __init__(self, config: TrainConfig, lake: Lake) -> None:
        self.config = config
        self.run = prepare_run(lake, DatasetRef("bench", 0), config, Dist(0, 1, 0, "cpu"))
        self.order = self.run.micro_order()
        self.model = load_causal_lm(config.model)
        self.model.config.use_cache = False
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    def step(self, index: int) -> float:
        """Seconds for optimizer step ``index`` (the same micro-batch the trainer's step uses)."""
        t = time.perf_counter()
        rows = self.run.batches[self.order[index]]
        out = forward_loss(self.model, collate(self.run.samples, rows, pad_id=self.run.model.pad_id), self.config)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t


def interleaved(config: TrainConfig, lake: Lake) -> tuple[list[float], list[float]]:
    """Seconds per step of the DeepSpeed trainer and of the plain loop, alternating step by step.

    The plain step runs inside the trainer's ``on_step`` callback; the trainer's
    step time is measured from the callback's return to its next call, so
    neither side is charged for the other and both see the same machine load.
    """
    plain = PlainLoop(config, lake)
    ds_times: list[float] = []
    plain_times: list[float] = []
    last_return: list[float] = []

    def on_step(entry: StepLog) -> None:
        ds_times.append(time.perf_counter() - last_return[-1] if last_return else entry.seconds)
        plain_times.append(plain.step(entry.step - 1))
        last_return.append(time.perf_counter())

    train_dataset(lake, "bench", 0, config, on_step=on_step)
    return ds_times, plain_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per loop (plus --warmup)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--zero-stage", type=int, default=0)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    args = parser.parse_args()
    logging.basicConfig(level="WARNING")
    init_distributed()
    n = args.steps + args.warmup
    recorder = Recorder("train", f"DeepSpeed trainer (`train_dataset`, ZeRO-{args.zero_stage} fp32) vs a plain torch "
                                 f"loop, same model (Llama hidden {args.hidden}, {args.layers} layers) and batches, "
                                 "steps alternating")
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        root = Path(tmp)
        model = build_model(root / "model", hidden=args.hidden, layers=args.layers)
        lake = Lake(str(root / "lake"))
        rows_per_batch = args.micro_batch_tokens // 128
        table = synthetic_samples(str(model), groups=max(1, n * rows_per_batch // 2), prompt_len=96, response_len=32)
        lake.append(dataset_table("bench"), table, schema=SAMPLES)
        config = TrainConfig(model=str(model), out=str(root / "ckpt"), lr=1e-5, zero_stage=args.zero_stage,
                             micro_batch_tokens=args.micro_batch_tokens, save_every=10**6, eval_after=False)  # fmt: skip
        ds_times, plain_times = interleaved(config, lake)
    ds, plain = ds_times[args.warmup :], plain_times[args.warmup :]
    tokens_per_step = args.micro_batch_tokens  # every micro-batch is full: rows of 128 tokens, no padding
    plain_s, ds_s = statistics.median(plain), statistics.median(ds)
    result = {
        "bench": "train",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": f"llama hidden={args.hidden} layers={args.layers} vocab=2052",
        "zero_stage": args.zero_stage,
        "tokens_per_step": tokens_per_step,
        "timed_steps": len(ds),
        "step_seconds_median": {"plain": plain_s, "deepspeed": ds_s},
        "plain_tokens_per_s": tokens_per_step / plain_s,
        "deepspeed_tokens_per_s": tokens_per_step / ds_s,
        "ratio_ds_over_plain": plain_s / ds_s,
        "overhead": 1 - plain_s / ds_s,
        "goal": "overhead <= 0.05",
    }
    result["meets_goal"] = result["overhead"] <= 0.05
    print(json.dumps(result, indent=2))
    recorder.write(
        ratios=[Ratio("deepspeed_over_plain", "tokens/s, DeepSpeed trainer / plain torch loop",
                      [result["ratio_ds_over_plain"]], goal=0.95)],
        summary=f"{result['overhead']:.1%} overhead ({result['deepspeed_tokens_per_s']:,.0f} vs "
                f"{result['plain_tokens_per_s']:,.0f} tokens/s, median of {len(ds)} steps)",
        detail=result)


if __name__ == "__main__":
    main()
