"""Ingest throughput: broker -> committed Delta rows, against a raw consume + Parquet baseline.

One run, one embedded broker (tansu), the workload generator's events on a
4-partition topic. Two readers take turns over the same messages:

* **baseline**: the same kafka-python consumer settings, no validation, no
  dedupe; each batch of raw messages (value, key, partition, offset) is written
  as one plain Parquet file with pyarrow.
* **ingester**: ``ingest.ingester.run_ingester`` into a fresh lake (validation,
  dedupe, events + typed tables + quarantine, one Delta commit per table per
  batch with transaction markers), timed until its last batch is committed.

Rounds alternate (baseline, ingester, baseline, ...) so drift on a shared
machine hits both; the median of each side is reported. Goal (issue): the
ingester reaches at least 70% of the baseline's events/s.

    .venv/bin/python -m bench ingest              # ~1-2 min on 2 cores
    .venv/bin/python bench/ingest/run.py --tasks 40 --rounds 3

Writes bench/ingest/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from devkit.broker import EmbeddedBroker  # noqa: E402
from ingest.consumer import AssignmentFlag, open_consumer, seek  # noqa: E402
from ingest.ingester import IngesterConfig, IngestStats, run_ingester  # noqa: E402
from devkit.workload import WorkloadConfig, generate_events  # noqa: E402

TOPIC = "bench.events"
PARTITIONS = (0, 1, 2, 3)
GOAL = 0.70


@dataclass(frozen=True)
class Run:
    side: str
    seconds: float
    cpu_seconds: float
    """CPU time of this process (all its threads) during the run: robust to a busy shared machine."""
    messages: int
    bytes: int

    @property
    def events_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def events_per_cpu_s(self) -> float:
        return self.messages / self.cpu_seconds


def produce_workload(bootstrap_servers: str, *, tasks: int, rollouts: int, seed: int) -> tuple[int, int]:
    """Send the workload's events (key = rollout_id); returns (messages, value bytes)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=20, batch_size=1 << 20,
                             max_request_size=64 << 20)
    n = size = 0
    for event in generate_events(WorkloadConfig(tasks=tasks, rollouts_per_task=rollouts, seed=seed)):
        value = json.dumps(event, separators=(",", ":")).encode()
        producer.send(TOPIC, key=event["rollout_id"].encode(), value=value)
        n, size = n + 1, size + len(value)
    producer.flush()
    producer.close()
    return n, size


def baseline(bootstrap_servers: str, out: Path, *, expected: int, batch_max_events: int) -> Run:
    """Consume everything and write raw Parquet files, one per batch."""
    start, cpu = time.perf_counter(), time.process_time()
    consumer = open_consumer(bootstrap_servers, TOPIC, group=None, partitions=PARTITIONS, flag=AssignmentFlag())
    seek(consumer, TOPIC, {p: None for p in PARTITIONS})
    got = size = files = 0
    while got < expected:
        records = [r for rs in consumer.poll(timeout_ms=200, max_records=batch_max_events).values() for r in rs]
        if not records:
            continue
        table = pa.table({
            "value": pa.array([r.value for r in records], pa.binary()),
            "key": pa.array([r.key for r in records], pa.binary()),
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
        })
        pq.write_table(table, out / f"part-{files:05d}.parquet")
        got, size, files = got + len(records), size + sum(len(r.value) for r in records), files + 1
    consumer.close()
    return Run("baseline", time.perf_counter() - start, time.process_time() - cpu, got, size)


def ingester(bootstrap_servers: str, lake: Path, *, expected: int, batch_max_events: int) -> Run:
    """Run the real ingester until it has committed every message."""
    stop = threading.Event()

    def done(stats: IngestStats) -> None:
        if stats.consumed >= expected:
            stop.set()

    config = IngesterConfig(lake=str(lake), bootstrap_servers=bootstrap_servers, topic=TOPIC, group="bench",
                            partitions=PARTITIONS, batch_max_events=batch_max_events)
    start, cpu = time.perf_counter(), time.process_time()
    stats = run_ingester(config, stop, on_progress=done)
    return Run("ingester", time.perf_counter() - start, time.process_time() - cpu, stats.consumed, stats.bytes)


def median_run(runs: list[Run]) -> Run:
    return Run(runs[0].side, statistics.median(r.seconds for r in runs),
               statistics.median(r.cpu_seconds for r in runs), runs[0].messages, runs[0].bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=30, help="workload tasks (x rollouts each)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per task")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    parser.add_argument("--batch-max-events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    runs: dict[str, list[Run]] = {"baseline": [], "ingester": []}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        broker.create_topic(TOPIC, partitions=len(PARTITIONS))
        messages, size = produce_workload(broker.bootstrap_servers, tasks=args.tasks, rollouts=args.rollouts,
                                          seed=args.seed)
        print(f"produced {messages:,} events ({size / 1e6:,.1f} MB) on {len(PARTITIONS)} partitions", flush=True)
        for i in range(args.rounds):
            for side, fn in (("baseline", baseline), ("ingester", ingester)):
                out = Path(tmp) / f"{side}-{i}"
                out.mkdir()
                run = fn(broker.bootstrap_servers, out, expected=messages, batch_max_events=args.batch_max_events)
                runs[side].append(run)
                print(f"round {i + 1} {side:9s} {run.seconds:6.2f} s  {run.events_per_s:9,.0f} events/s  "
                      f"{run.mb_per_s:6.1f} MB/s  ({run.cpu_seconds:5.2f} CPU s)", flush=True)
    base, ours = median_run(runs["baseline"]), median_run(runs["ingester"])
    ratio = ours.events_per_s / base.events_per_s
    cpu_ratio = ours.events_per_cpu_s / base.events_per_cpu_s
    verdict = "meets" if ratio >= GOAL else "MISSES"
    print(f"\nmedian  baseline {base.events_per_s:,.0f} events/s {base.mb_per_s:.1f} MB/s | ingester "
          f"{ours.events_per_s:,.0f} events/s {ours.mb_per_s:.1f} MB/s | ratio {ratio:.2f} ({verdict} the {GOAL:.0%} goal)"
          f" | per CPU second: ratio {cpu_ratio:.2f}")
    result = {
        "bench": "ingest", "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "workload": {"tasks": args.tasks, "rollouts_per_task": args.rollouts, "seed": args.seed,
                     "events": messages, "bytes": size, "partitions": len(PARTITIONS)},
        "batch_max_events": args.batch_max_events, "rounds": args.rounds,
        **{side: {"events_per_s": r.events_per_s, "mb_per_s": r.mb_per_s, "events_per_cpu_s": r.events_per_cpu_s,
                  "seconds": [x.seconds for x in runs[side]], "cpu_seconds": [x.cpu_seconds for x in runs[side]]}
           for side, r in (("baseline", base), ("ingester", ours))},
        "ratio": ratio, "cpu_ratio": cpu_ratio, "goal": GOAL,
    }
    (Path(__file__).parent / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
