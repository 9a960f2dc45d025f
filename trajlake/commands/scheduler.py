"""``trajlake scheduler`` (nightly build + train, retention, compaction) and ``trajlake runs``.

The jobs are composed here from the packages' public APIs; ``store.scheduler``
runs each job once per cron window and records every attempt in ``runs``.

- ``nightly`` (TRAJLAKE_SCHEDULER_CRON, 02:00 UTC): build ``datasets/<name>``
  from the rollouts that started in the window shifted back by
  TRAJLAKE_SCHEDULER_LAG_H (by default: the previous UTC day), then train it (starting
  from the dataset's latest checkpoint when there is one). A retry reuses a
  version already built for the window. A window without trainable rollouts
  succeeds with ``skipped``.
- ``retention`` (TRAJLAKE_RETENTION_CRON): ``trajlake retention apply``, when a
  policy is configured.
- ``compact`` (TRAJLAKE_COMPACT_CRON, every 5 minutes): ``trajlake compact`` without its vacuum: the small files
  written since the last run, and the pre-joined tables' touched rollouts, so that the lake the ingester leaves
  reads like a compacted one with a short tail (its cost follows the tail: README, "SQL at scale").
- ``vacuum`` (TRAJLAKE_COMPACT_VACUUM_CRON, 04:00 UTC): deletes the files compaction removed more than
  TRAJLAKE_COMPACT_VACUUM_HOURS ago; only with the compact job.

An empty cron expression turns a job off.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import typer
from pydantic import Field
from rich import box
from rich.console import Console
from rich.table import Table

from schemas.errors import SettingsInvalid, TrajlakeError
from trajlake.commands.ops import OpsSettings
from trajlake.options import LAKE_OPTION, TIME_HELP, parse_time
from trajlake.settings import load
from devkit.tiny_model import model_or_tiny

if TYPE_CHECKING:
    from store.lake import Lake
    from store.runs import RunRecord
    from store.scheduler import Job


class SchedulerSettings(OpsSettings):
    """Settings of ``trajlake scheduler`` (TRAJLAKE_* variables; flags win)."""

    scheduler_cron: str = "0 2 * * *"
    """Nightly build + train, UTC cron (TRAJLAKE_SCHEDULER_CRON); empty: off."""
    scheduler_dataset: str = "nightly"
    """Dataset the nightly job builds (TRAJLAKE_SCHEDULER_DATASET)."""
    scheduler_train: bool = True
    """Train after the nightly build (TRAJLAKE_SCHEDULER_TRAIN)."""
    scheduler_lag_h: float = Field(default=2.0, ge=0)
    """The build takes rollouts that started in the window shifted back this many hours, so rollouts still
    running at the fire time finish first (TRAJLAKE_SCHEDULER_LAG_H; 02:00 cron + 2 h = the previous UTC day)."""
    retention_cron: str = "30 3 * * *"
    """Retention job, UTC cron (TRAJLAKE_RETENTION_CRON); runs only with a retention policy."""
    compact_cron: str = "*/5 * * * *"
    """Incremental compaction job, UTC cron (TRAJLAKE_COMPACT_CRON); empty: off (with its vacuum). Every 5 minutes:
    on the 1M-call bench lake a run after 100 ingest commits took seconds (README, "SQL at scale")."""
    compact_vacuum_cron: str = "0 4 * * *"
    """Vacuum of the files compaction removed, UTC cron (TRAJLAKE_COMPACT_VACUUM_CRON); empty: off."""
    scheduler_max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts per window before a run gives up (TRAJLAKE_SCHEDULER_MAX_ATTEMPTS)."""
    scheduler_backoff_s: float = Field(default=300.0, ge=0)
    """Seconds before the first retry; doubles per attempt (TRAJLAKE_SCHEDULER_BACKOFF_S)."""
    scheduler_lease_s: float = Field(default=600.0, ge=3)
    """A run's lease, renewed every third of it; another instance takes over after it lapses (TRAJLAKE_SCHEDULER_LEASE_S)."""
    scheduler_poll_s: float = Field(default=60.0, gt=0)
    """How often an idle scheduler re-checks for due windows and lapsed leases (TRAJLAKE_SCHEDULER_POLL_S)."""
    train_model: str | None = None
    """Base model folder (TRAJLAKE_TRAIN_MODEL, as for trajlake train); unset: the tiny demo model."""
    train_out: str = "./checkpoints"
    """Checkpoint folder (TRAJLAKE_TRAIN_OUT, as for trajlake train)."""


def build_jobs(lake: Lake, settings: SchedulerSettings) -> list[Job]:
    """The configured jobs (those with a cron expression)."""
    from pipelines.lineage.openlineage import open_lineage
    from store.compact import compact, vacuum
    from store.retention import apply_retention
    from store.scheduler import Job
    from trainer.nightly import NightlyConfig, nightly_job

    options = {"max_attempts": settings.scheduler_max_attempts, "backoff": timedelta(seconds=settings.scheduler_backoff_s)}
    jobs = []
    lineage = open_lineage(settings)  # LineageConfigError (a ValueError) for unusable transport settings
    if settings.scheduler_cron:
        nightly = NightlyConfig(
            dataset=settings.scheduler_dataset, lag=timedelta(hours=settings.scheduler_lag_h),
            train=settings.scheduler_train, train_out=settings.train_out,
            base_model=lambda: model_or_tiny(settings.train_model, home=settings.home),
        )
        jobs.append(Job("nightly", settings.scheduler_cron, run=lineage.scheduled("nightly", nightly_job(lake, nightly)),
                        **options))
    policy = settings.policy()
    if settings.retention_cron and policy.days:
        jobs.append(Job("retention", settings.retention_cron, run=lambda w: {
            "rollouts_forgotten": sum(len(r.rollouts) for r in apply_retention(lake, policy))}, **options))
    if settings.compact_cron:
        jobs.append(Job("compact", settings.compact_cron, run=lambda w: {
            "files_removed": sum(r.files_removed for r in compact(lake, vacuum_retention=None))}, **options))
    if settings.compact_cron and settings.compact_vacuum_cron:
        retention = timedelta(hours=settings.compact_vacuum_hours)
        jobs.append(Job("vacuum", settings.compact_vacuum_cron, run=lambda w: {
            "files_vacuumed": sum(vacuum(lake, retention=retention).values())}, **options))
    return jobs


