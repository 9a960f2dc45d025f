"""``trajlake broker``: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import signal
import threading

import typer
from rich.console import Console

from devkit.broker import EmbeddedBroker
from schemas.errors import TrajlakeError
from schemas.options import DEFAULT_TOPIC
from trajlake.settings import CommonSettings, load

MEMORY = "memory://tansu/"


class BrokerSettings(CommonSettings):
    """Settings of ``trajlake broker`` (TRAJLAKE_* variables; flags win)."""

    broker_storage: str = MEMORY
    """Where the broker keeps its log (TRAJLAKE_BROKER_STORAGE): memory:// (lost when it stops) or s3://BUCKET/."""
    broker_cluster_id: str = "trajlake"
    """Cluster id (TRAJLAKE_BROKER_CLUSTER_ID); a restart on the same s3:// storage must reuse it."""


def broker(
    port: int = typer.Option(9092, min=1, max=65535, help="Loopback port to listen on."),
    topic: str = typer.Option(DEFAULT_TOPIC, help="Topic to create at start (kept when it exists)."),
    partitions: int = typer.Option(4, min=1, max=1024, help="Partitions of that topic."),
    storage: str | None = typer.Option(
        None, help="Where the log lives (TRAJLAKE_BROKER_STORAGE). Default memory://: everything is lost when the "
        "broker stops. s3://BUCKET/ keeps it in the object store of the AWS_* settings (the lake's), so a "
        "restart with the same --cluster-id finds every message at its offset."),
    cluster_id: str | None = typer.Option(None, help="Cluster id (TRAJLAKE_BROKER_CLUSTER_ID, default trajlake)."),
) -> None:
    """Start the embedded broker (tansu) on 127.0.0.1 until Ctrl-C or SIGTERM.

    For development and tests: by default it keeps everything in memory, so a restart starts every topic empty
    at offset 0. Use --storage s3://BUCKET/ for a log that survives restarts; production runs Apache Kafka.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = load(BrokerSettings, broker_storage=storage, broker_cluster_id=cluster_id)
    console = Console()
    b = EmbeddedBroker(port=port, storage_url=settings.broker_storage, cluster_id=settings.broker_cluster_id)
    try:
        b.start()
        n = b.create_topic(topic, partitions=partitions)
    except BaseException:
        b.kill()  # no tansu process outlives the command
        raise
    kept = "kept in " + settings.broker_storage if settings.broker_storage != MEMORY else "in memory: lost when it stops"
    console.print(f"[green]broker ready[/] on [bold]{b.bootstrap_servers}[/]; topic {topic} ({n} partitions); "
                  f"log {kept}", soft_wrap=True)
    console.print("export TRAJLAKE_BOOTSTRAP_SERVERS=" + b.bootstrap_servers, soft_wrap=True)
    while not stop.wait(0.5) and b.running:
        pass
    if not stop.is_set():
        raise TrajlakeError("the broker process (tansu) exited on its own; start it again")
    b.stop()
    console.print("broker stopped")


def register(app: typer.Typer) -> None:
    app.command()(broker)
