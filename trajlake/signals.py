"""Clean stops: a service that SIGTERM or Ctrl-C stops exits 0, whenever the signal comes."""

from __future__ import annotations

import signal
from types import FrameType

SERVICES = frozenset({"ingest", "gateway", "query-api", "serve-model"})
"""Commands for which SIGTERM or Ctrl-C during start-up (seconds of imports, a model loading) is a clean stop,
exit 0: ``trajlake.cli.main`` calls ``exit_cleanly_on_stop_signals`` before it parses anything; each service
then keeps that handler, or installs its own stop handler first thing once it runs."""


def runs_until_stopped(argv: list[str]) -> bool:
    """Whether ``trajlake ARGV...`` is a long-running process (a service, the scheduler's loop, a training
    follower): SIGTERM during its start-up is a clean stop too."""
    command = argv[1] if len(argv) > 1 else None
    return (command in SERVICES or (command == "scheduler" and "--once" not in argv)
            or (command == "train" and "--follow" in argv))


def exit_cleanly_on_stop_signals() -> None:
    """SIGTERM and SIGINT raise ``SystemExit(0)`` in the main thread from now on.

    uvicorn takes both signals over while it serves, shuts down gracefully
    (lifespan shutdown: the gateway closes its emitter, unsent events stay in
    its spool), then raises the signal again: it lands here and the process
    exits 0 instead of dying by the signal (-15) or printing "Aborted!" (1).
    Before the server runs (e.g. while a model loads), the same handler stops
    the start at once.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_0)


def _exit_0(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
