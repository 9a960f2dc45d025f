"""Readers exit 0: no SIGABRT ("terminate called without an active exception") at interpreter shutdown.

deltalake's PyArrow route aborted 3 plain reads in 60 here (12 runs miss it with p ~0.54, so
the test catches a regression of that size about half the time, at a third of the cost); ``Lake.read``
(``file_uris()`` + ``pyarrow.dataset``) 0 in 60, and must never. Runs are parallel so
the test stays short; each is a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from store.lake import Lake
from tests.store.lake_builder import sample_rollout, write_events

READ_AND_EXIT = "import sys; from store.lake import Lake; print(Lake(sys.argv[1]).read('events').num_rows)"


def exit_codes(commands: list[list[str]], env: dict[str, str]) -> list[int]:
    def run(args: list[str]) -> int:
        return subprocess.run(args, env=env, capture_output=True, timeout=300).returncode

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(run, commands))


def built(lake: Lake) -> Lake:
    write_events(lake, sample_rollout("r1") + sample_rollout("r2"))
    return lake


@pytest.mark.parametrize("where", ["local", "s3"])
def test_read_only_commands_exit_zero_every_time(where: str, request: pytest.FixtureRequest) -> None:
    lake = built(request.getfixturevalue("lake" if where == "local" else "s3_lake"))
    env = {**os.environ, "TRAJLAKE_LAKE": lake.root}
    python = [sys.executable]
    commands = 12 * [[*python, "-c", READ_AND_EXIT, lake.root]] + [
        [*python, "-m", "trajlake.cli", *args] for args in (["runs", "--json"], ["tables", "--json"], ["datasets", "list", "--json"])
    ]
    codes = exit_codes(commands, env)
    assert codes == [0] * len(commands), codes
