"""The CLI shell: logging levels, the exit-code epilog on every command, shared option wording."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from schemas.errors import InputError
from trajlake.cli import OWN_PACKAGES, SILENT_LIBRARIES, Shell, build_app, configure_logging
from trajlake.options import TIME_HELP, parse_time


def all_commands() -> dict[str, typer.main.click.Command]:
    """'datasets list' -> click command, for every command and sub-command."""
    found = {}
    pending = [("", typer.main.get_command(build_app()))]
    while pending:
        prefix, group = pending.pop()
        for name, command in (group.every_command() if isinstance(group, Shell) else group.commands).items():
            path = f"{prefix} {name}".strip()
            if hasattr(command, "commands"):
                pending.append((path, command))
            else:
                found[path] = command
    return found


@pytest.fixture(autouse=True)
def restore_logging():
    names = ["", *OWN_PACKAGES, *SILENT_LIBRARIES]
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_library_logs_stay_quiet_unless_debug():
    configure_logging("INFO")
    assert logging.getLogger("ingest.ingester").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("kafka.net.manager").isEnabledFor(logging.ERROR)  # our code says it in one line
    configure_logging("DEBUG")
    assert logging.getLogger("kafka.net.manager").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)


def test_debug_flag_turns_library_logs_on():
    configure_logging("WARNING")
    result = CliRunner().invoke(build_app(), ["--debug", "broker", "--help"])
    assert result.exit_code == 0
    assert logging.getLogger("kafka").isEnabledFor(logging.DEBUG)


def test_a_bad_log_level_is_refused_by_name():
    with pytest.raises(ValueError, match="TRAJLAKE_LOG_LEVEL='loud'"):
        configure_logging("loud")


@pytest.mark.parametrize("path", sorted(all_commands()))
def test_every_help_ends_with_the_exit_codes(path: str):
    result = CliRunner().invoke(build_app(), [*path.split(), "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # click's test runner wraps help at 80 columns
    assert "Exit codes: 0 done" in flat and "2 bad flags or settings" in flat


@pytest.mark.parametrize("path", sorted(all_commands()))
def test_lake_option_has_one_wording(path: str):
    [lake] = [p for p in all_commands()[path].params if "--lake" in getattr(p, "opts", [])] or [None]
    if lake is not None:
        assert lake.help == "Lake root: a folder or s3://bucket/prefix (default: TRAJLAKE_LAKE, else ./lake).", path


def test_bootstrap_servers_option_has_one_wording():
    found = {path: p.help for path, command in all_commands().items() for p in command.params
             if "--bootstrap-servers" in getattr(p, "opts", [])}
    assert len(found) > 3 and set(found.values()) == {
        "Kafka bootstrap servers, host:port[,...] (default: TRAJLAKE_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)."}, found


KAFKA_CLIENTS = {"gateway", "ingest", "health", "train", "forget", "build-dataset"}
"""Commands that talk to Kafka (``broker`` is the broker itself)."""


def test_every_command_that_talks_to_kafka_takes_the_same_connection_flag():
    flags = {path: {o for p in command.params for o in getattr(p, "opts", [])} for path, command in all_commands().items()}
    assert {path for path, opts in flags.items() if "--bootstrap-servers" in opts} == KAFKA_CLIENTS
    assert all("--bootstrap-servers" in opts for path, opts in flags.items() if "--topic" in opts and path != "broker")


TIME_OPTIONS = {"since", "until", "backfill"}


def test_time_options_have_one_wording_and_one_parser():
    """Every point-in-time flag says RFC 3339 the same way and reads through ``trajlake.options.parse_time``."""
    found = {(path, p.name): p.help for path, command in all_commands().items() for p in command.params
             if p.name in TIME_OPTIONS}
    assert {name for _, name in found} == TIME_OPTIONS
    for where, help_text in found.items():
        assert help_text.endswith(f"({TIME_HELP}).") or help_text.endswith(f"({TIME_HELP})"), where
    assert parse_time("2026-11-01T02:00:00+02:00", "--since") == parse_time("2026-11-01", "--since")
    with pytest.raises(InputError, match="--until 'yesterday' is not an RFC 3339 time"):
        parse_time("yesterday", "--until")


@pytest.mark.parametrize("path", sorted(all_commands()))
def test_no_help_text_is_eaten_as_rich_markup(path: str):
    """Typer renders help with rich markup: '[default: 1]' would vanish from the screen."""
    for param in all_commands()[path].params:
        assert not re.search(r"\[[a-z#/@][^\[\]]*\]", getattr(param, "help", None) or ""), (path, param.name)


def test_an_unexpected_error_is_one_line_and_exit_1_and_debug_shows_the_traceback(tmp_path):
    log = tmp_path / "lake" / "rollout_starts" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("garbage\n")
    command = [sys.executable, "-m", "trajlake.cli", "compact", "--lake", str(tmp_path / "lake")]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert quiet.stderr.startswith("error: DeltaError: ") and "trajlake --debug" in quiet.stderr
    loud = subprocess.run([*command[:3], "--debug", *command[3:]], capture_output=True, text=True, timeout=120)
    assert loud.returncode == 1 and "Traceback" in loud.stderr
