"""The ``trajlake`` command: a thin shell over the packages.

Every module in ``trajlake.commands`` exposes ``register(app)``; each command
parses its options, builds settings, calls one function and renders the result.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
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


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        build_app()()
    except Exception:
        if (problem := _store_problem(sys.argv[1:])) is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def _store_problem(args: list[str]) -> str | None:
    """After a crash: what is wrong with the lake's object store, if anything (one line)."""
    from store.storage import storage_options, store_problem

    root = os.environ.get("TRAJLAKE_LAKE", "")
    for i, arg in enumerate(args):
        if arg == "--lake" and i + 1 < len(args):
            root = args[i + 1]
        elif arg.startswith("--lake="):
            root = arg.removeprefix("--lake=")
    return store_problem(root, storage_options(root)) if root else None


if __name__ == "__main__":
    main()
