"""Lineage in both directions: checkpoint -> dataset version -> rollouts -> events -> Kafka offsets, and back.

Downwards, a dataset version's ``dataset_lineage`` rows name the rollouts and
the exact events (llm.request/response, reward) it used; the typed tables
give each event's Kafka topic/partition/offset. Upwards, ``dataset_lineage``
answers which versions used a rollout (or event), and a ``checkpoints`` table
(columns checkpoint_id, dataset, dataset_version, parent_checkpoint_id), when
it exists, which checkpoints were trained on those versions. A checkpoint's
own lineage is its dataset version's, plus the checkpoint it was trained
from, the resumes of its run (``train_runs``) and, as "used by", only the
checkpoints trained from it.

An id is resolved in this order: ``NAME@VERSION`` (dataset version),
checkpoint id, rollout id, event id, then a bare dataset name (latest version).
Rollout and event ids are unique per tenant only: one that several tenants
used is refused (``AmbiguousId``, naming them) unless ``tenant`` picks one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import duckdb
import pyarrow as pa

from pipelines.datasets.registry import get_manifest
from schemas.tables import (
    CHECKPOINTS_TABLE,
    DATASET_LINEAGE_TABLE,
    DATASET_VERSIONS_TABLE,
    TRAIN_RUNS_TABLE,
    TYPED_TABLES,
)
from store.lake import Lake
from store.sql import connect
from schemas.errors import NotFound, TrajlakeError


class LineageNotFound(NotFound):
    """The id matches no dataset version, checkpoint, rollout or event."""


class AmbiguousId(TrajlakeError, LookupError):
    """A rollout or event id that several tenants used, looked up without a tenant."""


@dataclass(frozen=True)
class DatasetUse:
    dataset: str
    version: int
    used_event: bool | None = None
    """For an event's lineage: True when the version trained on this very event, False when only on its rollout."""


@dataclass(frozen=True)
class CheckpointUse:
    checkpoint_id: str
    dataset: str
    version: int


@dataclass
class Lineage:
    """What an id came from (rollouts, events, source versions) and what used it (datasets, checkpoints)."""

    kind: Literal["dataset", "checkpoint", "rollout", "event"]
    subject: str
    datasets: list[DatasetUse] = field(default_factory=list)
    checkpoints: list[CheckpointUse] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    events: pa.Table | None = None
    """event_id, tenant, type, rollout_id, seq, kafka_topic, kafka_partition, kafka_offset."""
    sources: dict[str, int] = field(default_factory=dict)
    """For a dataset version: source table -> Delta version it was built from."""
    parent_checkpoint: str | None = None
    """For a checkpoint: the checkpoint it was trained from (None: from ``base_model``)."""
    base_model: str | None = None
    """For a checkpoint: the model folder its run started from."""
    resumes: list[dict[str, Any]] = field(default_factory=list)
    """For a checkpoint: each restart of its run from a restart point (step, ts, host, pid, attempt)."""

    def offset_ranges(self) -> list[dict[str, Any]]:
        """Per Kafka (topic, partition): first and last offset and the number of ``events``."""
        if self.events is None or self.events.num_rows == 0:
            return []
        con = duckdb.connect()
        con.register("ev", self.events)
        rows = con.execute(
            """SELECT kafka_topic, kafka_partition, min(kafka_offset), max(kafka_offset), count(*)
               FROM ev GROUP BY ALL ORDER BY ALL"""
        ).fetchall()
        return [dict(zip(("topic", "partition", "first", "last", "events"), row)) for row in rows]


