"""``trajlake --help`` stays light: registering the commands imports none of the heavy libraries.

Each command imports what it uses inside its function; a module-level import of
one of these in ``trajlake/commands/*`` (or in what they import) fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY_MODULES = ("torch", "deepspeed", "transformers", "deltalake", "pyarrow", "duckdb", "polars", "numpy", "pandas",
                 "kafka", "fastapi", "starlette", "uvicorn", "httpx")

PROBE = """
import contextlib, io, json, sys
sys.argv = ["trajlake", *json.loads(sys.argv[1])]
from trajlake.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def loaded_after(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args))], capture_output=True, text=True,
                          check=True, timeout=120)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_help_imports_no_heavy_module():
    assert loaded_after("--help") & set(HEAVY_MODULES) == set()


def test_a_command_help_imports_no_heavy_module():
    assert loaded_after("sql", "--help") & set(HEAVY_MODULES) == set()


def test_the_probe_sees_what_a_command_imports(tmp_path):
    assert "duckdb" in loaded_after("sql", "--lake", str(tmp_path), "SELECT 1")