def scheduler_command(
    once: bool = typer.Option(False, "--once", help="Run the due windows once and exit (for cron / CI): exit 1 when "
                              "a window failed or gave up."),
    backfill: str | None = typer.Option(None, help=f"Also run every missed window since this time ({TIME_HELP})."),
    job: list[str] = typer.Option([], help="Only these jobs (repeatable): nightly, retention, compact, vacuum."),
    lake: str | None = LAKE_OPTION,
    metrics_port: int | None = typer.Option(None, min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics)."),
) -> None:
    """Run jobs on their cron windows, each window once across restarts and scheduler instances.

    SIGTERM or Ctrl-C: no new window starts, a run waiting for its retry stops waiting (a later pass or another
    instance retries it), a running job finishes first; then the scheduler exits 0.
    """
    from store.runs import RunStatus
    from store.scheduler import Scheduler
    from store.scheduler_metrics import serve_metrics as serve_scheduler_metrics

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = load(SchedulerSettings, lake=lake)
    since = parse_time(backfill, "--backfill") if backfill else None
    store = settings.open_lake()
    try:
        jobs = [j for j in build_jobs(store, settings) if not job or j.name in job]
    except ValueError as exc:  # a cron expression that does not parse
        raise SettingsInvalid(str(exc)) from None
    if not jobs:
        raise SettingsInvalid(f"no job to run (asked for {job or 'all'}; a job with an empty cron expression is off)")
    scheduler = Scheduler(store, jobs, owner=f"{socket.gethostname()}-{threading.get_native_id()}",
                          lease=timedelta(seconds=settings.scheduler_lease_s), sleep=stop.wait)
    if metrics_port:
        try:
            serve_scheduler_metrics(store, jobs=[j.name for j in jobs], port=metrics_port)
        except OSError as exc:
            raise SettingsInvalid(f"metrics port {metrics_port}: {exc.strerror}") from None
    console = Console()
    if once or since:
        finished = scheduler.run_pending(backfill_from=since, stop=stop)
        render_runs(console, finished, title="runs finished by this pass")
        unfinished = [r for r in finished if r.status is not RunStatus.SUCCEEDED]
        if unfinished and not stop.is_set() or any(r.status is RunStatus.GAVE_UP for r in unfinished):
            raise TrajlakeError(f"{len(unfinished)} window(s) did not succeed: " + ", ".join(
                f"{r.job} {r.window_key} {r.status}" for r in unfinished) + " (details: trajlake runs --history)")
        if once or stop.is_set():
            return
    console.print(f"scheduler {scheduler.owner} running " + ", ".join(f"{j.name} ({j.cron})" for j in jobs))
    scheduler.serve(stop, poll=timedelta(seconds=settings.scheduler_poll_s))
    console.print("scheduler stopped")


def runs_command(
    job: str | None = typer.Option(None, help="Only this job."),
    limit: int = typer.Option(30, min=1, help="Newest windows to show."),
    history: bool = typer.Option(False, "--history", help="Every recorded state change, not just each window's latest."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
    lake: str | None = LAKE_OPTION,
) -> None:
    """List scheduled runs: window, status, attempts, dataset version, checkpoint, error."""
    from store.runs import RunsTable

    settings = load(SchedulerSettings, lake=lake)
    runs = RunsTable(settings.open_lake())
    records = runs.history() if history else list(runs.current().values())
    records = sorted((r for r in records if job is None or r.job == job), key=lambda r: (r.window_end, r.recorded_at))
    records = records[-limit:][::-1]
    if as_json:
        for r in records:
            print(json.dumps(r.to_row(), default=str, sort_keys=True))
        return
    render_runs(Console(), records, title="scheduled runs (newest first)")


def render_runs(console: Console, records: list[RunRecord], *, title: str) -> None:
    if not records:
        console.print("no runs")
        return
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for name, width in (("job", 7), ("window end", 16), ("status", 9), ("try", 3), ("dataset", 7), ("checkpoint", 10)):
        table.add_column(name, no_wrap=True, min_width=width)
    table.add_column("error / note", no_wrap=True, overflow="ellipsis", max_width=40)
    style = {"succeeded": "green", "failed": "yellow", "gave_up": "red", "running": "cyan"}
    for r in records:
        table.add_row(
            r.job, _clock(r.window_end), f"[{style[r.status]}]{r.status}[/]", str(r.attempt),
            "" if r.dataset_version is None else str(r.dataset_version), r.checkpoint or "",
            (r.error or r.results.get("skipped") or "").partition("\n")[0][:200],
        )
    console.print(table)


def _clock(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def register(app: typer.Typer) -> None:
    app.command("scheduler")(scheduler_command)
    app.command("runs")(runs_command)
