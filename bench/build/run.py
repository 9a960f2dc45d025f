"""Build benchmark: build-dataset vs a bare scan of its token columns and vs a naive Python loop, in one run.

Generates two lakes with the workload generator (``--rollouts`` and 4x that),
then, for ``--rounds`` rounds, runs on each lake, each in its own process and
timed after the imports: the bare scans (``scan.py``: every prompt/response id
and logprob read and summed, with Arrow and with DuckDB), the pipeline build,
the floor of any build that writes its output (``floor.py``: the Arrow scan
beside writing the rows the pipeline just built with the same writer), and
on the small lake the naive per-call loop (``naive.py``, whose sample and
token counts must equal the pipeline's). Ratios are per round (ours / a
baseline measured moments apart on the same machine), reported as medians:
wall time of the build / the faster scan (goal <= 2x, both sizes), the same
in CPU seconds (steadier on a loaded machine), the build / read + write and
read + write / the faster scan (when that alone is >= 2x, no build that
writes its output meets the goal), naive / build wall time, and
the build's peak RSS (VmHWM) on the large lake / the small (goal <= 1.1x).
Prints CPU seconds by stage
(``stages.py``) and writes ``bench/build/results.json`` (``bench.results``
format) with each build's content hash in ``detail``; exits 1 when the
rounds' content hashes disagree or the naive loop's counts differ.

    .venv/bin/python bench/build/run.py [--rollouts 400] [--rounds 3] [--lakes DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

from bench.results import Ratio, Recorder, peak_rss_mb  # noqa: E402

KINDS = ("scan-arrow", "scan-duckdb", "pipeline", "read-write", "naive")
"""What is measured (``round_order``: in which order)."""
SCAN_GOAL = 2.0
"""Build wall time / bare scan wall time (issue 14)."""
RSS_GOAL = 1.1
"""Peak RSS growth of the build for 4x the input (issue 14)."""


def child(kind: str, lake_root: str) -> None:
    """Run one build (or scan) in this process and print its figures as JSON."""
    from floor import built_batches, read_write
    from naive import naive_build
    from scan import arrow_scan, duckdb_scan
    from stages import cpu_by_stage, process_cpu

    from pipelines import build_dataset
    from store.lake import Lake

    lake = Lake(lake_root)
    built = built_batches(lake, "bench") if kind == "read-write" else []
    cpu = process_cpu()
    started = time.perf_counter()
    if kind == "pipeline":
        with cpu_by_stage() as stages:
            result = build_dataset(lake, "bench")
        counts = result.manifest["counts"]
        figures = {"rollouts": counts["rollouts"]["in_dataset"], "samples": counts["samples"],
                   "tokens": counts["tokens"], "trained_tokens": counts["trained_tokens"],
                   "content_hash": result.content_hash, "cpu_s_by_stage": dict(stages)}
    elif kind == "read-write":
        figures = {"sum": read_write(lake, built)}
    elif kind == "naive":
        figures = naive_build(lake, "bench_naive")
    else:
        figures = {"sum": (arrow_scan if kind == "scan-arrow" else duckdb_scan)(lake)}
    figures["seconds"] = time.perf_counter() - started
    figures["cpu_seconds"] = process_cpu() - cpu
    figures["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(figures))


def round_order(k: int, *, naive: bool) -> list[str]:
    """The kinds measured in round ``k``: the scans first in even rounds and last in odd ones (drift on a shared
    machine hits both sides of a ratio alike); ``read-write`` always right after the ``pipeline`` whose rows it writes."""
    builds = ["pipeline", "read-write", *(["naive"] if naive else [])]
    scans = ["scan-arrow", "scan-duckdb"]
    return scans + builds if k % 2 == 0 else builds + scans


def measure(kind: str, lake_root: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--lake", lake_root],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
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
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every measurement (ratios are medians)")
    parser.add_argument("--lakes", type=Path, default=None, help="keep/reuse generated lakes here")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.lake)
        return
    recorder = Recorder("build", "`build-dataset` vs a bare scan of its token columns (the faster of Arrow and "
                                 "DuckDB) and vs a naive per-call Python loop")
    lakes = args.lakes or Path(tempfile.mkdtemp(prefix="trajlake-bench-build-"))
    sizes = (args.rollouts, 4 * args.rollouts)
    inputs = {n: prepare(lakes, n) for n in sizes}
    rounds: list[dict[int, dict]] = []
    for k in range(args.rounds):
        measured: dict[int, dict] = {}
        for n in sizes if k % 2 == 0 else sizes[::-1]:
            measured[n] = {"load_average_1min": os.getloadavg()[0]}
            measured[n] |= {kind: measure(kind, inputs[n][0]) for kind in round_order(k, naive=n == args.rollouts)}
            print_rows(k, n, inputs[n][1], measured[n])
        rounds.append(measured)
    sys.exit(write_results(recorder, args.rollouts, inputs, rounds))


def write_results(recorder: Recorder, small: int, inputs: dict[int, tuple[str, dict]],
                  rounds: list[dict[int, dict]]) -> int:
    """Write results.json and print its ratios; 1 when the builds disagree with each other or the naive loop."""
    large = 4 * small
    hashes = {n: sorted({r[n]["pipeline"]["content_hash"] for r in rounds}) for n in (small, large)}
    same = all(r[small]["naive"][k] == r[small]["pipeline"][k] for r in rounds
               for k in ("samples", "tokens", "trained_tokens"))
    ratios = [
        *(Ratio(f"build_over_scan_{n}", f"wall time, build / bare token scan, {n} rollouts",
                [round(r[n]["pipeline"]["seconds"] / _scan_seconds(r[n]), 2) for r in rounds],
                goal=SCAN_GOAL, better="lower") for n in (small, large)),
        *(Ratio(f"build_over_scan_cpu_{n}", f"CPU seconds, build / bare token scan, {n} rollouts (steadier under load)",
                [round(r[n]["pipeline"]["cpu_seconds"] / _scan_cpu_seconds(r[n]), 2) for r in rounds],
                better="lower") for n in (small, large)),
        *(Ratio(f"build_over_read_write_{n}", f"wall time, build / read + write (the floor), {n} rollouts",
                [round(r[n]["pipeline"]["seconds"] / r[n]["read-write"]["seconds"], 2) for r in rounds],
                better="lower") for n in (small, large)),
        *(Ratio(f"read_write_over_scan_{n}", f"wall time, read + write / bare token scan, {n} rollouts",
                [round(r[n]["read-write"]["seconds"] / _scan_seconds(r[n]), 2) for r in rounds],
                better="lower") for n in (small, large)),
        *(Ratio(f"read_write_over_scan_cpu_{n}", f"CPU seconds, read + write / bare token scan, {n} rollouts",
                [round(r[n]["read-write"]["cpu_seconds"] / _scan_cpu_seconds(r[n]), 2) for r in rounds],
                better="lower") for n in (small, large)),
        Ratio(f"naive_over_build_{small}", f"wall time, naive per-call loop / build, {small} rollouts",
              [round(r[small]["naive"]["seconds"] / r[small]["pipeline"]["seconds"], 2) for r in rounds]),
        Ratio("rss_growth_4x_input", f"peak RSS of the build, {large} / {small} rollouts",
              [round(r[large]["pipeline"]["peak_rss_mb"] / r[small]["pipeline"]["peak_rss_mb"], 2) for r in rounds],
              goal=RSS_GOAL, better="lower"),
    ]

    rss = {n: [r[n]["pipeline"]["peak_rss_mb"] for r in rounds] for n in (small, large)}

    def median(n: int, kind: str, key: str) -> float:
        return statistics.median(r[n][kind][key] for r in rounds)

    summary = (f"{large} rollouts / {inputs[large][1]['tokens'] / 1e6:.1f}M input tokens in "
               f"{median(large, 'pipeline', 'seconds'):.2f} s (bare scan {median(large, 'scan-arrow', 'seconds'):.2f} s"
               f" Arrow, {median(large, 'scan-duckdb', 'seconds'):.2f} s DuckDB, read + write "
               f"{median(large, 'read-write', 'seconds'):.2f} s); peak RSS of the build over {len(rounds)} rounds "
               + ", ".join(f"{min(rss[n]):,.0f}-{max(rss[n]):,.0f} MB at {n}" for n in (small, large))
               + f"; same output as naive: {same}")
    result = recorder.write(
        ratios=ratios, summary=summary,
        peak_rss_mb={f"build {n}": round(median(n, "pipeline", "peak_rss_mb")) for n in (small, large)},
        cpu_s_by_stage={f"build {n}": _median_stages(r[n]["pipeline"]["cpu_s_by_stage"] for r in rounds)
                        for n in (small, large)},
        detail={"input": {str(n): inputs[n][1] for n in (small, large)}, "same_output_as_naive": same,
                "content_hashes": {str(n): h for n, h in hashes.items()},
                "rounds": [{str(n): m for n, m in r.items()} for r in rounds]},
        path=HERE / "results.json",
    )
    for r in result["ratios"]:
        print(f"{r['label']}: {r['value']}x (rounds {r['runs']}; goal {r['goal']}, meets {r['meets']})")
    print(f"load average {result['machine']['load_average_start']} -> {result['machine']['load_average_end']}")
    for name, stages in result["cpu_s_by_stage"].items():
        print(f"cpu s by stage, {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    if any(len(h) != 1 for h in hashes.values()) or not same:
        print(f"builds disagree: content hashes {hashes}, same output as naive: {same}", file=sys.stderr)
        return 1
    return 0


def _scan_seconds(measured: dict) -> float:
    return min(measured["scan-arrow"]["seconds"], measured["scan-duckdb"]["seconds"])


def _scan_cpu_seconds(measured: dict) -> float:
    return min(measured["scan-arrow"]["cpu_seconds"], measured["scan-duckdb"]["cpu_seconds"])


def _median_stages(rounds: Iterable[dict[str, float]]) -> dict[str, float]:
    rounds = list(rounds)
    return {stage: round(statistics.median(r.get(stage, 0.0) for r in rounds), 3) for stage in rounds[0]}


def print_rows(k: int, n: int, stats: dict, measured: dict) -> None:
    tokens = stats["tokens"]
    for kind, r in measured.items():
        if kind == "load_average_1min":
            continue
        extra = f"  samples {r['samples']}" if "samples" in r else ""
        print(f"round {k + 1}: {n:>5} rollouts {tokens / 1e6:5.1f}M input tokens  {kind:<11} {r['seconds']:6.2f} s "
              f"(cpu {r['cpu_seconds']:5.2f} s)  {tokens / r['seconds'] / 1e6:6.2f}M tokens/s  "
              f"peak RSS {r['peak_rss_mb']:5.0f} MB{extra}", flush=True)


if __name__ == "__main__":
    main()
