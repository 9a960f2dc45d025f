"""``trajlake sql``'s settings read without pydantic, when the environment holds them plainly.

pydantic and pydantic-settings cost a command ~0.15 s of start-up (issue 16: ``trajlake sql "SELECT 1"`` in
< 0.5 s). ``plain_sql_settings`` reads the fields of ``trajlake.settings.SqlSettings`` that ``trajlake sql``
uses from the TRAJLAKE_* variables (names in any case, as pydantic-settings reads them) when every field that is
set parses beyond doubt; otherwise it returns None and the command loads ``SqlSettings``, so that a bad value is
reported in the same words as before. tests/trajlake/test_plain_settings.py keeps ``FREE_TEXT | PARSED`` equal
to ``SqlSettings``'s fields and the two readers in agreement.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.option_defaults import DEFAULT_LAKE

if TYPE_CHECKING:
    from store.lake import Lake

ENV_PREFIX = "trajlake_"
SQL_MAX_ROWS = 100
"""Rows the table format of ``trajlake sql`` prints when --max-rows is not given (TRAJLAKE_SQL_MAX_ROWS)."""
SQL_MAX_ROWS_CAP = 10**18
"""The most rows --max-rows / TRAJLAKE_SQL_MAX_ROWS may ask for: one more must still fit DuckDB's int64 fetch size."""
FREE_TEXT = frozenset({"lake", "bootstrap_servers", "topic", "home", "openlineage_transport", "openlineage_url",
                       "openlineage_endpoint", "openlineage_api_key", "openlineage_file", "openlineage_namespace"})
"""Fields of ``SqlSettings`` that take any text (str or Path): no value of theirs is an error."""
PARSED = frozenset({"log_level", "sql_max_rows", "object_store"})
"""Fields of ``SqlSettings`` whose value can be refused."""


@dataclass(frozen=True)
class PlainSqlSettings:
    """What ``trajlake sql`` and ``trajlake tables`` read of ``SqlSettings``."""

    lake: str
    sql_max_rows: int
    object_store: dict[str, str]

    def open_lake(self) -> Lake:
        return open_lake(self.lake, self.object_store)


def open_lake(root: str, object_store: Mapping[str, str]) -> Lake:
    """The lake at ``root`` with the object-store options of ``object_store`` (AWS_* and the like).

    ``CredentialsMissing`` (exit 2) for an S3 lake without keys (see ``store.storage``).
    """
    from store.lake import Lake
    from store.storage import storage_options

    return Lake(root, storage_options(root, object_store))


def plain_sql_settings(*, lake: str | None = None, env: Mapping[str, str] | None = None) -> PlainSqlSettings | None:
    """``SqlSettings`` from ``env`` (default: the process's) with ``lake`` on top when given; None when a field is
    set to a value that only ``SqlSettings`` can judge (then load that).

    >>> plain_sql_settings(lake="/lakes/a", env={"TRAJLAKE_SQL_MAX_ROWS": "7"})
    PlainSqlSettings(lake='/lakes/a', sql_max_rows=7, object_store={})
    >>> plain_sql_settings(env={"TRAJLAKE_SQL_MAX_ROWS": "seven"}) is None
    True
    """
    from store.storage import object_store_env

    env = os.environ if env is None else env
    fields: dict[str, str] = {}
    for key, value in env.items():
        name = key.lower().removeprefix(ENV_PREFIX)
        if name == key.lower() or name not in FREE_TEXT | PARSED:
            continue  # not a field: pydantic-settings ignores it too
        if name in fields:
            return None  # set twice in different cases: which one wins is pydantic-settings' business
        fields[name] = value
    level, max_rows = fields.get("log_level"), fields.get("sql_max_rows")
    if "object_store" in fields or (max_rows is not None and not re.fullmatch(r"[0-9]{1,18}", max_rows)) or (
            level is not None and not isinstance(logging.getLevelName(level.upper()), int)):
        return None
    return PlainSqlSettings(lake=lake if lake is not None else fields.get("lake", DEFAULT_LAKE),
                            sql_max_rows=SQL_MAX_ROWS if max_rows is None else int(max_rows),
                            object_store=object_store_env(env))
