"""Every subcommand, given bad input, answers with one readable error and a documented exit code: no traceback.

The walk finds the commands in the Typer app (nested groups included), so a new command is covered the
day it is registered. Most cases run in-process (``CliRunner`` goes through the same root command, hence
the same error handler, as the console script); a few run the real CLI as subprocesses, in parallel.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
from typer.testing import CliRunner

from tests.trajlake.test_cli_shell import all_commands
from trajlake.cli import build_app

DOCUMENTED = {1, 2, 3}
"""Exit codes of a command that did not do its job (``trajlake.options.EXIT_CODES``; 3: ingest only)."""
RUNS_UNTIL_STOPPED = {"broker", "demo", "gateway", "ingest", "query-api", "scheduler", "serve-model", "train"}
"""Commands that start a service or a long job when their input is good: only walked with input the parser refuses."""
COMMANDS = all_commands()
CLEAN_ENV = {name: None for name in os.environ if name.startswith("TRAJLAKE_")}


@pytest.fixture(autouse=True)
def no_debug_logging():
    """The handler shows tracebacks when trajlake logs at DEBUG; these tests check what users see by default."""
    logger = logging.getLogger("trajlake")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(build_app(), args, env={**CLEAN_ENV, "COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"trajlake {' '.join(args)} let {result.exception!r} out of the shell") from result.exception
    return result.exit_code, result.output


def assert_refused(args: list[str], code: int, output: str) -> None:
    shown = f"trajlake {' '.join(args)} -> {code}:\n{output}"
    assert code in DOCUMENTED, shown
    assert "Traceback" not in output, shown
    assert "a bug" not in output, shown  # an error the code did not anticipate is a bug, not an answer
    assert "error" in output.lower() or "usage" in output.lower(), shown


def required_arguments(command: click.Command) -> list[str]:
    return ["x" for p in command.params if isinstance(p, click.Argument) and p.required]


def number_options(command: click.Command) -> list[str]:
    return [p.opts[0] for p in command.params if isinstance(p, click.Option) and not p.is_flag
            and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_an_unknown_option_is_refused_with_exit_2(path: str):
    args = [*path.split(), *required_arguments(COMMANDS[path]), "--no-such-option"]
    code, output = invoke(args)
    assert_refused(args, code, output)
    assert code == 2 and "No such option" in output


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_a_word_where_a_number_goes_is_refused_with_exit_2(path: str):
    command = COMMANDS[path]
    for option in number_options(command):
        args = [*path.split(), *required_arguments(command), option, "many"]
        code, output = invoke(args)
        assert_refused(args, code, output)
        assert code == 2 and option in output


@pytest.mark.parametrize("path", sorted(p for p in COMMANDS if p.split()[0] not in RUNS_UNTIL_STOPPED))
def test_a_missing_lake_is_an_answer_not_a_crash(path: str, tmp_path: Path):
    command = COMMANDS[path]
    if not any("--lake" in getattr(p, "opts", []) for p in command.params):
        pytest.skip("no --lake option")
    args = [*path.split(), *required_arguments(command), "--lake", str(tmp_path / "no-lake")]
    code, output = invoke(args)
    if code != 0:  # listing an empty lake may succeed ("no checkpoints yet"); a failure must read well
        assert_refused(args, code, output)
    assert "Traceback" not in output and "a bug" not in output, output


BAD_INPUT = [
    ["datasets", "export", "foo@bar", "out"],
    ["datasets", "show", "foo@bar"],
    ["datasets", "diff", "foo@1", "foo@bar"],
    ["build-dataset", "bad/name", "--no-publish"],
    ["build-dataset", "ds", "--since", "yesterday"],
    ["build-dataset", "ds", "--reward-rule", "weighted:x"],
    ["lineage", "nope@1"],
    ["rollout", "show", "no-such-rollout"],
    ["sql", "SELEC 1"],
    ["sql", "SELECT 1", "--format", "parquet"],
    ["compare", "h@1", "h@1"],
    ["compare", "a", "b", "--by", "moon"],
    ["failures", "--until", "tomorrow"],
    ["forget"],
    ["forget", "--user", "u"],
    ["train", "--retry", "ds"],
    ["scheduler", "--once", "--job", "nope"],
    ["retention", "show", "--policy", "/no/such/policy.json"],
]


@pytest.mark.parametrize("args", BAD_INPUT, ids=" ".join)
def test_bad_input_is_one_readable_error(args: list[str], tmp_path: Path):
    (tmp_path / "lake").mkdir()
    code, output = invoke([*args, "--lake", str(tmp_path / "lake")])
    assert_refused(args, code, output)


def test_the_real_cli_refuses_bad_input_without_a_traceback(tmp_path: Path):
    """The console script's process, not just the click group: start-up, settings and the handler together."""
    lake = str(tmp_path / "no-lake")
    cases = [
        (["datasets", "export", "foo@bar", str(tmp_path / "out"), "--lake", lake], {1}),
        (["sql", "SELECT 1", "--no-such-option"], {2}),
        (["ingest", "--batch-max-events", "many"], {2}),
        (["tables", "--lake", lake], {1}),
        (["tables"], {2}),  # TRAJLAKE_LOG_LEVEL below is not a level: nothing runs
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}

    def run(case: tuple[list[str], set[int]]) -> tuple[list[str], set[int], subprocess.CompletedProcess]:
        args, codes = case
        extra = {"TRAJLAKE_LOG_LEVEL": "loud"} if args == ["tables"] else {}
        proc = subprocess.run([sys.executable, "-m", "trajlake.cli", *args], capture_output=True, text=True,
                              env={**env, **extra}, timeout=300)
        return args, codes, proc

    with ThreadPoolExecutor(len(cases)) as pool:
        for args, codes, proc in pool.map(run, cases):
            output = proc.stdout + proc.stderr
            assert proc.returncode in codes, (args, proc.returncode, output)
            assert "Traceback" not in output and "a bug" not in output, (args, output)
            assert output.strip(), args


def test_debug_shows_the_traceback_of_an_anticipated_error_too(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "trajlake.cli", "--debug", "datasets", "show", "nope",
                           "--lake", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "DatasetNotFound" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no dataset")  # then the line users see


@pytest.mark.parametrize("root", ["gs://bucket/lake", "http://host/lake", "az://container/lake", ""])
@pytest.mark.parametrize("args", [["tables"], ["sql", "SELECT 1"], ["health"], ["datasets", "list"],
                                  ["build-dataset", "ds", "--no-publish"], ["lineage", "ds@0"]], ids=" ".join)
def test_a_lake_root_that_is_no_folder_and_no_s3_is_refused_before_it_is_opened(args: list[str], root: str):
    """gs:// used to hang for minutes (a credential lookup, deaf to Ctrl-C), http:// was 'a bug', "" the cwd."""
    proc = subprocess.run([sys.executable, "-m", "trajlake.cli", *args, "--lake", root], capture_output=True,
                          text=True, timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert output.strip().splitlines() == [output.strip()] and "s3://bucket/prefix" in output, output
