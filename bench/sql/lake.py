"""The SQL benchmark's lakes: as the ingester leaves it (many small commits), after ``trajlake compact``, and
compacted then a recent tail appended (``tail.py``: what the ingester writes between two compactions).

Both come from ``bench/sql/fast_lake.py`` (the workload generator's rollouts
drawn straight into the typed tables' columns, ``per_commit`` rollouts per
Delta commit, token lists ``max_context_tokens`` long at most); the compacted
one is a copy of the first, compacted with ``store.compact.compact`` (what
``trajlake compact`` runs, the pre-joined tables included; a compacted lake
from before them gets them by ``store.prejoin.refresh``, timed under
``prejoin``), the tail one a copy of the compacted one. A lake folder
holds ``bench-lake.json`` with what was asked and what was written, so a
second run with the same parameters reuses it.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.sql.fast_lake import FastLakeConfig, write_lake
from bench.sql.tail import append_tail
from store.compact import compact
from store.lake import Lake
from store.prejoin import refresh

MARKER = "bench-lake.json"


def ensure_lakes(workdir: Path, *, rollouts: int, per_commit: int, seed: int = 0, max_context_tokens: int = 512,
                 workers: int = 1) -> dict[str, Any]:
    """Build (or reuse) ``workdir/ingested`` and ``workdir/compacted``; returns what each holds and took.

    ``workers``: processes drawing commits while this one writes (0: draw in this process).
    """
    asked = {"rollouts": rollouts, "per_commit": per_commit, "seed": seed, "max_context_tokens": max_context_tokens,
             "generator": "fast_lake"}
    ingested, compacted = workdir / "ingested", workdir / "compacted"
    facts = read_marker(ingested)
    if facts is None or facts["asked"] != asked:
        shutil.rmtree(ingested, ignore_errors=True)
        shutil.rmtree(compacted, ignore_errors=True)
        ingested.mkdir(parents=True)
        started = time.perf_counter()
        config = FastLakeConfig.for_rollouts(rollouts, seed=seed, per_commit=per_commit,
                                             max_context_tokens=max_context_tokens)
        totals = write_lake(str(ingested), config, rollouts=rollouts, workers=workers)
        facts = {"asked": asked, **totals, "generate_s": round(time.perf_counter() - started, 1),
                 "bytes": _size(ingested)}
        (ingested / MARKER).write_text(json.dumps(facts))
    compact_facts = read_marker(compacted)
    if compact_facts is None or compact_facts["asked"] != asked:
        shutil.rmtree(compacted, ignore_errors=True)
        shutil.copytree(ingested, compacted)
        started = time.perf_counter()
        compact(Lake(str(compacted)), vacuum_retention=timedelta(0))  # `trajlake compact --vacuum-hours 0`
        compact_facts = {**facts, "compact_s": round(time.perf_counter() - started, 1), "bytes": _size(compacted)}
        (compacted / MARKER).write_text(json.dumps(compact_facts))
    if "prejoin" not in compact_facts:  # compacted before the pre-joined tables existed
        started, cpu = time.perf_counter(), time.process_time()
        result = refresh(Lake(str(compacted)))
        compact_facts["prejoin"] = {"wall_s": round(time.perf_counter() - started, 1),
                                    "cpu_s": round(time.process_time() - cpu, 1), "buckets": result.buckets}
        (compacted / MARKER).write_text(json.dumps(compact_facts))
    return {"ingested": facts, "compacted": compact_facts}


def ensure_tail(workdir: Path, *, rollouts: int = 200, commits: int = 4, replays: int = 100) -> dict[str, Any]:
    """Build (or reuse) ``workdir/tail``: a copy of ``workdir/compacted`` (``ensure_lakes`` first) with a tail of
    ``rollouts`` new rollouts in ``commits`` commits and ``replays`` resent responses appended."""
    compacted, tail = workdir / "compacted", workdir / "tail"
    asked = {"rollouts": rollouts, "commits": commits, "replays": replays}
    facts = read_marker(tail)
    if facts is None or facts.get("tail_asked") != asked or facts.get("asked") != read_marker(compacted)["asked"]:
        shutil.rmtree(tail, ignore_errors=True)
        shutil.copytree(compacted, tail)
        facts = {**read_marker(compacted), "tail_asked": asked,
                 "tail": append_tail(tail, rollouts=rollouts, commits=commits, replays=replays, seed=1)}
        (tail / MARKER).write_text(json.dumps(facts))
    return facts


def _size(folder: Path) -> int:
    """Bytes of every file under ``folder`` (data files and Delta logs)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
