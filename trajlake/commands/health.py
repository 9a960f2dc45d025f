"""``trajlake health``: can this process read the lake (and reach Kafka)? For container health checks."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text

from schemas.errors import TrajlakeError
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, LAKE_OPTION, TOPIC_OPTION
from trajlake.settings import CommonSettings, load

def health(
    lake: str | None = LAKE_OPTION,
    broker: bool = typer.Option(False, "--broker", help="Also check that Kafka answers and the events topic exists."),
    bootstrap_servers: str | None = BOOTSTRAP_SERVERS_OPTION,
    topic: str | None = TOPIC_OPTION,
) -> None:
    """Check that the lake can be listed (and, with --broker, that Kafka answers): exit 0 healthy, 1 not.

    Cheap enough for a container health check every few seconds: it lists the lake's tables, reads no data.
    """
    from store.health import LakeUnreachable, check_lake

    settings = load(CommonSettings, lake=lake, bootstrap_servers=bootstrap_servers, topic=topic)
    try:
        tables = check_lake(settings.open_lake())
    except LakeUnreachable as exc:
        raise TrajlakeError(f"unhealthy: lake {exc}") from None
    report = f"lake {settings.lake} readable ({len(tables)} tables)"
    if broker:
        from kafka.errors import KafkaError

        from ingest.broker_probe import probe_broker
        from ingest.topics import topic_partitions

        try:
            probe_broker(settings.bootstrap_servers)
            partitions = topic_partitions(settings.bootstrap_servers, settings.topic)
        except (OSError, KafkaError) as exc:
            raise TrajlakeError(f"unhealthy: Kafka at {settings.bootstrap_servers} does not answer ({exc})") from None
        if partitions is None:
            raise TrajlakeError(f"unhealthy: topic {settings.topic} does not exist on {settings.bootstrap_servers}; "
                            "create it (docker compose: kafka-init; embedded: trajlake broker)")
        report += f"; Kafka {settings.bootstrap_servers} topic {settings.topic} ({partitions} partitions)"
    Console(soft_wrap=True).print(Text("healthy: " + report))


def register(app: typer.Typer) -> None:
    app.command()(health)
