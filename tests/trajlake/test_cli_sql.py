"""``trajlake sql``, ``trajlake tables`` and ``trajlake rollout show`` through typer's CliRunner."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner


from tests.processes import wait_until_it_has_computed
from tests.store.lake_builder import sample_rollout, write_events

from schemas.tables import TOKENS  # noqa: E402
from store.lake import Lake  # noqa: E402
from trajlake.cli import Shell  # noqa: E402
from trajlake.commands import rollout as rollout_commands  # noqa: E402
from trajlake.commands import sql as sql_commands  # noqa: E402


@pytest.fixture
def sample_lake(lake: Lake) -> Lake:
    """A finished rollout r1 (2 LLM calls, 1 tool step, 3 rewards) and a running rollout r2."""
    write_events(lake, sample_rollout("r1") + sample_rollout("r2", task_id="t2")[:4])
    return lake


@pytest.fixture
def app() -> typer.Typer:
    """The commands under test, registered the way trajlake.cli registers every module."""
    app = typer.Typer(cls=Shell, pretty_exceptions_enable=False)  # the shell's error handler

    @app.callback()
    def _root() -> None:
        """trajlake"""

    sql_commands.register(app)
    rollout_commands.register(app)
    return app


@pytest.fixture
def run(app, sample_lake):
    """Invoke the CLI against the sample lake on a wide terminal."""
    runner = CliRunner(env={"TRAJLAKE_LAKE": sample_lake.root, "COLUMNS": "200", "TRAJLAKE_SQL_MAX_ROWS": None})

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def failed(result, *messages: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for message in messages:
        assert message in result.stderr
    return result.stderr


# ------------------------------------------------------------------ sql, table format


def test_table_format_summarises_token_lists(run):
    out = ok(run("sql", "SELECT call_id, prompt_token_ids, logprobs, requested_at FROM llm_calls "
                        "WHERE rollout_id = 'r1' ORDER BY seq"))
    assert "[3 ids]" in out and "[6 ids]" in out and "[2 floats]" in out
    assert "2026-01-01 00:00:01Z" in out
    assert "1, 2, 3" not in out
    assert out.index("c1") < out.index("c2")
    assert "2 rows" in out


def test_the_query_can_come_from_stdin(app, sample_lake):
    runner = CliRunner(env={"TRAJLAKE_LAKE": sample_lake.root})
    result = runner.invoke(app, ["sql", "-", "-f", "csv"], input="SELECT count(*) AS n\nFROM rollouts\n")
    assert ok(result) == "n\n2\n"


def test_long_cells_are_cut(run):
    out = ok(run("sql", "SELECT repeat('abc', 100) AS long"))
    assert ("abc" * 20)[:59] + "…" in out and "abc" * 20 not in out


def test_explain_prints_the_whole_plan(run):
    out = ok(run("sql", "EXPLAIN SELECT sum(n_response_tokens) FROM llm_calls"))
    assert "HASH_JOIN" in out and "…" not in out


def test_wide_results_print_one_block_per_row(app, sample_lake):
    runner = CliRunner(env={"TRAJLAKE_LAKE": sample_lake.root, "COLUMNS": "80"})
    out = ok(runner.invoke(app, ["sql", "SELECT * FROM llm_calls ORDER BY rollout_id, seq"]))
    assert out.count("row ") == 3 and "response_token_ids   [2 ids]" in out


def test_max_rows_stops_and_says_so(run):
    result = run("sql", "SELECT * FROM range(50)", "--max-rows", "5")
    assert "5+ rows" in ok(result)
    assert "stopped after 5 rows" in result.stderr


def test_the_default_row_limit_comes_from_settings(app, sample_lake):
    runner = CliRunner(env={"TRAJLAKE_LAKE": sample_lake.root, "TRAJLAKE_SQL_MAX_ROWS": "3", "COLUMNS": "200"})
    assert "3+ rows" in ok(runner.invoke(app, ["sql", "SELECT * FROM range(10)"]))


def test_an_empty_result_says_so_and_succeeds(run):
    out = ok(run("sql", "SELECT rollout_id, status FROM rollouts WHERE false"))
    assert "rollout_id" in out and "0 rows" in out


def test_lake_option_overrides_the_environment(run, tmp_path):
    empty = tmp_path / "other"
    empty.mkdir()
    assert "0" in ok(run("sql", "SELECT count(*) AS n FROM rollouts", "--lake", str(empty)))
    assert "2" in ok(run("sql", "SELECT count(*) AS n FROM rollouts"))


# ------------------------------------------------------------------ sql, file formats


def test_csv_to_stdout(run):
    out = ok(run("sql", "SELECT call_id, prompt_token_ids FROM llm_calls WHERE rollout_id = 'r1' ORDER BY seq",
                 "--format", "csv"))
    got = list(csv.DictReader(io.StringIO(out)))
    assert [(r["call_id"], json.loads(r["prompt_token_ids"])) for r in got] == [
        ("c1", [1, 2, 3]), ("c2", [1, 2, 3, 4, 5, 6])]


def test_json_lines_to_a_file(run, tmp_path):
    path = tmp_path / "calls.json"
    result = run("sql", "SELECT call_id, response_token_ids, logprobs FROM llm_calls WHERE rollout_id = 'r1' "
                        "ORDER BY seq", "-f", "json", "-o", str(path))
    assert ok(result) == ""
    assert "wrote 2 rows" in result.stderr
    got = [json.loads(line) for line in path.read_text().splitlines()]
    assert got == [{"call_id": "c1", "response_token_ids": [4, 5], "logprobs": [-0.5, -0.25]},
                   {"call_id": "c2", "response_token_ids": [7, 8, 9], "logprobs": [-1.0, -0.5, -0.125]}]


def test_parquet_file_keeps_token_types(run, tmp_path):
    path = tmp_path / "calls.parquet"
    ok(run("sql", "SELECT * FROM llm_calls ORDER BY rollout_id, seq", "--format", "parquet", "--output", str(path)))
    back = pq.read_table(path)
    assert back.num_rows == 3 and back.schema.field("prompt_token_ids").type == TOKENS
    assert back.column("prompt_token_ids").to_pylist()[1] == [1, 2, 3, 4, 5, 6]


def test_max_rows_applies_to_files_too(run, tmp_path):
    path = tmp_path / "r.csv"
    ok(run("sql", "SELECT * FROM range(100)", "-f", "csv", "-o", str(path), "-n", "10"))
    assert len(path.read_text().splitlines()) == 11


# ------------------------------------------------------------------ sql, bad input


@pytest.mark.parametrize("args, messages", [
    (["SELEC 1"], ["syntax error", "hint: check the SQL syntax"]),
    (["SELECT * FROM llm_call"], ["llm_call", "hint: views:", "llm_calls", "rollouts"]),
    (["COPY llm_calls TO 'out.csv'"], ["COPY statements are not allowed", "--output FILE"]),
    (["DROP VIEW rollouts"], ["DROP statements are not allowed"]),
    (["SELECT 1; SELECT 2"], ["got 2 statements"]),
    ([""], ["empty query"]),
    (["SELECT * FROM read_csv('/etc/hostname')"], ["Permission Error"]),
    (["SELECT 1", "--format", "parquet"], ["--format parquet needs --output FILE"]),
    (["SELECT 1", "--output", "x.csv"], ["--output needs --format csv, json or parquet"]),
])
def test_bad_queries_and_options_fail_cleanly(run, args, messages):
    failed(run("sql", *args), *messages)


def test_ctrl_c_during_a_query_stops_it_with_130_and_says_so(sample_lake):
    """DuckDB takes the SIGINT itself and raises RuntimeError('Query interrupted'): once reported as a bug, exit 1.

    The range is one DuckDB task (~13 s of CPU): closing the interrupted connection can wait for it to end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "sql", "SELECT sum(hash(a)) FROM range(1000000000) t(a)",
         "--lake", sample_lake.root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's Ctrl-C finds it
    try:
        wait_until_it_has_computed(proc.pid, cpu_s=3.0)  # start-up is < 1 s of CPU: the query is running
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "stopped by Ctrl-C" in err and "a bug" not in err, err


