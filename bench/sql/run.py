"""SQL at scale (issue 16): the canonical questions through the views and by hand on the raw tables.

Builds (or reuses) four lakes under ``--workdir`` (``bench/sql/lake.py``: the
fast generator, ``fast_lake.py``): one as the ingester writes it and nothing
compacts it (``--per-commit`` rollouts per commit: the views read the typed
tables), one after ``trajlake compact`` (they read the pre-joined tables alone),
that one with a recent tail appended (200 new rollouts in 4 commits, 100 resent
responses: the pre-joined tables plus the tail's rollouts recomputed), and the
lake as the ingest service leaves it (``compaction.py``: the compacted one after
10 then 100 more ingest commits, each followed by the scheduler's incremental
compaction, timed, then the tail of one 5-minute cadence at 200 events/s).
The CLI's start-up is ``bench/cli`` (``python -m bench cli -- --lake DIR``
times it on a lake built here). Per lake (``--lakes``, in that order): opens one connection (``store.sql.connect``, timed), runs
every question of ``questions.py`` in both forms once to warm up, then
``--rounds`` rounds of (view, raw) back to back, checks that both forms give
the same rows, and records each question's view / raw ratio per round (goal
<= 1.5x) with the median warm seconds of each form against the absolute
goals (< 0.1 s scalar and group-by answers, < 1 s token-list aggregates).
On the compacted lake each round also asks the view's form over a bare
``read_parquet`` of the pre-joined table's files (``floor_s``: what DuckDB
takes for those columns on this machine now, with its CPU seconds,
``floor_cpu_s``, beside the view's, ``view_cpu_s``: under load the wall time
is several times the CPU time).
Each question is then asked once more the way ``trajlake sql`` asks it
(``store.sql.run_query``: a fresh connection for the one statement, connect
included: ``one_query_s``, ``one_query_cpu_s``; same rows as the kept connection?).
The 1-minute load average is recorded beside every figure: on a shared
machine absolute times move with it, ratios less so. Writes
``bench/sql/results.json`` (``bench.results`` format) after every answer, so
a run stopped early keeps what it measured; exits 1 when a question's two
forms disagree.

    python bench/sql/run.py                                    # 48,000 rollouts: ~1M LLM calls
    python bench/sql/run.py --workdir /tmp/sqlbench --lakes compacted --output /tmp/q.json   # reuses built lakes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.results import Ratio, Recorder, peak_rss_mb, results_path  # noqa: E402
from bench.sql.compaction import ensure_service  # noqa: E402
from bench.sql.lake import ensure_lakes, ensure_tail  # noqa: E402
from bench.sql.questions import Question, questions  # noqa: E402
from store.lake import Lake  # noqa: E402
from store.prejoin import PREJOINED  # noqa: E402
from store.sql import connect, run_query  # noqa: E402

GOALS_S = {"scalar": 0.1, "tokens": 1.0}
GOAL_RATIO = 1.5
CLI_GOALS_S = {"help": 0.3, "sql_select_1": 0.5}
LAKES = ("ingested", "compacted", "tail", "service")
GOAL_COMPACT = 0.05
"""An incremental compaction after a short tail / a whole compaction of the lake, wall seconds: about the tail."""


def load() -> float:
    return round(os.getloadavg()[0], 1)


def seconds(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def bench_lake(root: Path, rounds: int, out: dict[str, Any], save: Callable[[], None], *,
               floors: bool = False) -> None:
    """Ask every question on the lake at ``root``; ``out`` gets each answer's figures as they come, then ``save``.

    ``floors``: also ask each view's form over the pre-joined tables' files (a compacted lake with nothing new)."""
    lake = Lake(str(root))
    started = time.perf_counter()
    con = connect(lake)
    out["connect_s"] = round(time.perf_counter() - started, 3)
    (rollout_id,) = con.execute("SELECT rollout_id FROM rollout_starts ORDER BY rollout_id LIMIT 1").fetchone()
    out["questions"] = []
    for q in questions(rollout_id):
        out["questions"].append(_bench_question(con, q, rounds, floor=floor_sql(lake, q.view) if floors else None))
        out["questions"][-1].update(_one_query(lake, q, con.execute(q.view).to_arrow_table().to_pylist()))
        print(json.dumps(out["questions"][-1]), flush=True)
        save()
    con.close()


def floor_sql(lake: Lake, sql: str) -> str | None:
    """``sql`` with the view it reads replaced by a bare ``read_parquet`` of its pre-joined table's files; None when
    it reads none of them or another table too."""
    views = "|".join(PREJOINED)
    read = set(re.findall(rf"\bFROM ({views})\b", sql))
    if len(read) != 1 or len(re.findall(r"\bFROM\b", sql)) != 1:
        return None
    (view,) = read
    files = ", ".join("'" + uri.replace("'", "''") + "'" for uri in lake.table(PREJOINED[view][0]).file_uris())
    return re.sub(rf"\bFROM {view}\b", f"FROM read_parquet([{files}])", sql)


def _bench_question(con: Any, q: Question, rounds: int, *, floor: str | None = None) -> dict[str, Any]:
    """One warm-up of each form, then ``rounds`` of (view, raw[, floor]) back to back: times, ratios, same rows?"""
    load_before = load()

    def answer(sql: str) -> list[dict[str, Any]]:
        return con.execute(sql).to_arrow_table().to_pylist()

    def timed(sql: str, wall: list[float], cpu: list[float]) -> None:
        started = time.process_time()
        wall.append(seconds(lambda: answer(sql)))
        cpu.append(time.process_time() - started)

    view_rows, raw_rows = answer(q.view), answer(q.raw)
    floor_rows = answer(floor) if floor else None
    view_s, raw_s, floor_s, view_cpu, floor_cpu, raw_cpu = [], [], [], [], [], []
    for _ in range(rounds):
        timed(q.view, view_s, view_cpu)
        timed(q.raw, raw_s, raw_cpu)
        if floor:
            timed(floor, floor_s, floor_cpu)
    same = sorted(view_rows, key=repr) == sorted(raw_rows, key=repr)
    if not same:
        print(f"ANSWERS DIFFER for {q.name}:\n view {sorted(view_rows, key=repr)[:5]}\n raw  {sorted(raw_rows, key=repr)[:5]}",
              file=sys.stderr)
    view, raw = statistics.median(view_s), statistics.median(raw_s)
    result = {"question": q.name, "kind": q.kind, "view_s": round(view, 3), "raw_s": round(raw, 3),
              "view_cpu_s": round(statistics.median(view_cpu), 3),
              "raw_cpu_s": round(statistics.median(raw_cpu), 3),
              "ratios": [round(v / r, 2) for v, r in zip(view_s, raw_s)], "same_answer": same,
              "goal_s": GOALS_S[q.kind], "meets_goal_s": view < GOALS_S[q.kind],
              "load": round((load_before + load()) / 2, 1)}
    if floor:
        result.update(floor_s=round(statistics.median(floor_s), 3), floor_cpu_s=round(statistics.median(floor_cpu), 3),
                      floor_same_answer=sorted(floor_rows, key=repr) == sorted(view_rows, key=repr))
    return result


def _one_query(lake: Lake, q: Question, expected: list[dict[str, Any]]) -> dict[str, Any]:
    """``q`` asked as ``trajlake sql`` asks it: ``run_query`` opens a connection for it alone (timed with it); then
    again (``one_query_again_s``): the first one-shot over a tail keeps the rows it recomputed (``store.tail_cache``),
    so the first figure of the questions over the same views is the one that paid for it."""
    result: dict[str, Any] = {}
    for prefix in ("one_query", "one_query_again"):
        rows: list[dict[str, Any]] = []
        started = time.process_time()
        wall = seconds(lambda: rows.extend(run_query(lake, q.view).to_pylist()))
        result.update({f"{prefix}_s": round(wall, 3), f"{prefix}_cpu_s": round(time.process_time() - started, 3),
                       f"{prefix}_same_answer": sorted(rows, key=repr) == sorted(expected, key=repr)})
    return result


def ratios(results: dict[str, Any]) -> list[Ratio]:
    """One view / raw ratio per lake and question, a value per round; the service lake's compactions against a
    whole one."""
    found = [Ratio(f"{lake}_{q['question']}", f"{lake}: {q['question']} ({q['kind']}), warm s, views / raw tables",
                   q["ratios"], goal=GOAL_RATIO, better="lower")
             for lake in LAKES for q in results.get(lake, {}).get("questions", [])]
    service, whole = results["lake"].get("service"), whole_compaction_s(results["lake"]["compacted"])
    for step in (service or {}).get("steps", []) if whole else []:
        found.append(Ratio(f"compact_after_{step['commits']}_commits",
                           f"`trajlake compact` (incremental) after {step['commits']} ingest commits / a whole "
                           "compaction of the lake, wall s", [round(step["compact"]["wall_s"] / whole, 4)],
                           goal=GOAL_COMPACT, better="lower"))
    return found


def whole_compaction_s(facts: dict[str, Any]) -> float | None:
    """Wall seconds of the compacted lake's whole compaction: the optimize, then the first pre-join."""
    if "compact_s" not in facts or "prejoin" not in facts:
        return None
    return facts["compact_s"] + facts["prejoin"]["wall_s"]


