"""``trajlake broker``: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import signal
import threading

import typer
from rich.console import Console

from ingest.broker import EmbeddedBroker
from schemas.events import DEFAULT_TOPIC


def broker(
    port: int = typer.Option(9092, min=1, max=65535, help="Loopback port to listen on."),
    topic: str = typer.Option(DEFAULT_TOPIC, help="Topic to create at start."),
    partitions: int = typer.Option(4, min=1, max=1024, help="Partitions of that topic."),
) -> None:
    """Start the embedded broker (tansu) on 127.0.0.1 until Ctrl-C or SIGTERM."""
    console = Console()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=port) as b:
        n = b.create_topic(topic, partitions=partitions)
        console.print(f"[green]broker ready[/] on [bold]{b.bootstrap_servers}[/]; topic {topic} ({n} partitions)")
        console.print("export TRAJLAKE_BOOTSTRAP_SERVERS=" + b.bootstrap_servers)
        try:
            while not stop.wait(0.5) and b.running:
                pass
        except KeyboardInterrupt:
            pass
        b.stop()
    console.print("broker stopped")


def register(app: typer.Typer) -> None:
    app.command()(broker)
