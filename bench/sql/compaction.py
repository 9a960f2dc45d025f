"""The lake as the ingest service leaves it: compacted incrementally at the scheduler's cadence, plus the tail
written since its last run; and what each incremental run costs.

``ensure_service`` copies the compacted lake (with its pre-joined tables), then for each step of ``STEPS`` appends
that many commits of the generator's batches (``tail.py``: ``per_commit`` new rollouts each, Kafka offsets past the
lake's, plus resent responses of old rollouts, i.e. late rows for compacted rollouts) and runs what the scheduler's
``compact`` job runs (``store.compact.compact`` without vacuum) in a child process, recording its wall and CPU
seconds, peak RSS and what it rewrote. Last it appends the tail of one cadence at the stated ingest rate and leaves
it uncompacted: the state a reader meets just before the next run (the longest tail the cadence allows).

    python -m bench.sql.compaction LAKE   # the child: compacts LAKE as the scheduler does, prints its figures
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.sql.tail import append_tail

STEPS = (10, 100)
"""Commits before each measured incremental run (after a run of the first, the second meets its partial files)."""
INGEST_EVENTS_S = 200
"""The ingest rate the cadence's tail stands for: the ingest soak's (bench/ingest, README), events per second."""
EVENTS_PER_ROLLOUT = 83
"""Events of one bench rollout on the wire: ~21 calls (request + response), ~19 tool steps (call + result), start,
end, reward."""
CADENCE_S = 300
"""The scheduler's default compaction cadence (TRAJLAKE_COMPACT_CRON, every 5 minutes)."""
COMMIT_S = 20
"""One ingester commit per table every this many seconds in the tail (the bench's 50-rollout batches at that rate)."""


def cadence_tail() -> dict[str, int]:
    """Rollouts and commits of the tail one cadence leaves at ``INGEST_EVENTS_S``."""
    return {"rollouts": CADENCE_S * INGEST_EVENTS_S // EVENTS_PER_ROLLOUT, "commits": CADENCE_S // COMMIT_S}


def ensure_service(workdir: Path, *, per_commit: int = 50, replays: int = 100) -> dict[str, Any]:
    """Build (or reuse) ``workdir/service`` from ``workdir/compacted``; returns the steps' figures and the tail's."""
    from bench.sql.lake import MARKER, read_marker

    compacted, service = workdir / "compacted", workdir / "service"
    asked = {"steps": list(STEPS), "per_commit": per_commit, "replays": replays, "tail": cadence_tail()}
    facts = read_marker(service)
    if facts is not None and facts.get("service_asked") == asked and facts.get("asked") == read_marker(compacted)["asked"]:
        return facts
    shutil.rmtree(service, ignore_errors=True)
    shutil.copytree(compacted, service)
    steps = []
    for seed, commits in enumerate(STEPS, start=2):
        appended = append_tail(service, rollouts=commits * per_commit, commits=commits, replays=replays, seed=seed)
        steps.append({"commits": commits, "appended": appended, "compact": compact_in_child(service)})
        print(json.dumps(steps[-1]), flush=True)
    tail = cadence_tail()
    appended = append_tail(service, rollouts=tail["rollouts"], commits=tail["commits"], replays=replays,
                           seed=len(STEPS) + 2)
    facts = {**read_marker(compacted), "service_asked": asked, "steps": steps, "tail": appended}
    (service / MARKER).write_text(json.dumps(facts))
    return facts


def compact_in_child(root: Path) -> dict[str, Any]:
    """Run the scheduler's compaction on the lake at ``root`` in a fresh process; its figures."""
    proc = subprocess.run([sys.executable, "-m", "bench.sql.compaction", str(root)], capture_output=True, text=True,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    if proc.returncode != 0:
        raise RuntimeError(f"compaction of {root} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(root: str) -> None:
    """What ``compact(lake, vacuum_retention=None)`` runs, its two stages timed apart."""
    from store.compact import compact
    from store.lake import Lake, list_tables
    from store.prejoin import refresh

    lake = Lake(root)
    started, cpu = time.perf_counter(), time.process_time()
    results = compact(lake, tables=list_tables(lake), vacuum_retention=None)
    optimized, optimize_cpu = time.perf_counter(), time.process_time()
    refreshed = refresh(lake)
    figures = {"wall_s": round(time.perf_counter() - started, 1), "cpu_s": round(time.process_time() - cpu, 1),
               "optimize_wall_s": round(optimized - started, 1), "optimize_cpu_s": round(optimize_cpu - cpu, 1),
               "peak_rss_mb": _peak_rss_mb(),
               "files_removed": sum(r.files_removed for r in results),
               "files_added": sum(r.files_added for r in results),
               "rollouts_recomputed": refreshed.rollouts, "incremental": refreshed.incremental}
    print(json.dumps(figures), flush=True)


def _peak_rss_mb() -> int:
    """This process's peak RSS since its exec (``VmHWM``): Linux carries ``getrusage``'s ``ru_maxrss`` over an exec,
    so a child of a 2.5 GB parent reported 2,521 MB for a 0.9 GB compaction."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM:"))


if __name__ == "__main__":
    _child(sys.argv[1])
