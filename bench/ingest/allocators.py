"""The ingester under allocator settings (``ingest.allocators``), each alone and together: CPU and peak RSS.

One embedded broker and one produced workload; each round runs one fresh ingester process per
variant over the same messages (order rotating between rounds), with the variant's settings in
its environment before Arrow and delta-rs load (as ``ingest.allocators.configure`` sets them)
and every other allocator variable removed. Each process runs ``run.ingester`` (the real
ingester, into a fresh lake, until every message is committed) and reports CPU seconds, wall
seconds and peak RSS. Ratios, median over rounds: CPU per event and peak RSS, variant / the
libraries' defaults (lower is better for both).

    .venv/bin/python bench/ingest/allocators.py --rounds 3      # -> bench/ingest/allocators.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ingest.allocators import ENVIRONMENT, GLIBC_ARENAS, GLIBC_MMAP_THRESHOLD  # noqa: E402

JEMALLOC_DECAY_1S = "dirty_decay_ms:1000,muzzy_decay_ms:0"
"""jemalloc's settings before its arenas were capped (``ingest.allocators.JEMALLOC_ARENAS``)."""
CONFIGURED = {**ENVIRONMENT, "MALLOC_ARENA_MAX": str(GLIBC_ARENAS), "MALLOC_MMAP_THRESHOLD_": str(GLIBC_MMAP_THRESHOLD)}
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "glibc_arenas": {"MALLOC_ARENA_MAX": str(GLIBC_ARENAS)},
    "arrow_system_pool": {"ARROW_DEFAULT_MEMORY_POOL": ENVIRONMENT["ARROW_DEFAULT_MEMORY_POOL"]},
    "jemalloc_decay_1s": {"_RJEM_MALLOC_CONF": JEMALLOC_DECAY_1S},
    "jemalloc_no_tcache_decay_0": {"_RJEM_MALLOC_CONF": "tcache:false,dirty_decay_ms:0,muzzy_decay_ms:0"},
    "configured_before_mmap_threshold": {**ENVIRONMENT, "MALLOC_ARENA_MAX": str(GLIBC_ARENAS)},
    "configured_before_jemalloc_arenas": {**CONFIGURED, "_RJEM_MALLOC_CONF": JEMALLOC_DECAY_1S},
    "configured": CONFIGURED,
}
"""Environment of each variant; ``configured`` is what ``ingest.allocators.configure`` sets. Without jemalloc's
thread caches and with decay 0 (the settings tried first) its CPU per event was 1.46x the defaults'."""
ALLOCATOR_VARIABLES = {name for env in VARIANTS.values() for name in env}


def child(bootstrap_servers: str, topic: str, expected: int, lake: str) -> None:
    """One ingester run in this fresh process; prints its figures as JSON."""
    from bench.ingest.run import ingester

    run = ingester(bootstrap_servers, topic, Path(lake), expected=expected, batch_max_events=20_000)
    print(json.dumps({"seconds": run.seconds, "cpu_seconds": run.cpu_seconds, "messages": run.messages,
                      "peak_rss_mb": run.peak_rss_mb}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="full_prompt workload tasks (x 8 rollouts each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "allocators.json"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--child", nargs=4, metavar=("BOOTSTRAP", "TOPIC", "EXPECTED", "LAKE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        bootstrap, topic, expected, lake = args.child
        child(bootstrap, topic, int(expected), lake)
        return 0
    variants = ["default", *(v for v in args.variants.split(",") if v != "default")]
    unknown = set(variants) - VARIANTS.keys()
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}: choose from {', '.join(VARIANTS)}")

    from bench.ingest.run import PARTITIONS, WORKLOADS, produce_workload
    from bench.results import Ratio, Recorder
    from devkit.broker import EmbeddedBroker

    recorder = Recorder("ingest_allocators", "the ingester under allocator settings (2 glibc arenas, Arrow's system "
                                             "pool, jemalloc's decay 1 s, its 2 arenas; each alone, together as "
                                             "configured, and jemalloc without thread caches) vs the libraries' "
                                             "defaults, fresh processes over the same full_prompt events")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    topic = "bench.allocators"
    base_env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-allocators-") as tmp:
        broker.create_topic(topic, partitions=len(PARTITIONS))
        messages, _, _ = produce_workload(broker.bootstrap_servers, topic, WORKLOADS["full_prompt"], tasks=args.tasks,
                                          seed=args.seed)
        print(f"produced {messages:,} full_prompt events", flush=True)
        for i in range(args.rounds):
            for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", broker.bootstrap_servers, topic, str(messages),
                     str(Path(tmp) / f"lake-{variant}-{i}")], capture_output=True, text=True, cwd=REPO,
                    env={**base_env, **VARIANTS[variant]})
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    return 1
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs[variant].append(run)
                print(f"  round {i + 1} {variant:27s} {run['seconds']:6.2f} s {run['cpu_seconds'] / run['messages'] * 1e6:5.0f} "
                      f"CPU us/event, peak RSS {run['peak_rss_mb']:,.0f} MB", flush=True)
    ratios = []
    for variant in variants[1:]:
        pairs = list(zip(runs["default"], runs[variant]))
        ratios += [Ratio(f"{variant}_cpu", f"CPU per event, {variant} / defaults",
                         [v["cpu_seconds"] / d["cpu_seconds"] for d, v in pairs], better="lower"),
                   Ratio(f"{variant}_peak_rss", f"peak RSS, {variant} / defaults",
                         [v["peak_rss_mb"] / d["peak_rss_mb"] for d, v in pairs], better="lower")]
    us = {v: statistics.median(r["cpu_seconds"] / r["messages"] * 1e6 for r in rs) for v, rs in runs.items()}
    peak = {v: statistics.median(r["peak_rss_mb"] for r in rs) for v, rs in runs.items()}
    recorder.write(ratios=ratios, summary=f"{messages:,} events; CPU us/event, peak RSS MB (medians): " + ", ".join(
                       f"{v} {us[v]:.0f}, {peak[v]:,.0f}" for v in variants),
                   detail={"events": messages, "rounds": args.rounds, "tasks": args.tasks,
                           "environments": {v: VARIANTS[v] for v in variants}, "runs": runs},
                   path=Path(args.out))
    for r in ratios:
        print(f"{r.label}: {r.value:.3f} (rounds: {', '.join(f'{x:.3f}' for x in r.runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
