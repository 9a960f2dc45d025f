"""``trajlake demo``: the whole system end to end on the embedded default."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table


def demo(
    workdir: Path = typer.Option(Path("./demo"), help="Folder for the demo's lake, spool and checkpoints (wiped first)."),
    agent_tasks: int = typer.Option(6, min=1, max=100, help="Tasks the toy agent attempts."),
    rollouts_per_task: int = typer.Option(4, min=2, max=16, help="Rollouts per task (a GRPO group)."),
    workload_tasks: int = typer.Option(12, min=1, max=1000, help="Tasks of the synthetic workload batch."),
) -> None:
    """Broker, SDK, gateway, serve-model, ingester, SQL, dataset, DeepSpeed training and lineage, in one run."""
    from transformers.utils import logging as hf_logging

    from trajlake.demo import DemoConfig, run_demo

    hf_logging.disable_progress_bar()

    console = Console()
    config = DemoConfig(workdir=workdir, agent_tasks=agent_tasks, agent_rollouts_per_task=rollouts_per_task,
                        workload_tasks=workload_tasks)
    started = time.monotonic()
    with console.status("starting the embedded broker") as status:
        for title, result in run_demo(config):
            status.stop()
            console.rule(f"[bold]{title}[/]", align="left")
            show(console, result)
            status.start()
            status.update(f"working after: {title}")
    console.print(f"[green]demo finished[/] in {time.monotonic() - started:.0f} s; lake at {workdir / 'lake'}")
    console.print(f"try: trajlake sql --lake {workdir / 'lake'} \"SELECT * FROM rollouts LIMIT 5\"")


def show(console: Console, result: Any) -> None:
    """Render one demo stage with the same views the individual commands use."""
    import pyarrow as pa

    from pipelines import BuildResult, Lineage
    from pipelines.workbench.compare import Comparison
    from schemas.tables import dataset_table
    from trainer.records import CheckpointRecord
    from trajlake.commands.datasets import render_manifest
    from trajlake.commands.lineage import render as render_lineage
    from trajlake.commands.scheduler import render_runs
    from store.sql_rows import rows_from_arrow
    from trajlake.commands.sql import print_table
    from trajlake.commands.train import checkpoint_summary
    from trajlake.commands.workbench import render_comparison

    if isinstance(result, BuildResult):
        console.print(f"{dataset_table(result.dataset)} version {result.version} (content {result.content_hash[:12]}); "
                      f"dataset.version published: {result.published}")
        render_manifest(console, result.manifest)
    elif isinstance(result, CheckpointRecord):
        console.print(checkpoint_summary(result))
    elif isinstance(result, Lineage):
        console.print(render_lineage(result, limit=5))
    elif isinstance(result, Comparison):
        render_comparison(console, result)
    elif isinstance(result, list):
        render_runs(console, result, title="runs of this pass")
    elif isinstance(result, dict) and result and all(isinstance(v, pa.Table) for v in result.values()):
        for question, answer in result.items():
            console.print(f"[bold]{question}[/]")
            print_table(rows_from_arrow(answer))
    else:
        table = Table(show_header=False, box=None)
        for key, value in dict(result).items():
            table.add_row(f"[bold]{key}[/]", str(value))
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(demo)
