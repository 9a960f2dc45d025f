"""Build benchmark: build-dataset vs a naive per-call Python loop, at two input sizes, in one run.

Generates two lakes with the workload generator (``--rollouts`` and 4x that),
then runs each build in its own process and reports rollouts/s, tokens/s
(input tokens of the source tables), CPU seconds (user + sys, all threads:
fairer than wall time on a shared machine) and peak RSS (VmHWM).
The naive baseline (bench/build/naive.py) runs on the small lake (and on the
large one with ``--naive-on-both``); its sample and token counts must equal
the pipeline's. Prints a table and writes ``bench/build/results.json``.

    .venv/bin/python bench/build/run.py [--rollouts 400] [--naive-on-both] [--lakes DIR]

Goals (issue): >= 10x the naive baseline; peak RSS flat as the input grows 4x.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(kind: str, lake_root: str) -> None:
    """Run one build in this process and print its figures as JSON."""
    from naive import naive_build

    from pipelines import build_dataset
    from store.lake import Lake

    lake = Lake(lake_root)
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    if kind == "pipeline":
        counts = build_dataset(lake, "bench").manifest["counts"]
        figures = {"rollouts": counts["rollouts"]["in_dataset"], "samples": counts["samples"],
                   "tokens": counts["tokens"], "trained_tokens": counts["trained_tokens"]}
    else:
        figures = naive_build(lake, "bench_naive")
    figures["seconds"] = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    figures["cpu_seconds"] = after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime
    figures["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(figures))


def measure(kind: str, lake_root: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--lake", lake_root],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} build failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(lakes: Path, rollouts: int) -> tuple[str, dict]:
    from make_lake import make_lake

    root = lakes / f"lake-{rollouts}"
    stats_file = root / "bench-input.json"
    if not stats_file.exists():
        started = time.perf_counter()
        stats = make_lake(str(root), rollouts=rollouts)
        stats["generate_seconds"] = round(time.perf_counter() - started, 1)
        stats_file.write_text(json.dumps(stats))
    return str(root), json.loads(stats_file.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400, help="rollouts of the small lake (the large has 4x)")
    parser.add_argument("--naive-on-both", action="store_true", help="also run the naive baseline on the large lake")
    parser.add_argument("--lakes", type=Path, default=None, help="keep/reuse generated lakes here")
    parser.add_argument("--child", choices=["pipeline", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.lake)
        return
    lakes = args.lakes or Path(tempfile.mkdtemp(prefix="trajlake-bench-build-"))
    results = {"sizes": {}}
    for n in (args.rollouts, 4 * args.rollouts):
        root, stats = prepare(lakes, n)
        row = {"input": stats, "pipeline": measure("pipeline", root)}
        if n == args.rollouts or args.naive_on_both:
            row["naive"] = measure("naive", root)
            same = all(row["naive"][k] == row["pipeline"][k] for k in ("samples", "tokens", "trained_tokens"))
            row["same_output"] = same
            row["speedup"] = round(row["naive"]["seconds"] / row["pipeline"]["seconds"], 2)
            row["speedup_cpu"] = round(row["naive"]["cpu_seconds"] / row["pipeline"]["cpu_seconds"], 2)
        results["sizes"][str(n)] = row
        print_row(n, row)
    small, large = (results["sizes"][str(n)]["pipeline"] for n in (args.rollouts, 4 * args.rollouts))
    results["rss_growth_4x_input"] = round(large["peak_rss_mb"] / small["peak_rss_mb"], 2)
    print(f"peak RSS growth for 4x input: {results['rss_growth_4x_input']}x")
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def print_row(n: int, row: dict) -> None:
    tokens = row["input"]["tokens"]
    for kind in ("pipeline", "naive"):
        if kind in row:
            r = row[kind]
            print(f"{n:>6} rollouts {tokens / 1e6:6.1f}M input tokens  {kind:<8} {r['seconds']:7.2f} s "
                  f"(cpu {r['cpu_seconds']:6.2f} s)  "
                  f"{r['rollouts'] / r['seconds']:8.1f} rollouts/s  {tokens / r['seconds'] / 1e6:6.2f}M tokens/s  "
                  f"peak RSS {r['peak_rss_mb']:7.0f} MB  samples {r['samples']}")
    if "speedup" in row:
        print(f"        speedup {row['speedup']}x wall, {row['speedup_cpu']}x cpu; same output: {row['same_output']}")


if __name__ == "__main__":
    main()
