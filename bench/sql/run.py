"""SQL at scale (issue 16): the canonical questions through the views and by hand on the raw tables.

Builds (or reuses) two lakes from the workload generator under ``--workdir``,
one as the ingester leaves it (``--per-commit`` rollouts per commit) and one
after compaction (``bench/sql/lake.py``), then per lake: opens one connection
(``store.sql.connect``, timed), runs every question of ``questions.py`` in
both forms once to warm up and ``--repeat`` times more, checks that both
forms give the same rows, and reports the median warm time of each and their
ratio. Then the CLI's start-up: ``trajlake --help`` and ``trajlake sql
"SELECT 1"`` wall time, median of ``--repeat`` runs. The 1-minute load
average is recorded beside every figure: on a shared machine absolute times
move with it, ratios less so.

    python bench/sql/run.py                      # 6,000 rollouts (128k calls)
    python bench/sql/run.py --rollouts 48000     # ~1M calls (hours to generate on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.sql.lake import ensure_lakes  # noqa: E402
from bench.sql.questions import Question, questions  # noqa: E402
from store.lake import Lake  # noqa: E402
from store.sql import connect  # noqa: E402

GOALS_S = {"scalar": 0.1, "tokens": 1.0}
GOAL_RATIO = 1.5
RESULTS = Path(__file__).with_name("results.json")


def load() -> float:
    return round(os.getloadavg()[0], 1)


def timed(run: Any, repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls after one warm-up call, and the warm-up's answer."""
    answer = run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def bench_lake(root: Path, repeat: int) -> dict[str, Any]:
    lake = Lake(str(root))
    started = time.perf_counter()
    con = connect(lake)
    opened = time.perf_counter() - started
    (rollout_id,) = con.execute("SELECT rollout_id FROM rollout_starts ORDER BY rollout_id LIMIT 1").fetchone()
    (calls,) = con.execute("SELECT count(*) FROM llm_calls").fetchone()
    rows: list[dict[str, Any]] = []
    for q in questions(rollout_id):
        rows.append(_bench_question(con, q, repeat))
        print(json.dumps(rows[-1]), flush=True)
    con.close()
    return {"connect_s": round(opened, 3), "calls": calls, "questions": rows}


def _bench_question(con: Any, q: Question, repeat: int) -> dict[str, Any]:
    load_before = load()
    view_s, view_rows = timed(lambda: con.execute(q.view).to_arrow_table().to_pylist(), repeat)
    raw_s, raw_rows = timed(lambda: con.execute(q.raw).to_arrow_table().to_pylist(), repeat)
    same = sorted(view_rows, key=repr) == sorted(raw_rows, key=repr)
    if not same:
        print(f"ANSWERS DIFFER for {q.name}:\n view {sorted(view_rows, key=repr)[:5]}\n raw  {sorted(raw_rows, key=repr)[:5]}",
              file=sys.stderr)
    return {"question": q.name, "kind": q.kind, "view_s": round(view_s, 3), "raw_s": round(raw_s, 3),
            "ratio": round(view_s / raw_s, 2) if raw_s else None, "same_answer": same,
            "goal_s": GOALS_S[q.kind], "load": round((load_before + load()) / 2, 1)}


def bench_cli(lake: Path, repeat: int) -> dict[str, Any]:
    """Wall and CPU (user + sys) seconds of ``trajlake --help`` and a one-row ``trajlake sql``: medians.

    CPU time is what start-up costs when the machine is idle; wall time on a loaded machine is mostly waiting.
    """
    exe = shutil.which("trajlake", path=str(Path(sys.executable).parent)) or "trajlake"
    out: dict[str, Any] = {}
    for name, args in {"help": ["--help"], "sql_select_1": ["sql", "--lake", str(lake), "SELECT 1"]}.items():
        load_before = load()
        walls, cpus = [], []
        for _ in range(repeat + 1):
            before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run([exe, *args], check=True, stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            walls.append(time.perf_counter() - started)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out[name] = {"wall_s": round(statistics.median(walls[1:]), 3), "cpu_s": round(statistics.median(cpus[1:]), 3),
                     "load": round((load_before + load()) / 2, 1)}
        print(json.dumps({name: out[name]}), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6000, help="rollouts to generate (~21 LLM calls each)")
    parser.add_argument("--per-commit", type=int, default=50, help="rollouts per commit of the ingested lake")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trajlake-bench-sql",
                        help="where the lakes are built and kept for the next run")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per query after one warm-up")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--only", choices=("queries", "cli"), help="run only the queries or only the CLI start-up")
    args = parser.parse_args()
    facts = ensure_lakes(args.workdir, rollouts=args.rollouts, per_commit=args.per_commit)
    print(json.dumps(facts), flush=True)
    results: dict[str, Any] = {"lake": facts}
    if args.only != "cli":
        for name in ("ingested", "compacted"):
            print(f"== {name}", flush=True)
            results[name] = bench_lake(args.workdir / name, args.repeat)
    if args.only != "queries":
        results["cli"] = bench_cli(args.workdir / "compacted", max(args.repeat, 5))
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    differ = [q["question"] for lake in ("ingested", "compacted") for q in results.get(lake, {}).get("questions", [])
              if not q["same_answer"]]
    if differ:
        print(f"answers differ: {', '.join(differ)}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
