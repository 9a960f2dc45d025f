"""``trajlake --help`` (and every command's ``--help``) stays light: it loads none of the heavy libraries.

Each command imports the lake, pipelines, trainer, Kafka and Arrow inside the function that uses them; a
module-level import of one of them in ``trajlake/commands/*`` (or in a module they import at load, such as
``pipelines/__init__.py`` or ``trajlake.settings``) fails here. The check runs in a fresh interpreter and reads
``sys.modules``; it says nothing about time (``bench/cli`` measures that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torch", "deepspeed", "transformers", "deltalake", "pyarrow", "duckdb", "polars", "numpy", "pandas", "kafka",
         "confluent_kafka", "fastapi", "starlette", "uvicorn", "httpx", "openlineage", "prometheus_client")
"""Top-level packages a command may load only when it runs."""

PROBE = """
import contextlib, io, json, sys
import typer
from trajlake.cli import build_app, main

heavy, runs = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
root, every = typer.main.get_command(build_app()), runs is None
if every:  # every command's --help, after the root's; a group's commands once its own --help has run
    runs = [["--help"], *([name, "--help"] for name in sorted(root.commands))]
loaded, found = set(), {}
for args in runs:
    sys.argv = ["trajlake", *args]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
        except SystemExit as exc:
            if exc.code:
                raise RuntimeError(f"trajlake {' '.join(args)} exited {exc.code}") from None
    if every and len(args) == 2 and hasattr(group := root.load(args[0]), "commands"):
        runs.extend([args[0], name, "--help"] for name in sorted(group.commands))
    now = {name.partition(".")[0] for name in sys.modules} & heavy
    found[" ".join(args)] = sorted(now - loaded)
    loaded |= now
print(json.dumps(found))
"""


def heavy_loaded_by(runs: list[list[str]] | None = None) -> dict[str, list[str]]:
    """Command line -> the heavy packages it loaded first (one interpreter runs them in order; None: every --help)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")} | {"COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(runs)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_no_help_loads_a_heavy_package():
    found = heavy_loaded_by()
    assert len(found) > 20 and "--help" in found and "sql --help" in found and "datasets export --help" in found
    assert {args: names for args, names in found.items() if names} == {}


ROOT_HELP = """
import json, sys
sys.argv = ["trajlake", "--help"]
from trajlake.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def test_the_root_help_imports_no_command_no_pydantic_and_no_rich():
    """``trajlake --help`` lists ``trajlake.commands.COMMANDS``: it imports no command module, so neither pydantic nor
    the settings (pydantic-settings alone cost it 0.1 s); help is click's plain text, so no rich (0.2 s with its
    markdown and syntax modules)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    done = subprocess.run([sys.executable, "-c", ROOT_HELP], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "Commands" in done.stdout and "sql" in done.stdout
    assert {m for m in modules if m.startswith("trajlake.commands.")} == set()
    assert {m for m in modules if m.partition(".")[0] in ("pydantic", "pydantic_settings")} == set()
    assert "trajlake.settings" not in modules
    assert {m for m in modules if m.partition(".")[0] in ("rich", "markdown_it", "pygments")} == set()


def test_the_probe_sees_what_a_command_loads(tmp_path):
    found = heavy_loaded_by([["--help"], ["sql", "--lake", str(tmp_path), "SELECT 1"],
                             ["sql", "--lake", str(tmp_path), "SELECT now() AS t"]])
    assert found["--help"] == []
    assert found[f"sql --lake {tmp_path} SELECT 1"] == ["duckdb"]
    assert "pyarrow" in found[f"sql --lake {tmp_path} SELECT now() AS t"]  # a time zone: Arrow (store.sql_rows)


SQL_SELECT_1 = """
import json, sys
sys.argv = ["trajlake", "sql", "--lake", sys.argv[1], "--max-rows", "5", "SELECT 1 AS one"]
from trajlake.cli import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)))
"""


def test_a_one_row_sql_answer_loads_no_arrow_no_pydantic_and_no_lake_library(tmp_path):
    """``trajlake sql "SELECT 1"`` (issue 16: < 0.5 s, start-up included) loads DuckDB and rich's table only: no
    pyarrow or numpy (``store.sql_rows``), no pydantic or pydantic-settings (``trajlake.plain_settings``, and
    ``trajlake.coercion`` instead of Typer's pydantic adapters), no deltalake, no catalogue of Arrow schemas."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    done = subprocess.run([sys.executable, "-c", SQL_SELECT_1, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "one" in done.stdout and "1 row" in done.stdout
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    top = {m.partition(".")[0] for m in modules}
    assert "duckdb" in top
    assert top & {"pyarrow", "numpy", "pydantic", "pydantic_settings", "pydantic_core", "deltalake", "polars"} == set()
    assert {"schemas.tables", "trajlake.settings", "typer._adapters", "store.trajectory"} & modules == set()
