"""The SQL benchmark's lakes: one as the ingester leaves it (many small commits), one after ``trajlake compact``.

Both come from the workload generator through ``bench.build.make_lake`` (the
ingester's own event conversion, appended ``per_commit`` rollouts per
commit); the compacted one is a copy of the first, compacted with
``store.compact.compact`` (what ``trajlake compact`` runs). A lake folder
holds ``bench-lake.json`` with what was asked and what was written, so a
second run with the same parameters reuses it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from bench.build.make_lake import make_lake
from store.compact import compact
from store.lake import Lake

MARKER = "bench-lake.json"


def ensure_lakes(workdir: Path, *, rollouts: int, per_commit: int, seed: int = 0) -> dict[str, Any]:
    """Build (or reuse) ``workdir/ingested`` and ``workdir/compacted``; returns what each holds and took."""
    asked = {"rollouts": rollouts, "per_commit": per_commit, "seed": seed}
    ingested, compacted = workdir / "ingested", workdir / "compacted"
    facts = _read_marker(ingested)
    if facts is None or facts["asked"] != asked:
        shutil.rmtree(ingested, ignore_errors=True)
        shutil.rmtree(compacted, ignore_errors=True)
        ingested.mkdir(parents=True)
        started = time.perf_counter()
        totals = make_lake(str(ingested), rollouts=rollouts, seed=seed, per_commit=per_commit)
        facts = {"asked": asked, **totals, "generate_s": round(time.perf_counter() - started, 1)}
        (ingested / MARKER).write_text(json.dumps(facts))
    compact_facts = _read_marker(compacted)
    if compact_facts is None or compact_facts["asked"] != asked:
        shutil.rmtree(compacted, ignore_errors=True)
        shutil.copytree(ingested, compacted)
        started = time.perf_counter()
        compact(Lake(str(compacted)))
        compact_facts = {**facts, "compact_s": round(time.perf_counter() - started, 1)}
        (compacted / MARKER).write_text(json.dumps(compact_facts))
    return {"ingested": facts, "compacted": compact_facts}


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
