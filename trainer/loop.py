"""``train_dataset``: one dataset version -> one DeepSpeed run -> one checkpoint with lineage.

Reads top to bottom: distributed setup, the run's identity, the version's
lease (``trainer.leases``: one process per version, each claim in its own
folder), dataset and model checks, whether it resumes, the DeepSpeed engine,
the step loop (log, save a restart point every ``save_every`` steps), then
the exports and the table rows. Every rank runs this function; only rank 0
holds the lease and writes tables and the Hugging Face export, every rank
writes its DeepSpeed shard. The run's statistics travel inside each restart
point, so the metrics of a resumed run cover the whole run.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from schemas.code_version import code_version
from store.lake import Lake
from trainer.batching import Batch, collate, epoch_order, plan_batches, rank_share
from trainer.config import TrainConfig, deepspeed_dict, uses_bf16
from trainer.dataset import DatasetRef, Samples, load_samples, loss_mask_mode, resolve_version
from trainer.distributed import Dist, all_ranks_agree, barrier, init_distributed
from trainer.errors import DatasetError, ModelLoadError, TrainerError
from trainer.leases import Lease, LeaseKeeper, LeaseLost, VersionHeld, release, take
from trainer.model import ModelInfo, check_tokenizer, inspect_model, load_causal_lm
from trainer.objective import forward_loss
from trainer.records import (
    CheckpointRecord, find_checkpoint, record_status, run_states, write_checkpoint,
)  # fmt: skip

log = logging.getLogger(__name__)

DEFAULT_LEASE = timedelta(minutes=2)
"""How long a version stays claimed without a renewal (renewed every third of it while training)."""


@dataclass(frozen=True)
class StepLog:
    """What one optimizer step reports (to the log, the CLI's progress bar, tests)."""

    step: int
    total_steps: int
    epoch: int
    metrics: dict[str, float]
    tokens: int
    """Real (unpadded) tokens of this step on this rank."""
    seconds: float
    """Wall time of this step (from the end of the previous one)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


@dataclass
class Run:
    """Everything fixed before the first step."""

    dist: Dist
    config: TrainConfig
    model: ModelInfo
    samples: Samples
    checkpoint_id: str
    run_dir: Path
    ds_config: dict
    batches: list[list[int]] = field(default_factory=list)

    @property
    def grad_accum(self) -> int:
        return int(self.ds_config["gradient_accumulation_steps"])

    def micro_order(self) -> list[int]:
        """This rank's micro-batches over all epochs, in training order."""
        order: list[int] = []
        for epoch in range(self.config.epochs):
            full = epoch_order(len(self.batches), seed=self.config.seed, epoch=epoch)
            order += rank_share(full, rank=self.dist.rank, world=self.dist.world_size, grad_accum=self.grad_accum)
        return order


def checkpoint_id_for(name: str, version: int, config: TrainConfig) -> str:
    """``ckpt-<dataset>-v<version>-<hash>``: the same inputs always name the same checkpoint."""
    return f"ckpt-{name}-v{version}-{config.fingerprint(base_model=config.model)}"


def prepare_run(lake: Lake, ref: DatasetRef, config: TrainConfig, dist: Dist, *, run_dir: Path | None = None) -> Run:
    """Load and check everything a run needs before touching DeepSpeed (``run_dir``: default ``<out>/<id>``)."""
    info = inspect_model(config.model)
    version = resolve_version(lake, ref)
    max_len = min(config.max_seq_len or info.max_positions, info.max_positions)
    samples = load_samples(lake, DatasetRef(ref.name, version), vocab_size=info.vocab_size, max_len=max_len)
    check_tokenizer(samples.tokenizers, info)
    observations = loss_mask_mode(lake, ref, version) == "observations"
    if observations and config.mode != "sft":
        raise DatasetError(
            f"dataset {ref.name}@{version} is an observation-prediction dataset (loss on tool results, no "
            "advantages): a policy-gradient step would learn nothing; train it with --mode sft"
        )
    if config.mode == "sft" and not observations:  # observations teach the environment: every rollout counts
        samples = samples.select(samples.reward > config.sft_min_reward)
        if not len(samples):
            raise DatasetError(
                f"dataset {ref.name}@{version} has no rollout with reward > {config.sft_min_reward} for SFT: "
                "lower --sft-min-reward or train with --mode pg"
            )
    checkpoint_id = checkpoint_id_for(ref.name, version, config)
    run_dir = run_dir or Path(config.out) / checkpoint_id
    run = Run(dist, config, info, samples, checkpoint_id, run_dir, deepspeed_dict(config))
    run.batches = plan_batches([len(x) for x in samples.input_ids], budget=config.micro_batch_tokens)
    return run


def train_dataset(
    lake: Lake,
    dataset: str,
    version: int | None,
    config: TrainConfig,
    *,
    parent_checkpoint_id: str | None = None,
    on_step: Callable[[StepLog], None] | None = None,
    lease: timedelta = DEFAULT_LEASE,
) -> CheckpointRecord:
    """Train ``datasets/<dataset>`` at ``version`` (latest when None) and record the checkpoint.

    Idempotent: a run that already finished returns its checkpoint; a run that
    started and died resumes from its last restart point. A version another
    process is training raises ``VersionHeld``; a version refused at
    validation is recorded ``failed`` with the reason.

    >>> rec = train_dataset(Lake("lake"), "math", 3, TrainConfig(model="tiny"))  # doctest: +SKIP
    >>> rec.checkpoint_id  # doctest: +SKIP
    'ckpt-math-v3-1a2b3c4d'
    """
    dist = init_distributed()
    version = resolve_version(lake, DatasetRef(dataset, version))
    checkpoint_id = checkpoint_id_for(dataset, version, config)
    if (done := _finished(lake, checkpoint_id, dist)) is not None:
        return done
    claim = _claim(lake, dataset, version, checkpoint_id, config, dist, lease)
    with _holding(lake, claim.held, lease) as keeper:
        if (done := _finished(lake, checkpoint_id, dist)) is not None:
            return done  # another process finished it between our check and our claim
        started = -1  # refused at validation: failed before it started
        try:
            run = prepare_run(lake, DatasetRef(dataset, version), config, dist, run_dir=claim.run_dir)
            started = _start(lake, run, claim.resume_step)
            return _train(lake, run, claim, parent_checkpoint_id, on_step, _guard(keeper))
        except (LeaseLost, ModelLoadError):
            raise  # the new holder owns the run's rows now; a model that does not load is no fault of the version
        except BaseException as exc:
            if dist.is_main and not isinstance(exc, KeyboardInterrupt):
                record_status(lake, checkpoint_id, dataset=dataset, version=version, status="failed",
                              step=started, error=f"{type(exc).__name__}: {exc}"[:2000])  # fmt: skip
            raise


def _finished(lake: Lake, checkpoint_id: str, dist: Dist) -> CheckpointRecord | None:
    """The run's checkpoint row when it finished already (every rank gets rank 0's answer)."""
    done = find_checkpoint(lake, checkpoint_id)
    if all_ranks_agree("done" if done else "todo") == "todo":
        return None
    log.info("event=already_trained checkpoint_id=%s", checkpoint_id)
    return done or _read_record(lake, checkpoint_id)


def _read_record(lake: Lake, checkpoint_id: str) -> CheckpointRecord:
    """The row rank 0 found (this rank read the table a moment before it did)."""
    record = find_checkpoint(lake, checkpoint_id)
    if record is None:
        raise TrainerError(f"checkpoint {checkpoint_id} vanished from the checkpoints table: was it rewritten?")
    return record


@dataclass(frozen=True)
class Claim:
    """This process's claim on the run: its own folder and where it resumes from."""

    run_dir: Path
    resume_dir: Path | None
    resume_step: int
    held: Lease | None
    """The lease (rank 0 only)."""


def _claim(lake: Lake, dataset: str, version: int, checkpoint_id: str, config: TrainConfig, dist: Dist,
           lease: timedelta) -> Claim:  # fmt: skip
    """Rank 0 takes the version's lease and finds the newest restart point of earlier claims; all ranks learn both."""
    held, answer = None, {}
    if dist.is_main:
        try:
            held, earlier = take(lake, dataset, version, run_id=checkpoint_id, out=Path(config.out), lease=lease)
            answer = {"run_dir": held.run_dir, **_restart_point(earlier)}
        except VersionHeld as exc:
            answer = {"held": str(exc)}
    answer = json.loads(all_ranks_agree(json.dumps(answer)))
    if "held" in answer:
        raise VersionHeld(answer["held"])
    resume_dir = Path(answer["resume_dir"]) if answer.get("resume_dir") else None
    return Claim(Path(answer["run_dir"]), resume_dir, int(answer.get("resume_step", 0)), held)


def _restart_point(earlier: list[Lease]) -> dict[str, Any]:
    """The newest restart point (highest step) that an earlier claim of the run left on reachable disk."""
    best: dict[str, Any] = {}
    for lease in earlier:
        latest = Path(lease.run_dir) / "ds" / "latest"
        if latest.is_file():
            step = int(latest.read_text().strip().removeprefix("step"))
            if step > best.get("resume_step", 0):
                best = {"resume_dir": str(latest.parent), "resume_step": step}
    return best


@contextmanager
def _holding(lake: Lake, held: Lease | None, lease: timedelta) -> Iterator[LeaseKeeper | None]:
    """Renew the lease while the body runs, then release it (unless it was taken over)."""
    if held is None:
        yield None
        return
    keeper = LeaseKeeper(lake, held, lease=lease)
    try:
        with keeper:
            yield keeper
    finally:
        if keeper.lost is None:
            release(lake, keeper.held)


def _guard(keeper: LeaseKeeper | None) -> Callable[[], None]:
    """A check every rank runs before writing what only the lease holder may write (restart points, rows)."""

    def check() -> None:
        lost = keeper is not None and keeper.lost is not None
        if all_ranks_agree("lost" if lost else "ok") == "lost":
            if keeper is not None:
                keeper.check()
            raise LeaseLost("rank 0 lost the version's lease: another process trains it now")

    return check


def _start(lake: Lake, run: Run, resume_step: int) -> int:
    """Record the (re)start on rank 0; returns the step it resumes from (0 = fresh)."""
    if run.dist.is_main:
        record_status(lake, run.checkpoint_id, dataset=run.samples.name, version=run.samples.version,
                      status="started", step=resume_step)  # fmt: skip
    return resume_step


def _own_clipping(ds_config: dict) -> tuple[dict, float]:
    """Take gradient clipping out of DeepSpeed where it would be its plain fp32 path.

    With ZeRO 0 and fp32 DeepSpeed clips with a per-parameter Python loop
    (~6% of a small model's step on CPU); torch's fused ``clip_grad_norm_`` at
    the same point (after the all-reduce, before the update) computes the same
    norm. ZeRO and bf16 clip inside their own optimizers: left to DeepSpeed.
    """
    if ds_config["zero_optimization"]["stage"] != 0 or uses_bf16(ds_config):
        return ds_config, 0.0
    return {**ds_config, "gradient_clipping": 0.0}, float(ds_config.get("gradient_clipping", 0.0))


def _build_engine(run: Run):
    """The DeepSpeed engine, the reference model (KL) or None, and the clip norm the loop applies."""
    import deepspeed

    model = load_causal_lm(run.config.model)
    model.config.use_cache = False
    optimizer = None
    if "optimizer" not in run.ds_config:
        optimizer = torch.optim.AdamW(model.parameters(), lr=run.config.lr, weight_decay=run.config.weight_decay)
    engine_config, clip = _own_clipping(run.ds_config)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=engine_config,
                                      model_parameters=None if optimizer else model.parameters())  # fmt: skip
    if run.dist.world_size == 1 and not engine.zero_optimization() and not engine.bfloat16_enabled():
        # one rank, plain data parallel: the gradient all-reduce is an identity that copies every
        # gradient into a flat buffer and back each step; skip it
        engine.enable_backward_allreduce = False
    ref_model = None
    if run.config.mode == "pg" and run.config.kl_coef > 0:
        dtype = torch.bfloat16 if uses_bf16(run.ds_config) else torch.float32
        ref_model = load_causal_lm(run.config.reference_model or run.config.model, dtype=dtype)
        ref_model.to(run.dist.device).eval().requires_grad_(False)
    return engine, ref_model, clip


