"""Arrow query results as JSON-safe rows (what ``json.dumps`` accepts, and strict JSON parsers too)."""

from __future__ import annotations

import base64
import math
import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa


def jsonable(value: Any) -> Any:
    """One value as JSON: timestamps ISO 8601, durations in seconds, intervals as
    {months, days, seconds}, decimals as text, bytes base64,
    NaN and infinities as null, maps as [key, value] pairs.

    >>> jsonable({"t": datetime(2026, 1, 1), "x": float("nan"), "b": b"hi"})
    {'t': '2026-01-01T00:00:00', 'x': None, 'b': 'aGk='}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, pa.MonthDayNano):  # DuckDB INTERVAL: months and days have no fixed length
        return {"months": value.months, "days": value.days, "seconds": value.nanoseconds / 1e9}
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def table_rows(table: pa.Table) -> list[list[Any]]:
    """The table's rows as lists of JSON-safe values, in column order."""
    columns = [[jsonable(v) for v in column.to_pylist()] for column in table.columns]
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in range(table.num_rows)]
