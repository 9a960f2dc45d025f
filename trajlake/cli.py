"""The ``trajlake`` command: a thin shell over the packages.

Every module in ``trajlake.commands`` exposes ``register(app)``; each command
parses its options, builds settings, calls one function and renders the result.
The shell imports a command's module when that command runs (or shows its
help): ``trajlake --help`` lists the summaries of ``trajlake.commands.COMMANDS``.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

import typer
import typer.core

from schemas.errors import SettingsInvalid
from trajlake.coercion import convert_plainly
from trajlake.commands import COMMANDS
from trajlake.options import EXIT_CODES
from trajlake.signals import exit_cleanly_on_stop_signals, runs_until_stopped

if TYPE_CHECKING:
    from typer._click.core import Command  # typer's own click (typer 0.29 vendors it)

# Imported by the functions that use them: until ``main`` has installed the stop handler of a service, this
# module's imports are all that runs (a SIGTERM in that time still kills the process with -15).

OWN_PACKAGES = ("schemas", "store", "ingest", "pipelines", "trainer", "serve", "api", "devkit", "trajlake")
"""Loggers at TRAJLAKE_LOG_LEVEL; every other library logs WARNING and up only, unless the level is DEBUG."""
LOUD_LIBRARIES = ("DeepSpeed", "torch", "transformers", "urllib3", "filelock")
"""Libraries that set their own logger level (DeepSpeed logs at INFO with its own handler): WARNING unless DEBUG."""
SILENT_LIBRARIES = ("kafka",)
"""Libraries whose errors our code reports in its own words (kafka-python, the Kafka client of everything but the
ingester's consumer and the gateway's sink, which are confluent-kafka, logs every reconnect attempt as an ERROR):
quiet unless DEBUG."""


def configure_logging(level_name: str) -> None:
    """Our loggers at ``level_name``; libraries at WARNING (``SILENT_LIBRARIES``: CRITICAL) unless DEBUG."""
    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        raise SettingsInvalid(f"TRAJLAKE_LOG_LEVEL={level_name!r}: use DEBUG, INFO, WARNING or ERROR")
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


class Shell(typer.core.TyperGroup):
    """The ``trajlake`` command: the one place where an error becomes a line on stderr and an exit code.

    A ``TrajlakeError`` prints its message (and hint) and exits with its ``exit_code``; anything else is a
    bug: one line, exit 1. With --debug (or TRAJLAKE_LOG_LEVEL=DEBUG) the traceback comes first. Here
    rather than around ``main()``, so that every way in (the console script, ``python -m``, torchrun,
    ``CliRunner`` in tests) behaves the same.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        convert_plainly()
        for name, entry in COMMANDS.items():
            self.commands.setdefault(name, Summary(name, short_help=entry.summary))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args:
            self.load(args[0])
        return super().resolve_command(ctx, args)

    def load(self, name: str) -> Command | None:
        """Command ``name`` ready to run, its module imported (with the other commands it registers); None: no
        such command. Until then ``commands[name]`` is its ``Summary``."""
        if isinstance(self.commands.get(name), Summary):
            module = COMMANDS[name].module
            self.commands.update(commands_of(module))
            if isinstance(self.commands[name], Summary):
                raise RuntimeError(f"trajlake.commands.{module} registers no command {name!r}: fix "
                                   "trajlake.commands.COMMANDS")
        return self.commands.get(name)

    def every_command(self) -> dict[str, Command]:
        """Name -> command ready to run, of every command: imports every command module (for tests and tools)."""
        return {name: command for name in list(self.commands) if (command := self.load(name)) is not None}

    def main(self, args: Any = None, *rest: Any, **options: Any) -> Any:
        from schemas.errors import EXIT_BAD_SETTINGS, EXIT_FAILED, TrajlakeError

        argv = list(sys.argv[1:] if args is None else args)
        try:
            return super().main(args, *rest, **options)
        except TrajlakeError as exc:
            _exit(str(exc), exc.exit_code)
        except Exception as exc:
            if _interrupted_query(exc):
                _exit("stopped by Ctrl-C during a query, before the command finished", EXIT_STOPPED_BY_CTRL_C)
            if (problem := _store_problem(argv)) is not None:
                _exit(problem, EXIT_BAD_SETTINGS)
            first_line = str(exc).strip().partition("\n")[0]
            _exit(f"{type(exc).__name__}: {first_line}\n(a bug: trajlake --debug shows where it happened; please "
                  "report it)", EXIT_FAILED)


