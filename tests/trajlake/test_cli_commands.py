"""``trajlake.commands.COMMANDS``, the list ``trajlake --help`` shows without importing a command, says what the
command modules register: every command, its module, its summary (the first paragraph of its help)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import typer
from typer.testing import CliRunner

import trajlake.commands
from trajlake.cli import build_app
from trajlake.commands import COMMANDS


def registered() -> dict[str, tuple[str, str]]:
    """Name -> (module, summary) of every command the modules of ``trajlake.commands`` register."""
    found = {}
    for info in pkgutil.iter_modules(trajlake.commands.__path__):
        app = typer.Typer()
        importlib.import_module(f"trajlake.commands.{info.name}").register(app)
        for name, command in typer.main.get_group(app).commands.items():
            found[name] = (info.name, inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0])
    return found


def test_the_list_names_every_command_with_its_module_and_summary():
    assert {name: tuple(entry) for name, entry in COMMANDS.items()} == registered(), (
        "update trajlake.commands.COMMANDS to what the command modules register")


def test_the_root_help_lists_the_summaries_and_a_command_runs_with_its_options():
    listing = CliRunner().invoke(build_app(), ["--help"], env={"COLUMNS": "300"})
    assert listing.exit_code == 0, listing.output
    flat = " ".join(listing.output.split())  # plain help wraps at 80 columns whatever the terminal
    for entry in COMMANDS.values():
        assert entry.summary in flat
    assert listing.output.index("broker ") < listing.output.index("rollout ")  # COMMANDS' order
    root = typer.main.get_command(build_app())
    assert not root.commands["sql"].params  # the summary, until the command runs
    assert {"--lake", "--format"} <= {o for p in root.load("sql").params for o in getattr(p, "opts", [])}


def test_a_misspelt_command_is_refused_with_a_suggestion():
    result = CliRunner().invoke(build_app(), ["sqll"])
    assert result.exit_code == 2 and "Did you mean 'sql'?" in result.output
