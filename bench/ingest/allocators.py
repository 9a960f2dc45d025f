"""The ingester with and without its allocator settings (``ingest.allocators``): CPU, events/s and peak RSS.

One embedded broker and one produced workload; rounds alternate two fresh ingester processes
over the same messages, one that applies ``ingest.allocators.configure()`` before it imports
Arrow and delta-rs (as ``trajlake ingest`` does) and one that runs with the libraries' defaults.
Each process runs ``run.ingester`` (the real ingester, into a fresh lake, until every message is
committed) and reports CPU seconds, wall seconds and peak RSS. The ratios (median over rounds):
CPU per event, with / without (the cost of the settings; lower is better) and events/s,
with / without.

    .venv/bin/python bench/ingest/allocators.py --rounds 3      # -> bench/ingest/allocators.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SIDES = ("default", "configured")


def child(side: str, bootstrap_servers: str, topic: str, expected: int, lake: str) -> None:
    """One ingester run in this fresh process; prints its figures as JSON."""
    if side == "configured":
        from ingest.allocators import configure

        late = configure()
        if late:
            raise SystemExit(f"allocator settings applied too late: {', '.join(late)}")
    from bench.ingest.run import PARTITIONS, ingester

    run = ingester(bootstrap_servers, topic, Path(lake), expected=expected, batch_max_events=20_000)
    print(json.dumps({"side": side, "seconds": run.seconds, "cpu_seconds": run.cpu_seconds,
                      "messages": run.messages, "peak_rss_mb": run.peak_rss_mb, "partitions": len(PARTITIONS)}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="full_prompt workload tasks (x 8 rollouts each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "allocators.json"))
    parser.add_argument("--child", nargs=5, metavar=("SIDE", "BOOTSTRAP", "TOPIC", "EXPECTED", "LAKE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, bootstrap, topic, expected, lake = args.child
        child(side, bootstrap, topic, int(expected), lake)
        return 0

    from bench.ingest.run import PARTITIONS, WORKLOADS, produce_workload
    from bench.results import Ratio, Recorder
    from devkit.broker import EmbeddedBroker

    recorder = Recorder("ingest_allocators", "the ingester with its allocator settings (2 glibc arenas, Arrow's "
                                             "system pool, jemalloc without thread caches and with decay 0) vs "
                                             "without, fresh processes alternating over the same full_prompt events")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    topic = "bench.allocators"
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-allocators-") as tmp:
        broker.create_topic(topic, partitions=len(PARTITIONS))
        messages, _, _ = produce_workload(broker.bootstrap_servers, topic, WORKLOADS["full_prompt"], tasks=args.tasks,
                                          seed=args.seed)
        print(f"produced {messages:,} full_prompt events", flush=True)
        for i in range(args.rounds):
            for side in SIDES if i % 2 == 0 else reversed(SIDES):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", side, broker.bootstrap_servers, topic, str(messages),
                     str(Path(tmp) / f"lake-{side}-{i}")], capture_output=True, text=True, cwd=REPO)
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    return 1
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs[side].append(run)
                print(f"  round {i + 1} {side:10s} {run['seconds']:6.2f} s {run['messages'] / run['seconds']:7,.0f} "
                      f"events/s {run['cpu_seconds'] / run['messages'] * 1e6:5.0f} CPU us/event, peak RSS "
                      f"{run['peak_rss_mb']:,.0f} MB", flush=True)
    cpu = [c["cpu_seconds"] / d["cpu_seconds"] for d, c in zip(runs["default"], runs["configured"])]
    rate = [d["seconds"] / c["seconds"] for d, c in zip(runs["default"], runs["configured"])]
    rss = [c["peak_rss_mb"] / d["peak_rss_mb"] for d, c in zip(runs["default"], runs["configured"])]
    ratios = [Ratio("cpu", "CPU per event, with the settings / without", cpu, better="lower"),
              Ratio("events_per_s", "events/s, with the settings / without", rate),
              Ratio("peak_rss", "peak RSS, with the settings / without", rss, better="lower")]
    us = {side: statistics.median(r["cpu_seconds"] / r["messages"] * 1e6 for r in rs) for side, rs in runs.items()}
    peak = {side: statistics.median(r["peak_rss_mb"] for r in rs) for side, rs in runs.items()}
    recorder.write(ratios=ratios, summary=f"{messages:,} events; CPU {us['configured']:.0f} vs {us['default']:.0f} "
                   f"us/event, peak RSS {peak['configured']:,.0f} vs {peak['default']:,.0f} MB (medians)",
                   peak_rss_mb={f"ingester, {side}": max(r["peak_rss_mb"] for r in rs) for side, rs in runs.items()},
                   detail={"events": messages, "rounds": args.rounds, "tasks": args.tasks, "runs": runs},
                   path=Path(args.out))
    for r in ratios:
        print(f"{r.label}: {r.value:.3f} (rounds: {', '.join(f'{x:.3f}' for x in r.runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
