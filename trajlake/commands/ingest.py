"""``trajlake ingest`` (Kafka -> Delta, exactly once) and ``trajlake rebuild`` (typed tables from events)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text

from schemas.versions import MAX_EVENT_BYTES
from trajlake.options import LAKE_OPTION
from trajlake.settings import CommonSettings

if TYPE_CHECKING:
    from ingest.ingester import IngestStats


class IngestSettings(CommonSettings):
    """Settings of ``trajlake ingest`` / ``rebuild`` (TRAJLAKE_* variables; flags win)."""

    group: str = "trajlake-ingest"
    """Consumer group; names the Delta transaction markers too (TRAJLAKE_GROUP)."""
    dlq_topic: str | None = None
    """Dead-letter topic (TRAJLAKE_DLQ_TOPIC); unset = <topic>.dlq, empty = none."""
    batch_max_events: int = 20_000
    batch_max_bytes: int = 64 * 1024 * 1024
    batch_max_ms: int = 2_000
    max_event_bytes: int = MAX_EVENT_BYTES
    dedupe_max_ids: int = 1_000_000
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 2_000
    bootstrap_timeout_ms: int = 30_000
    """How long to look for a broker at start (TRAJLAKE_BOOTSTRAP_TIMEOUT_MS)."""
    redaction_rules: Path | None = None
    """JSON/TOML redaction rules applied to every event before it is written (TRAJLAKE_REDACTION_RULES)."""


def _settings(**flags: object) -> IngestSettings:
    return IngestSettings(**{k: v for k, v in flags.items() if v is not None})


def ingest(
    lake: str | None = LAKE_OPTION,
    bootstrap_servers: str | None = typer.Option(None, help="Kafka bootstrap servers (TRAJLAKE_BOOTSTRAP_SERVERS)."),
    topic: str | None = typer.Option(None, help="Events topic (TRAJLAKE_TOPIC, default trajlake.events)."),
    group: str | None = typer.Option(None, help="Consumer group (default trajlake-ingest)."),
    batch_max_events: int | None = typer.Option(None, min=1, help="Commit after this many messages (default 20000)."),
    batch_max_ms: int | None = typer.Option(None, min=1, help="Commit a batch at least this often, in ms (default 2000)."),
    dlq_topic: str | None = typer.Option(None, help='Dead-letter topic (default <topic>.dlq; "" for none).'),
    partitions: str | None = typer.Option(None, help="Static assignment without a group, e.g. 0,1 (default: join the group)."),
    stop_after_idle_s: float | None = typer.Option(None, min=0.1, help="Exit once nothing arrived for this many seconds."),
    redaction_rules: Path | None = typer.Option(None, help="Redaction rules file (.json/.toml)."),
    metrics_port: int | None = typer.Option(None, min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics)."),
    recover: bool = typer.Option(False, "--recover", help="Re-read partitions whose log went backwards from their "
                                 "earliest offset; write only events the lake does not hold yet (checked against the "
                                 "tables, so slower: run until caught up, then restart without it)."),
) -> None:
    """Consume trajectory events and append them to the lake's Delta tables, exactly once.

    Exit codes: 0 stopped cleanly (SIGTERM/SIGINT at any point, or --stop-after-idle-s); 1 stopped on an
    error (broker unreachable, lake write failed); 2 bad options or redaction rules; 3 the log went
    backwards (broker restarted with memory storage, topic recreated): nothing was skipped, rerun with --recover.
    """
    from ingest.consumer import BrokerUnreachable
    from ingest.ingest_metrics import serve_metrics
    from ingest.ingester import IngesterConfig, IngestStats, OnProgress, run_ingester
    from ingest.log_check import LogWentBackwards
    from ingest.redaction import RedactionConfigError, load_redactor
    from store.lake import Lake

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    s = _settings(lake=lake, bootstrap_servers=bootstrap_servers, topic=topic, group=group,
                  batch_max_events=batch_max_events, batch_max_ms=batch_max_ms, dlq_topic=dlq_topic,
                  redaction_rules=redaction_rules)
    try:
        redactor = load_redactor(s.redaction_rules)
    except RedactionConfigError as exc:
        Console(stderr=True).print(f"[bold red]ingester not started:[/] {exc}")
        raise typer.Exit(code=2) from None
    config = IngesterConfig(
        lake=s.lake, bootstrap_servers=s.bootstrap_servers, topic=s.topic, group=s.group,
        partitions=_parse_partitions(partitions), dlq_topic=s.dlq_topic, batch_max_events=s.batch_max_events,
        batch_max_bytes=s.batch_max_bytes, batch_max_ms=s.batch_max_ms, max_event_bytes=s.max_event_bytes,
        dedupe_max_ids=s.dedupe_max_ids, session_timeout_ms=s.session_timeout_ms,
        heartbeat_interval_ms=s.heartbeat_interval_ms, bootstrap_timeout_ms=s.bootstrap_timeout_ms,
        stop_after_idle_s=stop_after_idle_s, redactor=redactor, recover=recover,
    )
    try:
        metrics = serve_metrics(config, port=metrics_port) if metrics_port else None
    except OSError as exc:
        Console(stderr=True).print(f"[bold red]ingester not started:[/] metrics port {metrics_port}: {exc.strerror}")
        raise typer.Exit(code=2) from None
    console = Console()
    mode = f"partitions {partitions}" if partitions else f"group {s.group}"
    redacting = f", redaction rules {s.redaction_rules}" if redactor else ""
    console.print(f"ingesting [bold]{s.topic}[/] from {s.bootstrap_servers} ({mode}) into [bold]{Lake(s.lake).root}[/]"
                  + redacting)
    try:
        with Live(_summary(IngestStats()), console=console, refresh_per_second=2, transient=False) as live:
            show: OnProgress = lambda st: live.update(_summary(st))  # noqa: E731
            stats = run_ingester(config, stop, on_progress=metrics.feeding(show) if metrics else show)
            live.update(_summary(stats))
    except BrokerUnreachable as exc:
        if stop.is_set():  # asked to stop while still looking for a broker: nothing was read, a clean stop
            console.print("[green]stopped[/] before a broker answered: nothing consumed")
            return
        _fail(exc, code=1)
    except LogWentBackwards as exc:
        _fail(exc, code=3)
    except Exception as exc:  # noqa: BLE001 - one line for the user, the traceback at DEBUG
        logging.getLogger(__name__).debug("ingester failed", exc_info=True)
        _fail(f"{type(exc).__name__}: {exc}. Nothing consumed since the last commit is lost; restart the "
              "ingester (it resumes from the lake's markers)", code=1)
    console.print("[green]stopped[/]: every consumed message is committed")


def _fail(message: object, *, code: int) -> None:
    Console(stderr=True).print(Text.assemble(("error: ", "bold red"), str(message)), soft_wrap=True)
    raise typer.Exit(code=code)


def _parse_partitions(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        parts = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give partition numbers separated by commas, e.g. 0,1", param_hint="--partitions") from None
    if not parts or min(parts) < 0:
        raise typer.BadParameter(f"{text!r}: give at least one partition number >= 0", param_hint="--partitions")
    return parts


def _summary(st: IngestStats) -> Table:
    rate = st.consumed / st.elapsed_s if st.elapsed_s > 0 else 0.0
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("consumed", f"{st.consumed:,} msgs  {st.bytes / 1e6:,.1f} MB  ({rate:,.0f} msg/s)")
    table.add_row("stored", f"{st.events:,} events  {st.duplicates:,} duplicates dropped  {st.quarantined:,} quarantined"
                  f"  {st.replayed:,} replayed (at or below a marker, verified)")
    if st.key_mismatches:
        table.add_row("keys", f"{st.key_mismatches:,} events stored whose Kafka key is not their rollout_id")
    if st.recovered_partitions:
        table.add_row("recovered", f"partitions {list(st.recovered_partitions)} re-read from their earliest offset")
    typed = "  ".join(f"{name} {n:,}" for name, n in sorted(st.rows.items()) if name not in ("events", "quarantine"))
    table.add_row("typed", typed or "-")
    table.add_row("batches", f"{st.batches:,} committed  partitions {list(st.partitions)}  re-seeks {st.assignments + st.conflicts}")
    return table


def rebuild(
    lake: str | None = LAKE_OPTION,
    group: str | None = typer.Option(None, help="Ingest group whose markers the typed tables take over (default trajlake-ingest)."),
) -> None:
    """Re-derive the typed tables from the events table (one Delta version each). Stop the ingesters first."""
    from store.lake import Lake, TableMissing
    from store.rebuild import RebuildRaced, rebuild_typed_tables

    s = _settings(lake=lake, group=group)
    console = Console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True) as progress:
        task = progress.add_task("reading events", total=None)
        try:
            counts = rebuild_typed_tables(
                Lake(s.lake), group=s.group,
                progress=lambda name, rows: progress.update(task, description=f"{name}: {rows:,} rows"),
            )
        except (TableMissing, RebuildRaced) as exc:
            progress.stop()
            Console(stderr=True).print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(code=1) from None
    table = Table("table", "rows", title="rebuilt from events")
    for name, n in counts.items():
        table.add_row(name, f"{n:,}")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command()(rebuild)
