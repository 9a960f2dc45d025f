"""``trajlake train`` (one dataset version, or ``--follow`` new ones) and ``trajlake checkpoints``.

Works unchanged under ``torchrun --nproc_per_node N $(which trajlake) train ...`` and
``deepspeed --no_local_rank --num_gpus N $(which trajlake) train ...`` (the launcher's
``--local_rank`` argument would land before the subcommand): every rank trains, rank 0
alone prints and writes tables.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path

from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from schemas.errors import InputError, SettingsInvalid
from trainer.errors import TrainerError
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, LAKE_OPTION, first_error
from trajlake.settings import CommonSettings, load
from devkit.tiny_model import model_or_tiny

if TYPE_CHECKING:  # torch, Arrow and the lake load only when a command runs
    from store.lake import Lake
    from trainer.config import TrainConfig
    from trainer.dataset import DatasetRef
    from trainer.loop import StepLog
    from trainer.records import CheckpointRecord
    from trainer.train_metrics import TrainMetrics


class TrainSettings(CommonSettings):
    """Settings of ``trajlake train`` (TRAJLAKE_* variables; flags win)."""

    train_model: str | None = None
    """Base model folder (TRAJLAKE_TRAIN_MODEL); unset = the demo's tiny model."""
    train_out: str = "./checkpoints"
    """Checkpoint folder (TRAJLAKE_TRAIN_OUT)."""
    control_topic: str = "trajlake.control"
    """Topic of dataset.version / checkpoint.ready events (TRAJLAKE_CONTROL_TOPIC)."""
    follow_poll_s: float = 30.0
    """Registry poll interval of --follow, seconds (TRAJLAKE_FOLLOW_POLL_S)."""
    train_lease_s: float = 120.0
    """How long a version stays claimed by a trainer that stopped renewing (TRAJLAKE_TRAIN_LEASE_S)."""


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def train(
    dataset: str | None = typer.Option(None, help="NAME or NAME@VERSION to train (latest version when none); with --follow: only this dataset."),
    model: str | None = typer.Option(None, help="Base HF model folder (TRAJLAKE_TRAIN_MODEL; default: the tiny demo model)."),
    mode: str = typer.Option("pg", help="pg: clipped policy gradient; sft: NLL over positive rollouts."),
    deepspeed_config: Path | None = typer.Option(None, help="DeepSpeed JSON (ZeRO stage, bf16, accumulation, optimizer...)."),
    zero_stage: int | None = typer.Option(None, min=0, max=3, help="ZeRO stage (overrides the JSON; default 0)."),
    bf16: bool | None = typer.Option(None, "--bf16/--fp32", help="Mixed precision (overrides the JSON; default fp32)."),
    grad_accum: int | None = typer.Option(None, min=1, help="Micro-batches per optimizer step (overrides the JSON; default 1)."),
    micro_batch_tokens: int = typer.Option(4096, min=8, help="Padded tokens per micro-batch."),
    epochs: int = typer.Option(1, min=1, help="Passes over the dataset version."),
    lr: float = typer.Option(1e-5, min=0.0, help="AdamW learning rate."),
    kl_coef: float = typer.Option(0.0, min=0.0, help="KL-to-reference weight (0: no reference model)."),
    reference_model: str | None = typer.Option(None, help="Reference model folder for the KL (default: the base model)."),
    sft_min_reward: float = typer.Option(0.0, help="SFT trains on rollouts with reward above this."),
    save_every: int = typer.Option(50, min=1, help="Optimizer steps between restart points."),
    seed: int = typer.Option(0, help="Seed of the batch order."),
    out: str | None = typer.Option(None, help="Checkpoint folder (TRAJLAKE_TRAIN_OUT, default ./checkpoints)."),
    lake: str | None = LAKE_OPTION,
    follow_mode: bool = typer.Option(False, "--follow", help="Keep running: train each new dataset version once "
                                     "(announced on Kafka, --bootstrap-servers)."),
    bootstrap_servers: str | None = BOOTSTRAP_SERVERS_OPTION,
    no_kafka: bool = typer.Option(False, "--no-kafka", help="--follow by registry polling only."),
    poll_s: float | None = typer.Option(None, min=0.1, help="Registry poll interval of --follow (default 30 s)."),
    metrics_port: int | None = typer.Option(None, min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics, rank 0)."),
    retry: str | None = typer.Option(None, help="NAME@VERSION that failed (e.g. refused at validation): followers train it again."),
) -> None:
    """Train on a dataset version with DeepSpeed and record the checkpoint and its lineage."""
    from pipelines.lineage.openlineage import Lineage, open_lineage
    from trainer.config import TrainConfig, load_deepspeed_json
    from trainer.dataset import DatasetRef
    from trainer.train_metrics import serve_metrics

    s = load(TrainSettings, lake=lake, bootstrap_servers=bootstrap_servers, train_out=out, train_model=model,
             follow_poll_s=poll_s)
    if dataset is None and not follow_mode and retry is None:
        raise typer.BadParameter("give --dataset NAME[@VERSION], or --follow to train new versions as they come")
    err = Console(stderr=True)
    if retry is not None:
        _mark_retry(s.open_lake(), retry, err)
        if dataset is None and not follow_mode:
            return
    try:
        config = TrainConfig(
            model=model_or_tiny(s.train_model, home=s.home), out=s.train_out, mode=mode,
            deepspeed_config=load_deepspeed_json(deepspeed_config) if deepspeed_config else {},
            zero_stage=zero_stage, bf16=bf16, grad_accum=grad_accum, micro_batch_tokens=micro_batch_tokens,
            epochs=epochs, lr=lr, kl_coef=kl_coef, reference_model=reference_model,
            sft_min_reward=sft_min_reward, save_every=save_every, seed=seed,
        )  # fmt: skip
        ref = DatasetRef.parse(dataset) if dataset else None
    except (ValueError, TrainerError) as exc:  # options that cannot train: nothing was started
        raise SettingsInvalid(first_error(exc)) from None
    console = Console(quiet=not _is_main_rank())
    try:
        metrics = serve_metrics(s.open_lake(), port=metrics_port) if metrics_port and _is_main_rank() else None
    except OSError as exc:
        raise SettingsInvalid(f"metrics port {metrics_port}: {exc.strerror}") from None
    if follow_mode:
        _follow(s.open_lake(), config, s, ref, None if no_kafka else s.bootstrap_servers, console, metrics)
    else:
        with (open_lineage(s) if _is_main_rank() else Lineage(None)).active():  # rank 0 reports lineage
            _train_once(s.open_lake(), config, ref, timedelta(seconds=s.train_lease_s), console, metrics)


