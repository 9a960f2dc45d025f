"""The common shape of ``bench/<name>/results.json``: what every benchmark writes and what reads it.

Every benchmark states its outcome as one or more **ratios** measured in one
run (ours / a baseline measured in the same run, so machine drift hits both
sides), each with the value of every round (``runs``), their median
(``value``) and interquartile range (``iqr``), its goal and which direction is better. A figure that is a
paired **difference** instead (ours - baseline per round, in ``unit``, e.g. ``ms``: an added latency whose
ratio hides it) has the same shape. Around them: when it was
measured, the machine's load, peak RSS, CPU seconds by stage, and a free-form
``detail`` section for the benchmark's own figures. The README's table is
generated from these files (``python -m bench.report``) and ``python -m bench``
(``make bench``) compares each new file with the one it replaces
(``regressions``).

    {
      "bench": "ingest", "format": 1, "measured_at": "2026-12-01T17:02:11+00:00",
      "what": "broker -> committed Delta rows vs a consumer writing raw Parquet",
      "machine": {"cpus": 2, "load_average_start": [3.1, 2.9, 2.7], "load_average_end": [3.4, 3.0, 2.7]},
      "ratios": [{"key": "full_prompt", "label": "events/s, ingester / baseline", "value": 0.52,
                  "runs": [0.5, 0.52, 0.55], "iqr": 0.025, "goal": 0.7, "better": "higher", "meets": false}],
      "summary": "7,337 vs 14,000 events/s",
      "peak_rss_mb": {"ingester": 612.0},
      "cpu_s_by_stage": {"ingester": {"consume": 0.61, "decode": 0.41, "commit": 0.52}},
      "detail": {...}
    }

Use: ``Recorder(name, what)`` at the start of a run (it reads the load
average), ``recorder.write(ratios=..., summary=..., ...)`` at the end.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

FORMAT = 1
BENCH = Path(__file__).resolve().parent
REGRESSION = 0.20
"""A ratio that got worse by more than this fraction of its previous value is a regression."""


@dataclass(frozen=True)
class Ratio:
    """One headline ratio of a benchmark, measured in one run: ours / baseline, one value per round."""

    key: str
    """Stable id within the benchmark (the regression check matches on it)."""
    label: str
    """What is divided by what, for people: "events/s, ingester / raw-Parquet consumer"."""
    runs: Sequence[float]
    goal: float | None = None
    better: Literal["higher", "lower"] = "higher"
    unit: str = "x"
    """``x``: each round is ours / baseline; any other unit (``ms``): ours - baseline, in that unit."""

    @property
    def value(self) -> float:
        return statistics.median(self.runs)

    @property
    def iqr(self) -> float:
        """Interquartile range of the rounds (0 for a single round): the spread the median comes with."""
        if len(self.runs) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.runs, n=4, method="inclusive")
        return q3 - q1

    @property
    def meets(self) -> bool | None:
        if self.goal is None:
            return None
        return self.value >= self.goal if self.better == "higher" else self.value <= self.goal

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "value": self.value, "runs": list(self.runs),
                "iqr": self.iqr, "goal": self.goal, "better": self.better, "meets": self.meets, "unit": self.unit}


def results_path(bench: str) -> Path:
    return BENCH / bench / "results.json"


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB; Linux only."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


class Recorder:
    """Notes the load when a benchmark starts; ``write`` adds it (and the load at the end) to results.json."""

    def __init__(self, bench: str, what: str) -> None:
        self.bench, self.what = bench, what
        self.load_start = list(os.getloadavg())

    def write(self, *, ratios: Sequence[Ratio], summary: str, peak_rss_mb: Mapping[str, float] | None = None,
              cpu_s_by_stage: Mapping[str, Mapping[str, float]] | None = None,
              detail: Mapping[str, Any] | None = None, path: Path | None = None) -> dict[str, Any]:
        result = {
            "bench": self.bench, "format": FORMAT,
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "what": self.what,
            "machine": {"cpus": os.cpu_count(), "load_average_start": self.load_start,
                        "load_average_end": list(os.getloadavg())},
            "ratios": [r.as_json() for r in ratios],
            "summary": summary,
            "peak_rss_mb": dict(peak_rss_mb or {}),
            "cpu_s_by_stage": {k: dict(v) for k, v in (cpu_s_by_stage or {}).items()},
            "detail": dict(detail or {}),
        }
        target = path or results_path(self.bench)
        target.write_text(json.dumps(result, indent=2) + "\n")
        return result


def load(path: Path) -> dict[str, Any] | None:
    """A results.json in this format, or None (missing, unreadable, or an older free-form file)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("format") == FORMAT else None


def regressions(old: Mapping[str, Any], new: Mapping[str, Any], *, tolerance: float = REGRESSION) -> list[str]:
    """Ratios of ``new`` that got worse than in ``old`` by more than ``tolerance`` (a fraction), as sentences.

    "Worse" follows each ratio's ``better``: a higher-is-better ratio that fell
    below (1 - tolerance) x its old value, or a lower-is-better one that rose
    above old / (1 - tolerance). Ratios present on one side only are not compared, nor differences (a ``unit``
    other than ``x``: near zero, a fraction of them says nothing).
    """
    before = {r["key"]: r for r in old.get("ratios", [])}
    found = []
    for r in new.get("ratios", []):
        prev = before.get(r["key"])
        if prev is None or not prev["value"] or r.get("unit", "x") != "x" or prev.get("unit", "x") != "x":
            continue
        was, now = prev["value"], r["value"]
        worse = now < was * (1 - tolerance) if r["better"] == "higher" else now > was / (1 - tolerance)
        if worse:
            found.append(f"{new['bench']}: {r['label']} went from {was:.2f} to {now:.2f} "
                         f"({now / was - 1:+.0%}; {r['better']} is better, tolerance {tolerance:.0%})")
    return found