EXIT_STOPPED_BY_CTRL_C = 128 + signal.SIGINT
"""What a one-shot command stopped by Ctrl-C exits with (typer's own for a ``KeyboardInterrupt``; the help's 128+N)."""


def _interrupted_query(exc: Exception) -> bool:
    """Whether ``exc`` is DuckDB's answer to a Ctrl-C during a query: DuckDB takes the SIGINT itself and raises
    ``RuntimeError("Query interrupted")`` (or its ``InterruptException``) instead of ``KeyboardInterrupt``."""
    duckdb = sys.modules.get("duckdb")  # not imported here: a command that never queried cannot have been interrupted
    if duckdb is None:
        return False
    return isinstance(exc, duckdb.InterruptException) or (
        type(exc) is RuntimeError and str(exc).strip() == "Query interrupted")


def _exit(message: str, code: int) -> NoReturn:
    """``error: message`` on stderr (after the traceback of the error being handled, at DEBUG), exit ``code``."""
    from rich.console import Console
    from rich.text import Text

    if logging.getLogger("trajlake").isEnabledFor(logging.DEBUG) and sys.exc_info()[0] is not None:
        traceback.print_exc()
    Console(stderr=True, soft_wrap=True, highlight=False).print(Text.assemble(("error: ", "bold red"), message))
    sys.exit(code)


PLAIN_HELP = None
"""Help and usage errors in click's plain text, not rich panels: rendering them with rich imports rich's markdown
and syntax modules, 0.2 s of CPU that doubled ``trajlake --help`` (issue 16's goal is 0.3 s wall)."""
HELP_WIDTH = {"max_content_width": 200}
"""Help fills the terminal's width (COLUMNS), as rich's did; click alone stops at 80 columns."""


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="trajlake",
        cls=Shell,
        help="Trajectory lake for LLM agents: capture, ingest, query, build datasets, train.",
        epilog=EXIT_CODES,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=PLAIN_HELP,
        context_settings=HELP_WIDTH,
    )

    @app.callback()
    def _root(
        debug: bool = typer.Option(False, "--debug", help="Log everything at DEBUG, libraries included, and show "
                                   "the traceback of an error (same as TRAJLAKE_LOG_LEVEL=DEBUG)."),
    ) -> None:
        """Trajectory lake for LLM agents."""
        if debug:
            configure_logging("DEBUG")

    return app


class Summary(typer.core.TyperCommand):
    """A command as ``trajlake --help`` lists it, before its module is imported (``Shell.load``)."""


def commands_of(module: str) -> dict[str, Command]:
    """Name -> command of every command ``trajlake.commands.<module>`` registers, each --help ending with the exit
    codes."""
    app = typer.Typer(rich_markup_mode=PLAIN_HELP, context_settings=HELP_WIDTH)
    importlib.import_module(f"trajlake.commands.{module}").register(app)
    _add_epilog(app)
    return dict(typer.main.get_group(app).commands)


def _add_epilog(app: typer.Typer) -> None:
    """Every command's --help ends with the exit codes."""
    for command in app.registered_commands:
        command.epilog = command.epilog or EXIT_CODES
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _add_epilog(group.typer_instance)


def main() -> None:
    if runs_until_stopped(sys.argv):
        exit_cleanly_on_stop_signals()
    try:  # TRAJLAKE_LOG_LEVEL (``ShellSettings.log_level``) read here: pydantic-settings would cost --help 0.1 s
        configure_logging(os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"))
    except SettingsInvalid as exc:
        _exit(str(exc), exc.exit_code)
    build_app()()


def _store_problem(args: list[str]) -> str | None:
    """After a crash: what is wrong with the lake's object store, if anything (one line)."""
    from schemas.errors import TrajlakeError
    from store.storage import store_problem
    from trajlake.settings import CommonSettings, load

    root = None
    for i, arg in enumerate(args):
        if arg == "--lake" and i + 1 < len(args):
            root = args[i + 1]
        elif arg.startswith("--lake="):
            root = arg.removeprefix("--lake=")
    try:
        settings = load(CommonSettings, lake=root)
        return store_problem(settings.lake, settings.open_lake().storage_options)
    except TrajlakeError as exc:
        return str(exc)


if __name__ == "__main__":
    main()