def _mark_retry(lake: Lake, spec: str, err: Console) -> None:
    """``--retry NAME@VERSION``: mark its failed runs so followers train it again."""
    from trainer.dataset import DatasetRef
    from trainer.records import request_retry

    ref = DatasetRef.parse(spec)
    if ref.version is None:
        raise InputError(f"--retry needs NAME@VERSION, got {spec!r} (e.g. {ref.name}@3)")
    runs = request_retry(lake, ref.name, ref.version)
    err.print(f"{ref.name}@{ref.version} marked for retry ({len(runs)} failed run(s)): "
              "a follower trains it at its next poll", highlight=False)  # fmt: skip


def _train_once(lake: Lake, config: TrainConfig, ref: DatasetRef, lease: timedelta, console: Console,
                metrics: TrainMetrics | None) -> None:
    from trainer.train_lineage import traced_train

    console.print(f"training [bold]{ref.name}@{ref.version if ref.version is not None else 'latest'}[/] "
                  f"from {escape(config.model)} ({config.mode})")  # fmt: skip
    with _progress(console) as (progress, on_step):
        record = traced_train(lake, ref.name, ref.version, config, lease=lease,
                              on_step=metrics.feeding(on_step) if metrics else on_step)
        progress.stop()
    console.print(checkpoint_summary(record))