def lineage(lake: Lake, ref: str, *, tenant: str | None = None) -> Lineage:
    """Trace ``ref`` (NAME@VERSION, checkpoint id, rollout id, event id or dataset name).

    ``tenant`` scopes a rollout or event id; without it, an id several tenants used raises ``AmbiguousId``.

    >>> lineage(Lake("./lake"), "nightly@3").offset_ranges()  # doctest: +SKIP
    """
    wanted = (DATASET_LINEAGE_TABLE, DATASET_VERSIONS_TABLE, CHECKPOINTS_TABLE, TRAIN_RUNS_TABLE, *_typed())
    tables = [t for t in wanted if lake.exists(t)]
    con = connect(lake, tables=tables)
    try:
        match = re.fullmatch(r"(.+)@(\d+)", ref)
        if match:
            return _dataset(lake, con, tables, match.group(1), int(match.group(2)))
        if CHECKPOINTS_TABLE in tables:
            found = _checkpoint(lake, con, tables, ref)
            if found is not None:
                return found
        for kind, finder in (("rollout", _rollout), ("event", _event)):
            found = finder(con, tables, ref, tenant)
            if found is not None:
                return found
        if DATASET_VERSIONS_TABLE in tables and con.execute(
            f"SELECT 1 FROM {DATASET_VERSIONS_TABLE} WHERE dataset = ? LIMIT 1", [ref]
        ).fetchone():
            return _dataset(lake, con, tables, ref, None)
    finally:
        con.close()
    raise LineageNotFound(
        f"{ref!r} is no dataset version (NAME@VERSION), checkpoint, rollout or event id"
        f"{f' of tenant {tenant!r}' if tenant is not None else ''} in lake {lake.root!r}: "
        "check the id, or list datasets with `trajlake datasets list`"
    )


def _typed() -> list[str]:
    return [name for name, _ in TYPED_TABLES.values()]


def _events_sql(tables: list[str], where: str) -> str:
    parts = [
        f"""SELECT event_id, tenant, '{etype}' AS type, rollout_id, seq, kafka_topic, kafka_partition, kafka_offset
            FROM {name} WHERE {where}"""
        for etype, (name, _) in TYPED_TABLES.items()
        if name in tables
    ]
    return " UNION ALL ".join(parts) + " ORDER BY rollout_id, seq" if parts else ""


def _events(con: duckdb.DuckDBPyConnection, tables: list[str], where: str, params: list[Any]) -> pa.Table | None:
    sql = _events_sql(tables, where)
    if not sql:
        return None
    return con.execute(sql, params * sum(name in tables for name, _ in TYPED_TABLES.values())).to_arrow_table()


def _checkpoints(con: duckdb.DuckDBPyConnection, tables: list[str], uses: list[DatasetUse]) -> list[CheckpointUse]:
    if CHECKPOINTS_TABLE not in tables or not uses:
        return []
    found: list[CheckpointUse] = []
    for use in uses:
        rows = con.execute(
            f"""SELECT checkpoint_id FROM {CHECKPOINTS_TABLE} WHERE dataset = ? AND dataset_version = ?
                ORDER BY checkpoint_id""",
            [use.dataset, use.version],
        ).fetchall()
        found += [CheckpointUse(row[0], use.dataset, use.version) for row in rows]
    return found


def _checkpoint(lake: Lake, con: duckdb.DuckDBPyConnection, tables: list[str], checkpoint_id: str) -> Lineage | None:
    """A checkpoint: its dataset version's lineage, its parent and resumes; used by the checkpoints trained from it."""
    cols = {r[0] for r in con.execute(f"DESCRIBE {CHECKPOINTS_TABLE}").fetchall()}
    parent, base = (c if c in cols else "NULL" for c in ("parent_checkpoint_id", "base_model"))
    order = "created_at, checkpoint_id" if "created_at" in cols else "checkpoint_id"
    row = con.execute(
        f"""SELECT dataset, dataset_version, {parent}, {base} FROM {CHECKPOINTS_TABLE}
            WHERE checkpoint_id = ? LIMIT 1""",
        [checkpoint_id],
    ).fetchone()
    if row is None:
        return None
    found = _dataset(lake, con, tables, row[0], int(row[1]))
    found.kind, found.subject, found.parent_checkpoint, found.base_model = "checkpoint", checkpoint_id, row[2], row[3]
    children = con.execute(  # a table written before parents were recorded has none
        f"""SELECT checkpoint_id, dataset, dataset_version FROM {CHECKPOINTS_TABLE}
            WHERE {parent} = ? ORDER BY {order}""",
        [checkpoint_id],
    ).fetchall()
    found.checkpoints = [CheckpointUse(c, d, int(v)) for c, d, v in children]
    if TRAIN_RUNS_TABLE in tables:
        found.resumes = con.execute(
            f"""SELECT step, ts, host, pid, attempt FROM {TRAIN_RUNS_TABLE}
                WHERE run_id = ? AND status = 'started' AND step > 0 ORDER BY ts""",
            [checkpoint_id],
        ).to_arrow_table().to_pylist()  # arrow, not fetchall: DuckDB's timestamptz -> Python needs pytz
    return found


