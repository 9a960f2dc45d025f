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

The floor (issue 14: why 0.70x of the baseline is or is not within reach) is
measured beside the stages: Arrow-native JSON readers (Polars' NDJSON reader,
pyarrow's JSON reader, each with an explicit schema of the envelope and the
token arrays: less than the columnar decode parses, so a lower bound for a
native decoder) against the columnar decode; the baseline's own work per batch
(``run.write_raw``: raw messages -> one Parquet file) in the same process; and
the commits split: ``events`` alone, ``events`` with its token arrays null
(one home for the arrays: the typed LLM tables), the typed tables alone and
with their token arrays null (the other home). The summary adds each design's
stages and prints baseline / design: the stages alone, and as run.py's figure
would be (``--baseline-us``: run.py's baseline CPU per event; what it spends
beside its write, consume and librdkafka's threads, the ingester spends too).
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

import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.json as pa_json  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.ingest.run import WORKLOADS, allocators_configured, configure_and_restart, write_raw  # noqa: E402
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

BASELINE_US = 32.0
"""run.py's baseline, CPU us/event in all (consume, librdkafka's threads, its write, the process): 31-34 on
2026-12-03 (quiet, full_prompt). What it spends beside its write, the ingester spends too (same consumer)."""


def timed(label: str, n: int, work: Callable[[], Any], *, rounds: int = ROUNDS) -> tuple[Any, float]:
    """Run ``work`` ``rounds`` times; print its least CPU and wall microseconds per event; return its result and
    that CPU."""
    best_cpu = best_wall = float("inf")
    for _ in range(rounds):
        cpu, wall = time.process_time(), time.perf_counter()
        result = work()
        best_cpu, best_wall = min(best_cpu, time.process_time() - cpu), min(best_wall, time.perf_counter() - wall)
    print(f"{label:40s} {best_cpu / n * 1e6:7.1f} us CPU/event  {best_wall / n * 1e6:7.1f} us wall/event")
    return result, best_cpu / n * 1e6


def batch_decode(records: list[Record]) -> Any:
    batch = Batch()
    batch.add(records)
    return batch.decode(SeenEventIds(), max_event_bytes=1 << 22)


def commit(tables: list[tuple[str, pa.Schema, pa.Table]], last: dict[int, int]) -> None:
    """Commit each (name, schema, rows) into a fresh lake, one after another, as ``MarkedTable`` commits."""
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        lake = Lake(tmp)
        marked = [(MarkedTable(lake, name, schema, group="bench", topic="bench"), rows) for name, schema, rows in tables]
        for table, _ in marked:
            table.load(PARTITIONS)
        for table, rows in marked:
            table.commit(rows, last, refresh_offsets=50_000)


def typed_list(typed: dict[str, pa.Table]) -> list[tuple[str, pa.Schema, pa.Table]]:
    """The seven typed tables as ``commit`` takes them (an empty table for a type the batch lacks)."""
    return [(name, schema, typed.get(name, schema.empty_table())) for name, schema in TYPED_TABLES.values()]


TOKEN_ARRAYS = frozenset({"token_ids", "prompt_token_ids", "response_token_ids", "logprobs"})
"""The token-array columns of ``events`` and the typed LLM tables."""


def without_tokens(rows: pa.Table) -> pa.Table:
    """``rows`` with every token-array column null: what a table would write if the arrays had their home elsewhere
    (same schema; the columns stay, empty)."""
    for i, f in enumerate(rows.schema):
        if f.name in TOKEN_ARRAYS:
            rows = rows.set_column(i, f, pa.nulls(rows.num_rows, f.type))
    return rows


def parquet_bytes(tables: list[Any]) -> int:
    """Encode each table as Parquet in memory, as the lake writes it (zstd level 1, no dictionaries)."""
    size = 0
    for table in tables:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd", compression_level=1, use_dictionary=False)
        size += sink.tell()
    return size


_STRING = pa.string()
NATIVE_SCHEMA = pa.schema({
    **{name: _STRING for name in ("event_id", "type", "ts", "tenant", "task_id", "rollout_id", "span_id",
                                  "parent_span_id")},
    **{name: pa.int64() for name in ("schema_version", "attempt", "seq")},
    "harness": pa.struct({"name": _STRING, "version": _STRING, "config_hash": _STRING}),
    "payload": pa.struct({"prompt_token_ids": pa.list_(pa.int64()), "response_token_ids": pa.list_(pa.int64()),
                          "logprobs": pa.list_(pa.float64())}),
})
"""What the native readers parse: the envelope and the token arrays (as JSON gives them: int64 / float64); the
payload's other fields are skipped, so they do less than the columnar decode (which also checks and keeps them)."""


def polars_ndjson(blob: bytes) -> Any:
    return pl.read_ndjson(io.BytesIO(blob), schema=pl.from_arrow(NATIVE_SCHEMA.empty_table()).schema)


def pyarrow_json(blob: bytes) -> Any:
    options = pa_json.ParseOptions(explicit_schema=NATIVE_SCHEMA, unexpected_field_behavior="ignore")
    return pa_json.read_json(io.BytesIO(blob), parse_options=options,
                             read_options=pa_json.ReadOptions(use_threads=False, block_size=1 << 20))


def baseline_write(records: list[Record], batch: int) -> None:
    """run.py's baseline after its poll: the raw messages, ``batch`` at a time, each batch one Parquet file."""
    with tempfile.TemporaryDirectory(prefix="bench-stages-raw-") as tmp:
        for i in range(0, len(records), batch):
            write_raw(records[i:i + batch], Path(tmp) / f"part-{i:08d}.parquet")


def floor_summary(us: dict[str, float], baseline_us: float) -> None:
    """The least each design can cost per event (the sum of its measured stages), as baseline / design: the stages
    alone (the baseline's write against them), and as run.py's figure would be (``baseline_us`` against the
    design plus what the baseline spends beside its write: the same consumer's cost, which the ingester pays too)."""
    decode, rows, typed_rows = us["Batch.decode"], us["typed rows"], us["typed rows, no token arrays"]
    native = min(us["decode: polars NDJSON"], us["decode: pyarrow JSON"])
    designs = {
        "today (arrays in events and typed tables)": decode + rows + us["commit: events"]
        + us["commit: typed tables"],
        "arrays only in the typed LLM tables": decode + rows + us["commit: events, no token arrays"]
        + us["commit: typed tables"],
        "arrays only in events": decode + typed_rows + us["commit: events"]
        + us["commit: typed tables, no token arrays"],
        "typed-table home, native reader for decode and events rows": native + rows
        + us["commit: events, no token arrays"] + us["commit: typed tables"],
        "typed-table home, decode and rows free (commits only)": us["commit: events, no token arrays"]
        + us["commit: typed tables"],
    }
    write = us["baseline: raw values -> Parquet"]
    shared = max(0.0, baseline_us - write)
    print(f"\nfloor, baseline / design (goal 0.70): the stages alone (baseline: its write, {write:.1f} us/event), and "
          f"with the {shared:.1f} us/event the baseline spends beside its write (run.py's {baseline_us:.0f} less it)")
    for name, cost in designs.items():
        print(f"  {name:60s} {cost:6.1f} us/event  {write / cost:5.2f}x  {baseline_us / (cost + shared):5.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10, help="workload tasks (x 8 rollouts each)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="full_prompt", help="as in run.py")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--allocators", choices=("configured", "default"), default="configured",
                        help="the ingester's allocator settings (ingest.allocators) or the libraries' defaults")
    parser.add_argument("--batch", type=int, default=20_000, help="events per batch of the baseline's write (run.py's)")
    parser.add_argument("--baseline-us", type=float, default=BASELINE_US,
                        help="run.py's baseline CPU us/event for this workload, for the floor summary")
    args = parser.parse_args(argv)
    if args.allocators == "configured" and not allocators_configured():
        configure_and_restart()

    workload = WORKLOADS[args.workload]
    events = [e for e in generate_events(workload.config(args.tasks, args.seed)) if workload.keep(e)]
    values = [json.dumps(e, separators=(",", ":")).encode() for e in events]
    n = len(values)
    print(f"{n:,} events, {sum(map(len, values)) / n:,.0f} bytes each on average")
    coordinates = [KafkaCoordinates("bench", PARTITIONS[i % len(PARTITIONS)], i) for i in range(n)]
    records = [Record("bench", c.partition, c.offset, e["rollout_id"].encode(), v)
               for c, e, v in zip(coordinates, events, values)]
    us: dict[str, float] = {}

    def stage(label: str, work: Callable[[], Any], *, rounds: int = ROUNDS) -> Any:
        result, us[label] = timed(label, n, work, rounds=rounds)
        return result

    gc.disable()
    stage("decode: pydantic contract", lambda: [decode_event(v) for v in values], rounds=1)
    fast = stage("decode: msgspec, token lists", lambda: decode_batch(values))
    if None in fast:
        raise SystemExit("the fast path refused a workload event: run tests/schemas/test_fast_decode.py")
    stage("events rows from token lists", lambda: events_table(fast, coordinates))
    columnar = stage("decode: msgspec, tokens to NumPy", lambda: decode_batch_columnar(values))
    if None in columnar.events:
        raise SystemExit("the columnar path refused a workload event: run tests/schemas/test_fast_tokens.py")
    stage("events rows, tokens and ts in Arrow", lambda: events_table(
        columnar.events, coordinates, tokens=columnar.tokens.pick(list(range(n))), ts=columnar.timestamps(range(n))))
    blob = b"\n".join(values)
    stage("decode: polars NDJSON", lambda: polars_ndjson(blob))
    stage("decode: pyarrow JSON", lambda: pyarrow_json(blob))
    rows = stage("Batch.decode", lambda: batch_decode(records)).events
    typed = stage("typed rows", lambda: typed_tables(rows))
    stage("typed rows, no token arrays", lambda: typed_tables(without_tokens(rows)))
    stage("Parquet encode only (all tables)", lambda: parquet_bytes([rows, *typed.values()]))
    stage("baseline: raw values -> Parquet", lambda: baseline_write(records, args.batch))
    last = {p: n for p in PARTITIONS}
    bare = without_tokens(rows)
    stage("commit: events", lambda: commit([(EVENTS_TABLE, EVENTS, rows)], last))
    stage("commit: events, no token arrays", lambda: commit([(EVENTS_TABLE, EVENTS, bare)], last))
    stage("commit: typed tables", lambda: commit(typed_list(typed), last))
    stage("commit: typed tables, no token arrays",
          lambda: commit(typed_list({name: without_tokens(t) for name, t in typed.items()}), last))
    stage("Delta commits (8 tables)", lambda: commit([(EVENTS_TABLE, EVENTS, rows), *typed_list(typed)], last))
    floor_summary(us, args.baseline_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
