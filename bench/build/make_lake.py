"""A bench lake from the workload generator: typed tables written as the ingester would.

Events are validated with the wire contract, deduplicated by event_id and
converted with ``store.event_rows`` (the ingester's own conversion), then
appended 100 rollouts per commit. Kafka coordinates are synthetic (one
partition, offsets in emission order). The ``events`` table is not written:
a build reads only the typed tables.
"""

from __future__ import annotations

import pyarrow.compute as pc

from devkit.workload import WorkloadConfig, generate_rollouts
from schemas.events import EVENT_ADAPTER
from schemas.tables import TYPED_TABLES
from store.event_rows import KafkaCoordinates, events_table, typed_tables
from store.lake import Lake

SCHEMAS = {name: schema for name, schema in TYPED_TABLES.values()}


def make_lake(root: str, *, rollouts: int, seed: int = 0, per_commit: int = 100) -> dict[str, int]:
    """Write ``rollouts`` generated rollouts (8 per task) under ``root``; returns event and token counts."""
    config = WorkloadConfig(tasks=max(1, rollouts // 8), rollouts_per_task=min(8, rollouts), seed=seed)
    lake, seen, pending = Lake(root), set(), []
    totals = {"events": 0, "tokens": 0}
    for i, rollout in enumerate(generate_rollouts(config), start=1):
        for event in rollout.events:
            if event["event_id"] not in seen:
                seen.add(event["event_id"])
                pending.append(EVENT_ADAPTER.validate_python(event))
        if i % per_commit == 0 or i == config.rollouts:
            _commit(lake, pending, totals)
            pending = []
    return totals


def _commit(lake: Lake, events: list, totals: dict[str, int]) -> None:
    offset = totals["events"]
    coords = [KafkaCoordinates("bench.events", 0, offset + j) for j in range(len(events))]
    table = events_table(events, coords)
    totals["events"] += len(events)
    totals["tokens"] += pc.sum(pc.list_value_length(table["token_ids"])).as_py() or 0
    for name, rows in typed_tables(table).items():
        lake.append(name, rows, schema=SCHEMAS[name])
