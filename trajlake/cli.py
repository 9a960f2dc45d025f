"""The ``trajlake`` command: a thin shell over the packages.

Every module in ``trajlake.commands`` exposes ``register(app)``; each command
parses its options, builds settings, calls one function and renders the result.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import signal
import sys

import typer

import trajlake.commands


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="trajlake",
        help="Trajectory lake for LLM agents: capture, ingest, query, build datasets, train.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    @app.callback()
    def _root() -> None:
        """Trajectory lake for LLM agents."""

    for info in sorted(pkgutil.iter_modules(trajlake.commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"trajlake.commands.{info.name}").register(app)
    return app


STOPPABLE_WHILE_STARTING = frozenset({"ingest"})
"""Services for which SIGTERM during start-up (seconds of imports) is a clean stop, exit 0; each installs
its own stop handler first thing once it runs."""


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in STOPPABLE_WHILE_STARTING:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.basicConfig(
        level=os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    build_app()()


if __name__ == "__main__":
    main()