def _train(lake: Lake, run: Run, claim: Claim, parent_id: str | None, on_step,
           guard: Callable[[], None]) -> CheckpointRecord:  # fmt: skip
    engine, ref_model, clip = _build_engine(run)
    ds_dir = run.run_dir / "ds"
    resume_step, before = claim.resume_step, None
    if resume_step:
        _, client_state = engine.load_checkpoint(str(claim.resume_dir), tag=f"step{resume_step}")
        before = (client_state or {}).get("run_stats")
        log.info("event=resumed checkpoint_id=%s step=%d from=%s", run.checkpoint_id, resume_step, claim.resume_dir)
    order = run.micro_order()
    per_epoch = len(order) // run.config.epochs
    dropped = len(run.batches) - per_epoch * run.dist.world_size
    if dropped:
        log.warning("event=batches_dropped count=%d reason=equal_share_per_rank_and_accumulation", dropped)
    total_steps = len(order) // run.grad_accum
    stats = _StepStats(before)
    engine.train()
    for micro, batch_index in enumerate(order[resume_step * run.grad_accum :], start=resume_step * run.grad_accum):
        batch = collate(run.samples, run.batches[batch_index], pad_id=run.model.pad_id).to(run.dist.device)
        out = forward_loss(engine, batch, run.config, ref_model=ref_model)
        engine.backward(out.loss)
        if clip and engine.is_gradient_accumulation_boundary():
            torch.nn.utils.clip_grad_norm_(engine.module.parameters(), clip)
        engine.step()
        stats.add(out.metrics, batch)
        if (micro + 1) % run.grad_accum:
            continue
        step = (micro + 1) // run.grad_accum
        entry = stats.flush(step, total_steps, micro // per_epoch)
        log.info("event=train_step checkpoint_id=%s %s", run.checkpoint_id,
                 " ".join(f"{k}={v:.5g}" for k, v in {"step": step, **entry.metrics}.items()))  # fmt: skip
        if step % run.config.save_every == 0 and step < total_steps:
            guard()
            _save_restart_point(engine, run, ds_dir, step, stats)
        if on_step is not None:
            on_step(entry)
    guard()
    _save_restart_point(engine, run, ds_dir, total_steps, stats)
    metrics = stats.summary() | {"steps": total_steps, "resumed_from_step": resume_step}
    if run.config.eval_after:
        engine.eval()
        metrics["eval_loss"] = evaluate(engine, run.samples, run.config, pad_id=run.model.pad_id,
                                        device=run.dist.device, ref_model=ref_model)  # fmt: skip
    hf_dir = run.run_dir / "hf"
    _export_hf(engine, run, hf_dir)
    guard()
    return _finish(lake, run, metrics, ds_dir, hf_dir, parent_id, total_steps)


def _save_restart_point(engine, run: Run, ds_dir: Path, step: int, stats: _StepStats) -> None:
    """A DeepSpeed checkpoint tagged ``step<N>`` carrying the run's statistics so far; older
    restart points of this claim are removed (disk stays flat)."""
    engine.save_checkpoint(str(ds_dir), tag=f"step{step}", client_state={"run_stats": stats.state()})
    barrier()
    if run.dist.is_main:
        for old in ds_dir.glob("step*"):
            if old.is_dir() and old.name != f"step{step}":
                shutil.rmtree(old)


class _StepStats:
    """Sums micro-batch metrics into per-step means and whole-run totals.

    ``before``: the totals a restart point carried (``state()`` of the segments
    before a resume), so a resumed run's summary covers the whole run.
    """

    def __init__(self, before: dict[str, Any] | None = None) -> None:
        before = before or {}
        self.pending: list[dict[str, float]] = []
        self.tokens = 0
        """Real tokens of this segment on this rank."""
        self.step_tokens = 0
        self.t0 = self.t_step = time.perf_counter()
        self.tokens_before = float(before.get("tokens", 0.0))
        """Tokens of earlier segments, all ranks."""
        self.seconds_before = float(before.get("train_seconds", 0.0))
        self.losses: list[float] = list(before.get("losses", []))
        self.clip_fracs: list[float] = list(before.get("clip_fracs", []))
        self.resumes = int(before["resumes"]) + 1 if "resumes" in before else 0

    def add(self, metrics: dict[str, float], batch: Batch) -> None:
        self.pending.append(metrics)
        self.step_tokens += batch.n_tokens

    def flush(self, step: int, total_steps: int, epoch: int) -> StepLog:
        now = time.perf_counter()
        keys = self.pending[0].keys()
        means = {k: float(np.mean([m[k] for m in self.pending])) for k in keys}
        if "ratio_min" in keys:
            means["ratio_min"] = min(m["ratio_min"] for m in self.pending)
            means["ratio_max"] = max(m["ratio_max"] for m in self.pending)
        seconds = now - self.t_step
        means["tokens_per_s"] = self.step_tokens / max(seconds, 1e-9)
        self.losses.append(means["loss"])
        self.clip_fracs.append(means.get("clip_frac", 0.0))
        entry = StepLog(step, total_steps, epoch, means, self.step_tokens, seconds)
        self.tokens += self.step_tokens
        self.pending, self.step_tokens, self.t_step = [], 0, now
        return entry

    def state(self) -> dict[str, Any]:
        """The whole run's totals so far (all ranks: every rank must call it)."""
        return {
            "tokens": self.tokens_before + _sum_over_ranks(float(self.tokens)),
            "train_seconds": self.seconds_before + time.perf_counter() - self.t0,
            "losses": self.losses, "clip_fracs": self.clip_fracs, "resumes": self.resumes,
        }  # fmt: skip

    def summary(self) -> dict[str, float]:
        """The run's metrics: every segment since the first step, across resumes."""
        state = self.state()
        tail = self.losses[-max(1, len(self.losses) // 10) :] if self.losses else [float("nan")]
        return {
            "first_loss": self.losses[0] if self.losses else float("nan"),
            "final_loss": float(np.mean(tail)),
            "clip_frac": float(np.mean(self.clip_fracs)) if self.clip_fracs else 0.0,
            "tokens": state["tokens"],
            "tokens_per_s": state["tokens"] / max(state["train_seconds"], 1e-9),
            "train_seconds": state["train_seconds"],
            "resumes": self.resumes,
        }


def _sum_over_ranks(value: float) -> float:
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item())


@torch.no_grad()
def evaluate(model: torch.nn.Module, samples: Samples, config: TrainConfig, *, pad_id: int = 0,
             device: str = "cpu", ref_model: torch.nn.Module | None = None) -> float:  # fmt: skip
    """The objective over the whole dataset: sum of w x loss over sum of w (no update).

    Under several ranks each evaluates every ``world``-th micro-batch and the sums are all-reduced.
    """
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    batches = plan_batches([len(x) for x in samples.input_ids], budget=config.micro_batch_tokens)
    num = den = 0.0
    for rows in batches[rank::world]:
        batch = collate(samples, rows, pad_id=pad_id).to(device)
        out = forward_loss(model, batch, config, ref_model=ref_model)
        weight = float(batch.weight.sum())
        num += float(out.loss) * weight
        den += weight
    num, den = _sum_over_ranks(num), _sum_over_ranks(den)
    return num / den if den else float("nan")


def _export_hf(engine, run: Run, hf_dir: Path) -> None:
    """``save_pretrained`` of the trained weights plus the base tokenizer (ZeRO-3 gathers first)."""
    import deepspeed
    from transformers import AutoTokenizer

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=run.ds_config["zero_optimization"]["stage"] == 3):
        if run.dist.is_main:
            engine.module.config.use_cache = True
            engine.module.save_pretrained(hf_dir)
            AutoTokenizer.from_pretrained(run.config.model).save_pretrained(hf_dir)
    barrier()


def _finish(lake: Lake, run: Run, metrics: dict, ds_dir: Path, hf_dir: Path, parent_id: str | None,
            steps: int) -> CheckpointRecord:  # fmt: skip
    record = CheckpointRecord(
        checkpoint_id=run.checkpoint_id,
        dataset=run.samples.name,
        dataset_version=run.samples.version,
        base_model=run.config.model,
        parent_checkpoint_id=parent_id,
        mode=run.config.mode,
        config={"train": run.config.model_dump(), "deepspeed": run.ds_config},
        code_version=code_version(),
        metrics=metrics,
        ds_path=str(ds_dir.resolve()),
        hf_path=str(hf_dir.resolve()),
        tokenizer=run.model.tokenizer_identity,
        world_size=run.dist.world_size,
        n_samples=len(run.samples),
        n_tokens=run.samples.n_tokens,
        steps=steps,
        created_at=datetime.now(UTC),
    )
    if run.dist.is_main:
        write_checkpoint(lake, record)
        record_status(lake, run.checkpoint_id, dataset=record.dataset, version=record.dataset_version,
                      status="finished", step=steps)  # fmt: skip
    barrier()
    log.info("event=checkpoint_written checkpoint_id=%s hf_path=%s", record.checkpoint_id, record.hf_path)
    return record
