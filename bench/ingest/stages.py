"""Where the ingester's CPU goes, stage by stage, without Kafka: per-event CPU microseconds.

The same workload events as ``run.py``, as Kafka would hand them over (bytes),
through each stage of a batch: decode (the msgspec fast path, and the pydantic
contract path it replaces for comparison), ``events`` rows, the ingester's
whole batch decode (``Batch.decode``: validation, dedupe, ``events`` rows; the
dedupe loop is what it spends beyond the two stages before), typed rows,
Parquet encoding alone (pyarrow, the lake's codec) and the Delta commits of
all eight tables into a fresh lake. Kafka's consume is measured by ``run.py``.

    .venv/bin/python bench/ingest/stages.py              # ~20 s on 2 cores
    .venv/bin/python bench/ingest/stages.py --tasks 30
    .venv/bin/python bench/ingest/stages.py --workload large

CPU time (``process_time``: all threads, so Rust writer threads count) is
printed per stage, the least of 3 runs (the pydantic decode and the commits
run once); on a shared machine it is steadier than wall time. The
cycle collector is paused throughout, as the ingester pauses it per batch.
The process runs with the allocator settings ``trajlake ingest`` applies
(``ingest.allocators``; ``--allocators default`` for the libraries' own): they
change what a stage costs (glibc's fixed mmap threshold gives every buffer over
128 KB fresh pages, each a page fault when first written: typed rows 4.4 us user
+ 1.2 kernel per event with the defaults, 5.5 + 6.4 with the settings).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import pyarrow.parquet as pq  # noqa: E402

from bench.ingest.run import WORKLOADS, allocators_configured, configure_and_restart  # noqa: E402
from devkit.workload import generate_events  # noqa: E402
from ingest.batch import Batch  # noqa: E402
from ingest.consumer import Record  # noqa: E402
from ingest.dedupe import SeenEventIds  # noqa: E402
from schemas.fast import decode_batch  # noqa: E402
from schemas.fast_tokens import decode_batch_columnar  # noqa: E402
from schemas.tables import EVENTS, EVENTS_TABLE, TYPED_TABLES  # noqa: E402
from schemas.versions import decode_event  # noqa: E402
from store.commit import MarkedTable  # noqa: E402
from store.event_rows import KafkaCoordinates, events_table, typed_tables  # noqa: E402
from store.lake import Lake  # noqa: E402

PARTITIONS = (0, 1, 2, 3)


ROUNDS = 3
"""Each stage runs this many times; the least CPU is printed (a shared machine only ever adds time)."""


def timed(label: str, n: int, work: Callable[[], Any], *, rounds: int = ROUNDS) -> Any:
    """Run ``work`` ``rounds`` times; print its least CPU and wall microseconds per event."""
    best_cpu = best_wall = float("inf")
    for _ in range(rounds):
        cpu, wall = time.process_time(), time.perf_counter()
        result = work()
        best_cpu, best_wall = min(best_cpu, time.process_time() - cpu), min(best_wall, time.perf_counter() - wall)
    print(f"{label:36s} {best_cpu / n * 1e6:7.1f} us CPU/event  {best_wall / n * 1e6:7.1f} us wall/event")
    return result


def batch_decode(records: list[Record]) -> Any:
    batch = Batch()
    batch.add(records)
    return batch.decode(SeenEventIds(), max_event_bytes=1 << 22)


def commit_all(lake: Lake, events: Any, typed: dict[str, Any], last: dict[int, int]) -> None:
    tables = [MarkedTable(lake, EVENTS_TABLE, EVENTS, group="bench", topic="bench")]
    tables += [MarkedTable(lake, name, schema, group="bench", topic="bench") for name, schema in TYPED_TABLES.values()]
    for table in tables:
        table.load(PARTITIONS)
    for table in tables:
        rows = events if table.name == EVENTS_TABLE else typed.get(table.name, table.schema.empty_table())
        table.commit(rows, last, refresh_offsets=50_000)


def parquet_bytes(tables: list[Any]) -> int:
    """Encode each table as Parquet in memory, as the lake writes it (zstd level 1, no dictionaries)."""
    size = 0
    for table in tables:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd", compression_level=1, use_dictionary=False)
        size += sink.tell()
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10, help="workload tasks (x 8 rollouts each)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="full_prompt", help="as in run.py")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--allocators", choices=("configured", "default"), default="configured",
                        help="the ingester's allocator settings (ingest.allocators) or the libraries' defaults")
    args = parser.parse_args(argv)
    if args.allocators == "configured" and not allocators_configured():
        configure_and_restart()

    workload = WORKLOADS[args.workload]
    events = [e for e in generate_events(workload.config(args.tasks, args.seed)) if workload.keep(e)]
    values = [json.dumps(e, separators=(",", ":")).encode() for e in events]
    n = len(values)
    print(f"{n:,} events, {sum(map(len, values)) / n:,.0f} bytes each on average")
    coordinates = [KafkaCoordinates("bench", PARTITIONS[i % len(PARTITIONS)], i) for i in range(n)]
    gc.disable()
    timed("decode: pydantic contract", n, lambda: [decode_event(v) for v in values], rounds=1)
    fast = timed("decode: msgspec, token lists", n, lambda: decode_batch(values))
    if None in fast:
        raise SystemExit("the fast path refused a workload event: run tests/schemas/test_fast_decode.py")
    timed("events rows from token lists", n, lambda: events_table(fast, coordinates))
    columnar = timed("decode: msgspec, tokens to NumPy", n, lambda: decode_batch_columnar(values))
    if None in columnar.events:
        raise SystemExit("the columnar path refused a workload event: run tests/schemas/test_fast_tokens.py")
    timed("events rows, tokens and ts in Arrow", n, lambda: events_table(
        columnar.events, coordinates, tokens=columnar.tokens.pick(list(range(n))), ts=columnar.timestamps(range(n))))
    records = [Record("bench", c.partition, c.offset, e["rollout_id"].encode(), v)
               for c, e, v in zip(coordinates, events, values)]
    rows = timed("Batch.decode: the two above + dedupe", n, lambda: batch_decode(records)).events
    typed = timed("typed rows", n, lambda: typed_tables(rows))
    timed("Parquet encode only (all tables)", n, lambda: parquet_bytes([rows, *typed.values()]))
    last = {p: n for p in PARTITIONS}
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        timed("Delta commits (8 tables)", n, lambda: commit_all(Lake(tmp), rows, typed, last), rounds=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