def _follow(lake: Lake, config: TrainConfig, s: TrainSettings, ref: DatasetRef | None, kafka: str | None,
            console: Console, metrics: TrainMetrics | None) -> None:  # fmt: skip
    from pipelines.lineage.openlineage import Lineage, open_lineage
    from trainer.follow import follow

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    where = f"Kafka {kafka} + registry poll every {s.follow_poll_s:g} s" if kafka else f"registry poll every {s.follow_poll_s:g} s"
    console.print(f"following {ref.name if ref else 'all datasets'} ({where}); Ctrl-C stops after the current version",
                  highlight=False)  # fmt: skip
    with _progress(console) as (_, on_step), (open_lineage(s) if _is_main_rank() else Lineage(None)).active():
        follow(
            lake, config, stop_event=stop, bootstrap_servers=kafka, control_topic=s.control_topic,
            datasets=[ref.name] if ref else None, poll_interval_s=s.follow_poll_s,
            on_step=metrics.feeding(on_step) if metrics else on_step,
            lease=timedelta(seconds=s.train_lease_s),
            on_checkpoint=lambda rec: console.print(checkpoint_summary(rec)),
        )  # fmt: skip
    console.print("follower stopped")


class _progress:
    """A rich progress bar fed by ``StepLog``s (one task per training run)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(), console=console, disable=console.quiet,
        )  # fmt: skip
        self.task = None

    def on_step(self, entry: StepLog) -> None:
        if self.task is None or entry.step == 1 or self.progress.tasks[self.task].total != entry.total_steps:
            self.task = self.progress.add_task("steps", total=entry.total_steps, stats="")
        m = entry.metrics
        stats = f"loss {m['loss']:.4f}" + (f"  clip {m['clip_frac']:.2f}  ratio {m['ratio_mean']:.3f}" if "clip_frac" in m else "")
        self.progress.update(self.task, completed=entry.step, stats=f"{stats}  {entry.tokens_per_s:,.0f} tok/s")

    def __enter__(self):
        self.progress.__enter__()
        return self.progress, self.on_step

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)


def checkpoint_summary(rec: CheckpointRecord) -> Table:
    m = rec.metrics
    table = Table(show_header=False, box=None, padding=(0, 2), title=f"checkpoint {rec.checkpoint_id}")
    table.add_row("dataset", f"{rec.dataset}@{rec.dataset_version}  {rec.n_samples:,} samples  {rec.n_tokens:,} tokens")
    table.add_row("base", escape(rec.base_model) + (f"  (after {rec.parent_checkpoint_id})" if rec.parent_checkpoint_id else ""))
    table.add_row("loss", f"{m.get('first_loss', float('nan')):.4f} -> {m.get('final_loss', float('nan')):.4f}"
                  f"  eval {m.get('eval_loss', float('nan')):.4f}  clip {m.get('clip_frac', 0):.3f}")  # fmt: skip
    resumes = int(m.get("resumes", 0))
    table.add_row("speed", f"{m.get('tokens_per_s', 0):,.0f} tokens/s, {m.get('tokens', 0):,.0f} tokens over {rec.steps} "
                  f"steps, {rec.world_size} rank(s)" + (f", resumed {resumes} time(s)" if resumes else ""))  # fmt: skip
    table.add_row("hf export", escape(rec.hf_path))
    table.add_row("deepspeed", escape(rec.ds_path))
    return table


def checkpoints(
    dataset: str | None = typer.Option(None, help="Only this dataset's checkpoints."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line instead of a table."),
) -> None:
    """List trained checkpoints with their dataset version and final metrics, oldest first."""
    from trainer.records import list_checkpoints

    records = list_checkpoints(load(TrainSettings, lake=lake).open_lake(), dataset=dataset)
    console = Console()
    if as_json:
        for r in records:
            console.print_json(json.dumps(r.to_row() | {"created_at": r.created_at.isoformat()}), indent=None)
        return
    if not records:
        console.print("no checkpoints yet: run trajlake train --dataset NAME")
        return
    table = Table(Column("checkpoint", no_wrap=True), "dataset", "mode", "steps", "final loss", "eval loss",
                  "tokens/s", "created", Column("hf path", overflow="fold"))  # fmt: skip
    for r in records:
        m = r.metrics
        table.add_row(r.checkpoint_id, f"{r.dataset}@{r.dataset_version}", r.mode, str(r.steps),
                      f"{m.get('final_loss', float('nan')):.4f}", f"{m.get('eval_loss', float('nan')):.4f}",
                      f"{m.get('tokens_per_s', 0):,.0f}", r.created_at.strftime("%Y-%m-%d %H:%M"), escape(r.hf_path))  # fmt: skip
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.command()(checkpoints)