def test_a_missing_lake_fails_cleanly(run, tmp_path):
    failed(run("sql", "SELECT 1", "--lake", str(tmp_path / "nowhere")), "no lake at", "TRAJLAKE_LAKE")
    failed(run("tables", "--lake", str(tmp_path / "nowhere")), "no lake at")
    failed(run("rollout", "show", "r1", "--lake", str(tmp_path / "nowhere")), "no lake at")


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_an_unwritable_output_fails_cleanly(run, tmp_path, fmt):
    failed(run("sql", "SELECT 1", "-f", fmt, "-o", str(tmp_path / "no" / "dir" / f"x.{fmt}")), "cannot write")


@pytest.mark.parametrize("args", [
    ["sql", "SELECT 1", "--format", "xml"],
    ["sql", "SELECT 1", "--max-rows", "many"],
    ["sql", "SELECT 1", "--max-rows", "-1"],
    ["sql", "SELECT 1", "--max-rows", "99999999999999999999999"],  # past int64: a TypeError in fetchmany once
    ["sql"],
    ["rollout", "show"],
    ["rollout", "show", "r1", "--excerpt-chars", "x"],
])
def test_wrong_option_types_are_usage_errors(run, args):
    result = run(*args)
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_default_row_limit_past_int64_is_a_settings_error(app, sample_lake):
    result = CliRunner(env={"TRAJLAKE_LAKE": sample_lake.root, "TRAJLAKE_SQL_MAX_ROWS": "9" * 23}).invoke(
        app, ["sql", "SELECT 1"])
    assert result.exit_code == 2 and "TRAJLAKE_SQL_MAX_ROWS" in result.output, result.output


