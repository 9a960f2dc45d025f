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
from trajlake.options import EXIT_CODES

OWN_PACKAGES = ("schemas", "store", "ingest", "pipelines", "trainer", "serve", "api", "devkit", "trajlake")
LOUD_LIBRARIES = ("DeepSpeed", "torch", "transformers", "urllib3", "filelock")
"""Libraries that set their own logger level (DeepSpeed logs at INFO with its own handler): WARNING unless DEBUG."""
"""Loggers at TRAJLAKE_LOG_LEVEL; every other library logs WARNING and up only, unless the level is DEBUG."""
SILENT_LIBRARIES = ("kafka",)
"""Libraries whose errors our code reports in its own words (kafka-python logs every reconnect attempt as
an ERROR; the gateway spools and the ingester stops with one clear line): quiet unless DEBUG."""


def configure_logging(level_name: str) -> None:
    """Our loggers at ``level_name``; libraries at WARNING (``SILENT_LIBRARIES``: CRITICAL) unless DEBUG."""
    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        raise ValueError(f"TRAJLAKE_LOG_LEVEL={level_name!r}: use DEBUG, INFO, WARNING or ERROR")
    debug = level <= logging.DEBUG
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger().setLevel(level if debug else max(level, logging.WARNING))
    for name in OWN_PACKAGES:
        logging.getLogger(name).setLevel(level)
    for name in LOUD_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
    for name in SILENT_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.CRITICAL)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="trajlake",
        help="Trajectory lake for LLM agents: capture, ingest, query, build datasets, train.",
        epilog=EXIT_CODES,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(
        debug: bool = typer.Option(False, "--debug", help="Log everything at DEBUG, libraries included "
                                   "(same as TRAJLAKE_LOG_LEVEL=DEBUG)."),
    ) -> None:
        """Trajectory lake for LLM agents."""
        if debug:
            configure_logging("DEBUG")

    for info in sorted(pkgutil.iter_modules(trajlake.commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"trajlake.commands.{info.name}").register(app)
    _add_epilog(app)
    return app


STOPPABLE_WHILE_STARTING = frozenset({"ingest"})
"""Services for which SIGTERM during start-up (seconds of imports) is a clean stop, exit 0; each installs
its own stop handler first thing once it runs."""


def _add_epilog(app: typer.Typer) -> None:
    """Every command's --help ends with the exit codes."""
    for command in app.registered_commands:
        command.epilog = command.epilog or EXIT_CODES
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _add_epilog(group.typer_instance)


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in STOPPABLE_WHILE_STARTING:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        configure_logging(os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        build_app()()
    except Exception as exc:  # the one error handler: an error no command anticipated, as one line and exit 1
        if logging.getLogger("trajlake").isEnabledFor(logging.DEBUG):
            raise
        if (problem := _store_problem(sys.argv[1:])) is not None:
            print(f"error: {problem}", file=sys.stderr)
            raise SystemExit(2) from None
        first_line = str(exc).strip().partition("\n")[0]
        print(f"error: {type(exc).__name__}: {first_line}\n"
              "(unexpected: trajlake --debug shows where it happened; please report it)", file=sys.stderr)
        raise SystemExit(1) from None


def _store_problem(args: list[str]) -> str | None:
    """After a crash: what is wrong with the lake's object store, if anything (one line)."""
    from store.storage import CredentialsMissing, storage_options, store_problem

    root = os.environ.get("TRAJLAKE_LAKE", "")
    for i, arg in enumerate(args):
        if arg == "--lake" and i + 1 < len(args):
            root = args[i + 1]
        elif arg.startswith("--lake="):
            root = arg.removeprefix("--lake=")
    try:
        return store_problem(root, storage_options(root)) if root else None
    except CredentialsMissing as exc:
        return str(exc)


if __name__ == "__main__":
    main()