def summary(results: dict[str, Any]) -> str:
    """The figures beside the ratios: lake size and warm seconds through the views against the goals."""
    facts = results["lake"]["ingested"]
    parts = [f"{facts['llm_calls']:,} LLM calls, {facts['asked']['rollouts']:,} rollouts, "
             f"{facts['commits']} commits ingested"]
    if service := results["lake"].get("service"):
        steps = "; ".join(f"after {s['commits']} commits {s['compact']['wall_s']:.1f} s wall, {s['compact']['cpu_s']:.1f} "
                          f"CPU s, {s['compact']['peak_rss_mb']} MB peak RSS, {s['compact']['rollouts_recomputed']} "
                          "rollouts recomputed" for s in service["steps"])
        parts.append(f"incremental compaction: {steps} (whole: {whole_compaction_s(results['lake']['compacted']):.0f} "
                     f"s); service tail {service['tail']['commits']} commits")
    for lake in LAKES:
        if results.get(lake, {}).get("questions"):
            qs = results[lake]["questions"]
            met = sum(q["meets_goal_s"] for q in qs)
            times = ", ".join(f"{q['question']} {q['view_s']:.2f}"
                              + (f" (floor {q['floor_s']:.2f})" if "floor_s" in q else "") for q in qs)
            parts.append(f"{lake}: connect {results[lake]['connect_s']:.2f} s, then warm s through the views {times}; "
                         f"{met}/{len(qs)} within < 0.1 s scalar / < 1 s tokens (load "
                         f"{min(q['load'] for q in qs):.0f}-{max(q['load'] for q in qs):.0f})")
            if once := [q["one_query_s"] for q in qs if "one_query_s" in q]:
                parts.append(f"{lake}: one question per connection (`trajlake sql`, connect included) "
                             f"{min(once):.2f}-{max(once):.2f} s")
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=48_000, help="rollouts to generate (~21 LLM calls each)")
    parser.add_argument("--per-commit", type=int, default=50, help="rollouts per commit of the ingested lake")
    parser.add_argument("--max-context", type=int, default=512,
                        help="longest prompt + response in tokens (prompts average ~45%% of it)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trajlake-bench-sql",
                        help="where the lakes are built and kept for the next run")
    parser.add_argument("--rounds", type=int, default=3, help="timed (view, raw) rounds per question after a warm-up")
    parser.add_argument("--output", type=Path, default=results_path("sql"))
    parser.add_argument("--lakes", nargs="+", choices=LAKES, default=list(LAKES), help="which lakes to ask")
    args = parser.parse_args()
    recorder = Recorder("sql", "canonical questions (counts, group-bys, one rollout's calls, token-list aggregates) "
                               "through the views vs written by hand on the raw Delta tables, in one connection, "
                               f"on the lakes {', '.join(args.lakes)} (service: as the ingest service leaves it, "
                               "compacted incrementally every 5 minutes)")
    facts = ensure_lakes(args.workdir, rollouts=args.rollouts, per_commit=args.per_commit,
                         max_context_tokens=args.max_context)
    if "tail" in args.lakes:
        facts["tail"] = ensure_tail(args.workdir)
    if "service" in args.lakes:
        facts["service"] = ensure_service(args.workdir, per_commit=args.per_commit)
    print(json.dumps(facts), flush=True)
    results: dict[str, Any] = {"lake": facts}

    def save() -> None:  # after every answer: a run stopped early keeps what it measured
        recorder.write(ratios=ratios(results), summary=summary(results), peak_rss_mb={"bench": peak_rss_mb()},
                       detail=results, path=args.output)

    for name in args.lakes:
        print(f"== {name}", flush=True)
        bench_lake(args.workdir / name, args.rounds, results.setdefault(name, {}), save, floors=name == "compacted")
    differ = [q["question"] for lake in LAKES for q in results.get(lake, {}).get("questions", [])
              if not q["same_answer"] or not q.get("one_query_same_answer", True)
              or not q.get("one_query_again_same_answer", True)]
    if differ:
        print(f"answers differ: {', '.join(differ)}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
