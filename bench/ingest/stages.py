"""Where the ingester's CPU goes, stage by stage, without Kafka: per-event CPU microseconds.

The same workload events as ``run.py``, as Kafka would hand them over (bytes),
through each stage of a batch: decode (the msgspec fast path, and the pydantic
contract path it replaces for comparison), ``events`` rows, typed rows, and
the Delta commits of all eight tables into a fresh lake.

    .venv/bin/python bench/ingest/stages.py              # ~20 s on 2 cores
    .venv/bin/python bench/ingest/stages.py --tasks 30

CPU time (``process_time``: all threads, so Rust writer threads count) is
printed per stage; on a shared machine it is steadier than wall time. The
cycle collector is paused throughout, as the ingester pauses it per batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from devkit.workload import WorkloadConfig, generate_events  # noqa: E402
from schemas.fast import decode_batch  # noqa: E402
from schemas.fast_tokens import decode_batch_columnar  # noqa: E402
from schemas.tables import EVENTS, EVENTS_TABLE, TYPED_TABLES  # noqa: E402
from schemas.versions import decode_event  # noqa: E402
from store.commit import MarkedTable  # noqa: E402
from store.event_rows import KafkaCoordinates, events_table, typed_tables  # noqa: E402
from store.lake import Lake  # noqa: E402

PARTITIONS = (0, 1, 2, 3)


def timed(label: str, n: int, work: Callable[[], Any]) -> Any:
    """Run ``work`` once; print its CPU and wall microseconds per event."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = work()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{label:28s} {cpu / n * 1e6:7.1f} us CPU/event  {wall / n * 1e6:7.1f} us wall/event")
    return result


def commit_all(lake: Lake, events: Any, typed: dict[str, Any], last: dict[int, int]) -> None:
    tables = [MarkedTable(lake, EVENTS_TABLE, EVENTS, group="bench", topic="bench")]
    tables += [MarkedTable(lake, name, schema, group="bench", topic="bench") for name, schema in TYPED_TABLES.values()]
    for table in tables:
        table.load(PARTITIONS)
    for table in tables:
        rows = events if table.name == EVENTS_TABLE else typed.get(table.name, table.schema.empty_table())
        table.commit(rows, last, refresh_offsets=50_000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10, help="workload tasks (x rollouts each)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per task")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    config = WorkloadConfig(tasks=args.tasks, rollouts_per_task=args.rollouts, seed=args.seed)
    values = [json.dumps(e, separators=(",", ":")).encode() for e in generate_events(config)]
    n = len(values)
    print(f"{n:,} events, {sum(map(len, values)) / n:,.0f} bytes each on average")
    coordinates = [KafkaCoordinates("bench", PARTITIONS[i % len(PARTITIONS)], i) for i in range(n)]
    gc.disable()
    timed("decode: pydantic contract", n, lambda: [decode_event(v) for v in values])
    fast = timed("decode: msgspec, token lists", n, lambda: decode_batch(values))
    if None in fast:
        raise SystemExit("the fast path refused a workload event: run tests/schemas/test_fast_decode.py")
    timed("events rows from token lists", n, lambda: events_table(fast, coordinates))
    columnar = timed("decode: msgspec, tokens->Arrow", n, lambda: decode_batch_columnar(values))
    if None in columnar.events:
        raise SystemExit("the columnar path refused a workload event: run tests/schemas/test_fast_tokens.py")
    events = timed("events rows, tokens in Arrow", n, lambda: events_table(
        columnar.events, coordinates, tokens=columnar.tokens.pick(list(range(n)))))
    typed = timed("typed rows", n, lambda: typed_tables(events))
    last = {p: n for p in PARTITIONS}
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        timed("Delta commits (8 tables)", n, lambda: commit_all(Lake(tmp), events, typed, last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