# ------------------------------------------------------------------ tables


def test_tables_lists_views_with_rows_and_versions(run, sample_lake):
    out = ok(run("tables"))
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isalpha()}
    assert lines["llm_requests"][1:4] == ["delta", "3", "0"]
    assert lines["rollouts"][1:4] == ["joined", "view", "2"]
    assert lines["quarantine"][1:] == ["not", "written", "yet", "0"]
    assert sample_lake.root in "".join(out.split())  # a long temp path may wrap


# ------------------------------------------------------------------ rollout show


def test_rollout_show_prints_the_steps_in_order(run):
    out = ok(run("rollout", "show", "r1"))
    order = ["rollout.started", "llm.call", "fix the bug", "tool.call", "bash", "llm.call", "rollout.finished",
             "pass = 0", "pass = 1", "format = 0.5"]
    positions = []
    start = 0
    for token in order:
        start = out.index(token, start)
        positions.append(start)
    assert positions == sorted(positions)
    assert "3 -> 2 tokens (engine)" in out and "120 ms" in out and "finish tool_calls" in out
    assert "succeeded: tests pass" in out and "9 prompt, 5 response" in out and "swe-agent 1.2" in out


def test_rollout_show_marks_a_running_rollout(run):
    out = ok(run("rollout", "show", "r2"))
    assert "running" in out and "no result yet" in out and "rollout.finished" not in out


def test_rollout_show_json_is_the_trajectory(run):
    data = json.loads(ok(run("rollout", "show", "r1", "--json")))
    assert data["summary"]["rollout_id"] == "r1"
    assert [s["kind"] for s in data["steps"]][:3] == ["rollout.started", "llm.call", "tool.call"]


def test_rollout_show_unknown_and_ambiguous_ids_fail_cleanly(run, sample_lake):
    failed(run("rollout", "show", "nope"), "no rollout 'nope'", "FROM rollouts")
    write_events(sample_lake, sample_rollout("r1", tenant="other")[:1])
    failed(run("rollout", "show", "r1"), "tenants default, other", "--tenant")
    assert "rollout.finished" in ok(run("rollout", "show", "r1", "--tenant", "default"))


def test_sql_answers_on_an_s3_lake(app, s3_lake):
    """The one-row path (no Arrow on a local lake) reads an object-store lake too: its tables and a bare SELECT."""
    write_events(s3_lake, sample_rollout("r1"))
    runner = CliRunner(env={"TRAJLAKE_LAKE": s3_lake.root, "COLUMNS": "200", "TRAJLAKE_SQL_MAX_ROWS": None})
    assert "1 row" in ok(runner.invoke(app, ["sql", "SELECT 41 + 1 AS answer"]))
    out = ok(runner.invoke(app, ["sql", "SELECT rollout_id, n_llm_calls FROM rollouts"]))
    assert "r1" in out and "1 row" in out
