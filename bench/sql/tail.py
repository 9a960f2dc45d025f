"""A recent tail for a bench lake: what the ingester appends after the scheduler's compact last ran.

Draws ``rollouts`` new rollouts with the fast generator (``fast_lake.py``, another seed, its clock started
after the lake's last rollout: new rollout ids sort after the lake's, as UUIDv7 ids of later rollouts do) into a
scratch lake, then appends them to the lake in ``commits`` commits per typed table with Kafka offsets past the
lake's (as the ingester would), plus ``replays`` producer resends of responses already in the lake (same
event ids: the views must collapse them, and their rollouts are recomputed). ``bench/sql/lake.py`` builds
the ``tail`` lake with it.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa

from bench.sql.fast_lake import SCHEMAS, FastLakeConfig, write_lake
from schemas.tables import LLM_RESPONSES_TABLE, ROLLOUT_STARTS_TABLE
from store.lake import Lake
from store.prejoin import SOURCES
from store.sql import delta_extension_path


def append_tail(root: Path, *, rollouts: int, commits: int, replays: int, seed: int) -> dict[str, int]:
    """Append the tail to the lake at ``root``; returns rows appended per table and the commits made."""
    lake = Lake(str(root))
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.load_extension(delta_extension_path())
    next_offset = 1 + max(con.execute(f"SELECT max(kafka_offset) FROM delta_scan('{root / name}')").fetchone()[0]
                          for name in SOURCES if lake.exists(name))
    replayed = con.execute(f"SELECT * FROM delta_scan('{root / LLM_RESPONSES_TABLE}') LIMIT {replays}").to_arrow_table()
    (last_ms,) = con.execute(f"SELECT epoch_ms(max(ts)) FROM delta_scan('{root / ROLLOUT_STARTS_TABLE}')").fetchone()
    con.close()
    config = FastLakeConfig.for_rollouts(rollouts, seed=seed, per_commit=rollouts)
    config = replace(config, workload=config.workload.model_copy(update={"start_ms": int(last_ms) + 1_000}))
    with tempfile.TemporaryDirectory() as scratch:
        write_lake(scratch, config, rollouts=rollouts, workers=0)
        new = {name: Lake(scratch).read(name) for name in SOURCES if Lake(scratch).exists(name)}
    new[LLM_RESPONSES_TABLE] = pa.concat_tables([new[LLM_RESPONSES_TABLE],
                                                 replayed.select(new[LLM_RESPONSES_TABLE].column_names)
                                                 .cast(new[LLM_RESPONSES_TABLE].schema)])
    appended: dict[str, int] = {"commits": 0}
    columns: dict[str, set[str]] = {}
    for i in range(commits):
        for name, rows in new.items():
            size = -(-rows.num_rows // commits)
            part = rows.slice(i * size, size)
            if not part.num_rows:
                continue
            offsets = pa.array(range(next_offset, next_offset + part.num_rows), pa.int64())
            next_offset += part.num_rows
            part = part.set_column(part.schema.get_field_index("kafka_offset"), "kafka_offset", offsets)
            columns[name] = columns.get(name) or set(lake.table(name).schema().to_arrow().names)
            kept = [f.name for f in SCHEMAS[name] if f.name in columns[name]]  # a lake from before added columns
            lake.append(name, part.select(kept), schema=pa.schema([SCHEMAS[name].field(c) for c in kept]))
            appended[name] = appended.get(name, 0) + part.num_rows
        appended["commits"] += 1
    appended["replayed_responses"] = replayed.num_rows
    return appended
