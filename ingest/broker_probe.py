"""A fast reachability check of the Kafka bootstrap servers, before a client that retries for ~30 s."""

from __future__ import annotations

import socket

from schemas.errors import BrokerUnreachable


def probe_broker(bootstrap_servers: str, timeout_s: float = 3.0) -> None:
    """Raise ``BrokerUnreachable`` (an ``OSError``) fast when no bootstrap server accepts a TCP connection
    (kafka-python retries ~30 s)."""
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
            return
        except (OSError, ValueError):
            continue
    raise BrokerUnreachable(bootstrap_servers)
