"""``trajlake sql`` and ``trajlake tables``: read the lake with SQL (DuckDB views)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from schemas.errors import InputError
from store.text import excerpt
from trajlake.options import LAKE_OPTION
from trajlake.plain_settings import SQL_MAX_ROWS_CAP, PlainSqlSettings, plain_sql_settings

if TYPE_CHECKING:  # a one-row answer loads neither Arrow nor pydantic (issue 16: < 0.5 s, start-up included)
    import pyarrow as pa

    from store.sql_rows import Rows
    from trajlake.settings import SqlSettings

CELL_CHARS = 60
"""Longest cell text in the table format; longer values end in an ellipsis."""


def settings_for(lake: str | None) -> PlainSqlSettings | SqlSettings:
    """``SqlSettings`` (flags on top of TRAJLAKE_*), read without pydantic when the environment allows."""
    if (plain := plain_sql_settings(lake=lake)) is not None:
        return plain
    from trajlake.settings import SqlSettings, load

    return load(SqlSettings, lake=lake)


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def sql(
    query: str = typer.Argument(..., help='One SELECT statement, e.g. "SELECT status, count(*) FROM rollouts GROUP BY ALL"; - reads it from stdin.'),
    lake: str | None = LAKE_OPTION,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="table (for people), csv, json (one object per line) or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File to write (csv/json/parquet); csv and json go to stdout without it."),
    max_rows: int | None = typer.Option(None, "--max-rows", "-n", min=0, max=SQL_MAX_ROWS_CAP, help="Stop after N rows (default: TRAJLAKE_SQL_MAX_ROWS=100 for table, all for files)."),
) -> None:
    """Run SQL over every lake table (views: trajlake tables) and print or export the result."""
    from store.sql import query_lake, run_query
    from store.sql_rows import rows_at_most

    settings = settings_for(lake)
    if query == "-":
        query = sys.stdin.read()
    if format is OutputFormat.table and output is not None:
        raise InputError("--output needs --format csv, json or parquet (the table format prints to the terminal)")
    if format is OutputFormat.parquet and output is None:
        raise InputError("--format parquet needs --output FILE")
    limit = settings.sql_max_rows if format is OutputFormat.table and max_rows is None else max_rows
    fetch = None if limit is None else limit + 1
    if format is OutputFormat.table:  # Python rows: Arrow only for the types that need it (store.sql_rows)
        rows = query_lake(settings.open_lake(), query, lambda executed: rows_at_most(executed, fetch))
        more = limit is not None and len(rows.values) > limit
        print_table(rows.head(limit) if more else rows, more=more)
    else:
        result = run_query(settings.open_lake(), query, max_rows=fetch)
        more = limit is not None and result.num_rows > limit
        write_result(result.slice(0, limit) if more else result, format.value, output)
    if more:
        from rich.console import Console

        Console(stderr=True).print(f"[yellow]stopped after {limit} rows[/]: raise --max-rows to see more")


def write_result(result: pa.Table, fmt: str, output: Path | None) -> None:
    """Export to ``output``, or through a temporary file to stdout."""
    from rich.console import Console

    from store.sql import export

    if output is not None:
        try:
            export(result, output, format=fmt)
        except OSError as e:
            raise InputError(f"cannot write {output}: {e}") from None
        Console(stderr=True).print(f"wrote {result.num_rows} rows to {output} ({fmt})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"result.{fmt}"
        export(result, path, format=fmt)
        with path.open("rb") as f:
            sys.stdout.flush()
            shutil.copyfileobj(f, sys.stdout.buffer)
        sys.stdout.flush()


def print_table(result: Rows, *, more: bool = False) -> None:
    """A rich table; one block per record when the columns would not fit the terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if result.columns == ["explain_key", "explain_value"]:  # EXPLAIN: the plan text, uncut
        for _, plan in result.values:
            console.print(Text(plan))
        return
    rows = [[cell(v) for v in row] for row in result.values]
    if _table_width(result.columns, rows) > console.width:
        width = max(len(name) for name in result.columns)
        for i, row in enumerate(rows, 1):
            console.rule(f"row {i}", align="left", style="dim")
            for name, text in zip(result.columns, row):
                console.print(Text.assemble((name.ljust(width), "bold"), "  ", text))
    else:
        table = Table(box=box.SIMPLE_HEAVY, show_edge=False)
        for name, numeric in zip(result.columns, result.numeric):
            table.add_column(name, justify="right" if numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(Text(text) for text in row))
        console.print(table)
    plural = "" if len(result.values) == 1 else "s"
    console.print(f"[dim]{len(result.values)}{'+' if more else ''} row{plural}[/]")


def _table_width(names: list[str], rows: list[list[str]]) -> int:
    """Rough width of the table format: each column as wide as its header or cells (capped at 24)."""
    widths = [min(max([len(name), *(len(row[i]) for row in rows)]), 24) for i, name in enumerate(names)]
    return sum(widths) + 3 * len(widths)


def cell(value: Any) -> str:
    """One value as table text: lists of numbers as counts, long text cut."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return f"[{len(value)} ids]"
        if value and all(isinstance(v, float) for v in value):
            return f"[{len(value)} floats]"
        return excerpt(json.dumps(value, default=str), CELL_CHARS) or ""
    if isinstance(value, dict):
        return excerpt(json.dumps(value, default=str), CELL_CHARS) or ""
    if isinstance(value, datetime):
        return utc_text(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return excerpt(str(value), CELL_CHARS) or ""


def utc_text(ts: datetime) -> str:
    """``2026-01-01 00:00:01.250Z``: UTC, milliseconds only when there are some."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc)
    text = ts.strftime("%Y-%m-%d %H:%M:%S")
    if ts.microsecond:
        text += f".{ts.microsecond // 1000:03d}"
    return text + ("Z" if ts.tzinfo is not None else "")


def tables(
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one object per view."),
) -> None:
    """List the views `trajlake sql` can query, with row counts and Delta versions."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from store.sql import describe_views

    settings = settings_for(lake)
    views = describe_views(settings.open_lake())
    if as_json:
        for v in views:
            print(json.dumps(dataclasses.asdict(v), sort_keys=True))
        return
    table = Table(box=box.SIMPLE_HEAVY, show_edge=False, title=f"lake {settings.lake}", title_justify="left")
    for name, justify in (("view", "left"), ("kind", "left"), ("rows", "right"), ("version", "right"), ("table", "left")):
        table.add_column(name, justify=justify)
    for v in views:
        kind = {"delta": "delta", "joined": "joined view", "empty": "[dim]not written yet[/]"}[v.kind]
        version = "" if v.version is None else str(v.version)
        table.add_row(Text(v.name), kind, f"{v.rows:,}", version, Text(v.table or ""))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command()(sql)
    app.command()(tables)
