"""Tokens/s and MFU of bf16 training of a ~0.5B Llama (built from a config) on one GPU.

Self-contained: needs torch and transformers (DeepSpeed only with --deepspeed).
No download: the model is built from a LlamaConfig with random weights and the
batches are random token ids, which is all throughput needs. Runs in well
under 3 minutes on an H200.

    python bench/train/gpu_mfu.py                  # plain torch: bf16 weights, fused AdamW
    python bench/train/gpu_mfu.py --deepspeed      # DeepSpeed engine: bf16 with fp32 master weights, ZeRO 0
    python bench/train/gpu_mfu.py --compile        # torch.compile'd model (slower start, higher MFU)

MFU = achieved model FLOP/s / peak. Model FLOPs per token follow the PaLM
appendix: 6 x N (N = parameters without the input embedding; the LM head is
counted) + 12 x layers x hidden x seq (attention scores and values, fwd+bwd).
Peak: H200 SXM bf16 dense 989 TFLOP/s (override with --peak-tflops).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model


def flops_per_token(model: torch.nn.Module, args: argparse.Namespace) -> tuple[float, int]:
    n_params = sum(p.numel() for p in model.parameters())
    n_dense = n_params - model.get_input_embeddings().weight.numel()
    return 6.0 * n_dense + 12.0 * args.layers * args.hidden * args.seq, n_params


def make_step(model: torch.nn.Module, args: argparse.Namespace):
    """A function doing one optimizer step over a [batch, seq] micro-batch, returning the loss."""
    if args.deepspeed:
        for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": "29533"}.items():  # fmt: skip
            os.environ.setdefault(key, value)
        import deepspeed

        deepspeed.init_distributed()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        ds_config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
                     "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}, "gradient_clipping": 1.0,
                     "steps_per_print": 10**9}  # fmt: skip
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

        def step(ids: torch.Tensor) -> torch.Tensor:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            return loss

        return step
    model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def main() -> None:
    p = argparse.ArgumentParser(description="bf16 training throughput and MFU of a ~0.5B Llama")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak of the GPU")
    p.add_argument("--deepspeed", action="store_true", help="step through a DeepSpeed engine")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first (adds ~1 min of warm-up)")
    args = p.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    model = build_model(args)
    fpt, n_params = flops_per_token(model, args)
    print(f"model: {n_params / 1e6:.0f}M parameters; {fpt / 1e9:.2f} GFLOP per token", file=sys.stderr)
    if args.compile:
        model.compile()
    step = make_step(model, args)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    for i in range(args.warmup):
        step(ids)
        print(f"warm-up step {i + 1}/{args.warmup} done", file=sys.stderr)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step(ids)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / args.steps
    tokens_per_s = args.batch * args.seq / seconds
    result = {
        "bench": "train/gpu_mfu",
        "gpu": torch.cuda.get_device_name(),
        "loop": ("deepspeed" if args.deepspeed else "torch") + (" compiled" if args.compile else ""),
        "params": n_params,
        "tokens_per_step": args.batch * args.seq,
        "step_seconds": round(seconds, 4),
        "tokens_per_s": round(tokens_per_s),
        "model_tflops_per_s": round(tokens_per_s * fpt / 1e12, 1),
        "mfu": round(tokens_per_s * fpt / (args.peak_tflops * 1e12), 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "final_loss": round(float(loss), 4),
        "goal": "mfu >= 0.45",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
