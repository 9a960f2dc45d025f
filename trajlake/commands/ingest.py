"""``trajlake ingest`` (Kafka -> Delta, exactly once) and ``trajlake rebuild`` (typed tables from events)."""

from __future__ import annotations

import functools
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from schemas.errors import BrokerUnreachable, SettingsInvalid, TrajlakeError
from schemas.table_names import EVENTS_TABLE, QUARANTINE_TABLE
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, LAKE_OPTION
from trajlake.settings import CommonSettings, load

if TYPE_CHECKING:
    from ingest.ingester import IngestStats, OnProgress


@functools.cache
def ingest_settings() -> type[CommonSettings]:
    """The class ``IngestSettings`` (also an ``IngesterConfig``), built on first use: ``IngesterConfig`` is defined
    with the ingester (Kafka, Arrow, Delta), which the start-up of every command must not import."""
    from ingest.ingester import IngesterConfig

    class IngestSettings(CommonSettings, IngesterConfig):
        """Settings of ``trajlake ingest`` / ``rebuild``: ``IngesterConfig`` from TRAJLAKE_* variables; flags win."""

        redaction_rules: Path | None = None
        """JSON/TOML redaction rules applied to every event before it is written (TRAJLAKE_REDACTION_RULES)."""

    return IngestSettings


def __getattr__(name: str) -> Any:
    """``from trajlake.commands.ingest import IngestSettings`` builds the class (``ingest_settings``)."""
    if name == "IngestSettings":
        return ingest_settings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ingest(
    lake: str | None = LAKE_OPTION,
    bootstrap_servers: str | None = BOOTSTRAP_SERVERS_OPTION,
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
    from ingest import allocators

    allocators.configure()  # before Arrow and delta-rs load: they read their allocator settings once
    from rich.live import Live

    from ingest.ingest_metrics import serve_metrics
    from ingest.ingester import IngestStats, run_ingester
    from ingest.redaction import RedactionConfigError, load_redactor

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    s = load(ingest_settings(), lake=lake, bootstrap_servers=bootstrap_servers, topic=topic, group=group,
             batch_max_events=batch_max_events, batch_max_ms=batch_max_ms, dlq_topic=dlq_topic,
             redaction_rules=redaction_rules, partitions=_parse_partitions(partitions),
             stop_after_idle_s=stop_after_idle_s, recover=recover)
    try:
        config = s.model_copy(update={"redactor": load_redactor(s.redaction_rules)})
    except RedactionConfigError as exc:
        raise SettingsInvalid(f"ingester not started: {exc}") from None
    try:
        metrics = serve_metrics(config, port=metrics_port) if metrics_port else None
    except OSError as exc:
        raise SettingsInvalid(f"ingester not started: metrics port {metrics_port}: {exc.strerror}") from None
    console = Console()
    mode = f"partitions {partitions}" if partitions else f"group {s.group}"
    redacting = f", redaction rules {s.redaction_rules}" if config.redactor else ""
    console.print(f"ingesting [bold]{s.topic}[/] from {s.bootstrap_servers} ({mode}) into [bold]{s.open_lake().root}[/]"
                  + redacting)
    try:
        with Live(_summary(IngestStats()), console=console, refresh_per_second=2, transient=False) as live:
            show: OnProgress = lambda st: live.update(_summary(st))  # noqa: E731
            stats = run_ingester(config, stop, on_progress=metrics.feeding(show) if metrics else show)
            live.update(_summary(stats))
    except BrokerUnreachable:
        if not stop.is_set():
            raise
        # asked to stop while still looking for a broker: nothing was read, a clean stop
        console.print("[green]stopped[/] before a broker answered: nothing consumed")
        return
    except TrajlakeError:
        raise
    except OSError as exc:  # the lake's object store or disk failed mid-run (e.g. a read timed out while frozen)
        from store.storage import StoreUnreachable

        raise StoreUnreachable(
            f"the lake's storage failed while ingesting: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            hint="nothing is lost: start the ingester again (a supervisor does) and it re-reads every uncommitted "
                 "message from the lake's markers") from None
    console.print("[green]stopped[/]: every consumed message is committed")


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
    typed = "  ".join(f"{name} {n:,}" for name, n in sorted(st.rows.items()) if name not in (EVENTS_TABLE, QUARANTINE_TABLE))
    table.add_row("typed", typed or "-")
    table.add_row("batches", f"{st.batches:,} committed  partitions {list(st.partitions)}  re-seeks {st.assignments + st.conflicts}")
    return table


def rebuild(
    lake: str | None = LAKE_OPTION,
    group: str | None = typer.Option(None, help="Ingest group whose markers the typed tables take over (default trajlake-ingest)."),
) -> None:
    """Re-derive the typed tables from the events table (one Delta version each). Stop the ingesters first."""
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from store.rebuild import rebuild_typed_tables

    s = load(ingest_settings(), lake=lake, group=group)
    console = Console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True) as progress:
        task = progress.add_task("reading events", total=None)
        counts = rebuild_typed_tables(
            s.open_lake(), group=s.group,
            progress=lambda name, rows: progress.update(task, description=f"{name}: {rows:,} rows"),
        )
    table = Table("table", "rows", title="rebuilt from events")
    for name, n in counts.items():
        table.add_row(name, f"{n:,}")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command()(rebuild)