def _dataset(lake: Lake, con: duckdb.DuckDBPyConnection, tables: list[str], name: str, version: int | None) -> Lineage:
    manifest = get_manifest(lake, name, version)
    use = DatasetUse(name, manifest["version"])
    used = con.execute(
        f"""SELECT rollout_id FROM {DATASET_LINEAGE_TABLE} WHERE dataset = ? AND version = ? ORDER BY rollout_id""",
        [name, use.version],
    ).to_arrow_table()
    con.execute(  # by (rollout_id, event_id): event ids are unique per tenant, a version's rollout ids across tenants
        f"""CREATE OR REPLACE TEMP TABLE used_events AS
            SELECT rollout_id, unnest(call_event_ids || reward_event_ids) AS event_id FROM {DATASET_LINEAGE_TABLE}
            WHERE dataset = ? AND version = ?""",
        [name, use.version],
    )
    events = _events(con, tables, "(rollout_id, event_id) IN (SELECT (rollout_id, event_id) FROM used_events)", [])
    return Lineage(
        kind="dataset",
        subject=f"{name}@{use.version}",
        datasets=[use],
        checkpoints=_checkpoints(con, tables, [use]),
        rollouts=used["rollout_id"].to_pylist(),
        events=events,
        sources=dict(manifest["sources"]),
    )


def _uses(con: duckdb.DuckDBPyConnection, tables: list[str], rollout_id: str, event_id: str | None) -> list[DatasetUse]:
    if DATASET_LINEAGE_TABLE not in tables:
        return []
    rows = con.execute(
        f"""SELECT dataset, version, list_contains(call_event_ids || reward_event_ids, ?) FROM {DATASET_LINEAGE_TABLE}
            WHERE rollout_id = ? ORDER BY dataset, version""",
        [event_id, rollout_id],
    ).fetchall()
    return [DatasetUse(d, int(v), bool(hit) if event_id is not None else None) for d, v, hit in rows]


def _scoped(con: duckdb.DuckDBPyConnection, tables: list[str], column: str, ref: str,
            tenant: str | None) -> pa.Table | None:
    """Events whose ``column`` is ``ref`` (of ``tenant``); ``AmbiguousId`` when several tenants match and none is given."""
    if tenant is not None:
        return _events(con, tables, f"{column} = ? AND tenant = ?", [ref, tenant])
    events = _events(con, tables, f"{column} = ?", [ref])
    tenants = sorted(set(events["tenant"].to_pylist())) if events is not None else []
    if len(tenants) > 1:
        what = column.removesuffix("_id")
        raise AmbiguousId(f"{what} id {ref!r} is used by tenants {', '.join(tenants)}: pass --tenant to pick one")
    return events


def _rollout(con: duckdb.DuckDBPyConnection, tables: list[str], rollout_id: str, tenant: str | None) -> Lineage | None:
    events = _scoped(con, tables, "rollout_id", rollout_id, tenant)
    held = events is not None and events.num_rows > 0
    uses = _uses(con, tables, rollout_id, None) if held or tenant is None else []
    if not held and not uses:
        return None
    return Lineage("rollout", rollout_id, uses, _checkpoints(con, tables, uses), [rollout_id], events)


def _event(con: duckdb.DuckDBPyConnection, tables: list[str], event_id: str, tenant: str | None) -> Lineage | None:
    events = _scoped(con, tables, "event_id", event_id, tenant)
    if events is None or events.num_rows == 0:
        return None
    rollout_id = events["rollout_id"][0].as_py()
    uses = _uses(con, tables, rollout_id, event_id)
    return Lineage("event", event_id, uses, _checkpoints(con, tables, uses), [rollout_id], events)
