"""``python -m bench [NAME ...]``: run every benchmark (or the named ones), one process each.

A benchmark is a folder ``bench/<name>/`` with an entry script: ``run.py``, or
else the one ``bench_*.py`` inside it. Extra arguments after ``--`` go to each.

Each benchmark's new ``results.json`` is compared with the one it replaced
(``bench.results.regressions``): a ratio that got more than 20% worse is
flagged and the exit code is 1. ``python -m bench.report`` then puts the new
figures in README's table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.results import load, regressions, results_path

BENCH = Path(__file__).resolve().parent


def entry_points() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in sorted(p for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        scripts = [folder / "run.py"] if (folder / "run.py").exists() else sorted(folder.glob("bench_*.py"))
        if len(scripts) == 1:
            found[folder.name] = scripts[0]
    return found


def main(argv: list[str]) -> int:
    names, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    available = entry_points()
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    failed, regressed = [], []
    for name in names or list(available):
        print(f"== bench {name}", flush=True)
        previous = load(results_path(name))
        if subprocess.call([sys.executable, str(available[name]), *extra], cwd=BENCH.parent) != 0:
            failed.append(name)
            continue
        current = load(results_path(name))
        if previous is not None and current is not None and current["measured_at"] != previous["measured_at"]:
            regressed += regressions(previous, current)
    for line in regressed:
        print(f"REGRESSION {line}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or regressed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
