"""Loopback ports for the embedded services (broker, gateway, engine, query API) and the tests."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens on ``port``. Connections of a killed broker lingering in TIME_WAIT do not count:
    tansu binds with SO_REUSEADDR, so a restart on the same port works while they linger."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_port(host: str, port: int, *, timeout_s: float) -> None:
    """Block until ``host:port`` accepts a TCP connection."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing accepted connections on {host}:{port} within {timeout_s:.0f} s")
            time.sleep(0.02)
