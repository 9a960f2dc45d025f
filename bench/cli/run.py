"""CLI start-up (issue 16): ``trajlake --help`` and a one-row ``trajlake sql`` against ``import typer``.

Every round runs each command once as a fresh process, interleaved so that load drift hits all of them:
``python -c pass``, ``python -c "import typer"`` (the floor of any Typer CLI, the ratios' baseline),
``python -c "import duckdb"`` (the engine alone), the import floors of the two commands (``FLOORS``: the
third-party modules each cannot run without),
``trajlake --help``, ``trajlake sql --help`` and ``trajlake sql --lake LAKE "SELECT 1"``; one warm-up round
first (bytecode, page cache). Per command: median wall and CPU (user + sys) seconds and peak RSS over the
rounds; the ratios divide each round's trajlake CPU time by that round's ``import typer`` (CPU, because on a
loaded machine wall time is mostly waiting for a core), and each by its floor's. The goals are absolute (``--help`` < 0.3 s, ``sql``
< 0.5 s wall on a quiet machine): the summary says where they stand, next to the load average. Also recorded: what ``--help`` and
``sql "SELECT 1"`` spend importing, by top-level import and one level down (``python -X importtime``, least of 3 runs).

The children run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed), as an installed CLI does;
the lake is a small workload lake built in a temporary folder (``bench.build.make_lake``), or ``--lake``.

    python -m bench cli                       # or: python bench/cli/run.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from bench.results import Ratio, Recorder  # noqa: E402

GOALS_S = {"help": 0.3, "sql_select_1": 0.5}
"""Wall-time goals of issue 16 (start-up included, quiet machine)."""
FLOORS = {
    "help": "import typer",  # help is click's plain text (trajlake.cli.PLAIN_HELP): Typer and click alone
    "sql_select_1": "import typer, rich.table, duckdb",
}
"""What each command cannot do without: the third-party imports alone (a one-row answer is DuckDB's rows printed
as a rich table; no pydantic: trajlake.coercion and trajlake.plain_settings, no Arrow: store.sql_rows)."""


def commands(lake: Path) -> dict[str, list[str]]:
    trajlake = str(Path(sys.executable).with_name("trajlake"))
    return {
        "python": [sys.executable, "-c", "pass"],
        "import_typer": [sys.executable, "-c", "import typer"],
        "import_duckdb": [sys.executable, "-c", "import duckdb"],
        **{f"floor_{key}": [sys.executable, "-c", imports] for key, imports in FLOORS.items()},
        "help": [trajlake, "--help"],
        "sql_help": [trajlake, "sql", "--help"],
        "sql_select_1": [trajlake, "sql", "--lake", str(lake), "SELECT 1"],
    }


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("TRAJLAKE_")}
    return env | {"COLUMNS": "100"}


def run_once(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS (MB) of one run of ``command``; raises when it fails."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {err.read().decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def command_imports(args: list[str], env: dict[str, str], *, runs: int = 3, top: int = 12) -> dict[str, float]:
    """Milliseconds ``trajlake ARGS`` spends in its costliest imports, top level and one level down:
    ``-X importtime``'s cumulative (wall) time, the least of ``runs`` runs."""
    script = f"import sys; sys.argv = ['trajlake', *{args!r}]; from trajlake.cli import main; main()"
    found: dict[str, float] = {}
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", script], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env, check=True)
        for line in done.stderr.splitlines():  # "import time: self | cumulative | name", nesting as indentation
            if (m := re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( {0,2}\S+)$", line)):
                name = m.group(2).strip()
                found[name] = min(found.get(name, float("inf")), round(int(m.group(1)) / 1000, 1))
    return dict(sorted(found.items(), key=lambda kv: -kv[1])[:top])


def small_lake(folder: Path) -> Path:
    """A 40-rollout workload lake, written by a child process: a child's peak RSS counts its parent's at the fork
    (Linux keeps the high-water mark across exec), so this process stays small."""
    script = "import sys; from bench.build.make_lake import make_lake; make_lake(sys.argv[1], rollouts=40, per_commit=8)"
    subprocess.run([sys.executable, "-c", script, str(folder)], cwd=ROOT, check=True)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds after one warm-up round")
    parser.add_argument("--lake", type=Path, help="lake for trajlake sql (default: a small workload lake, built here)")
    args = parser.parse_args()
    recorder = Recorder("cli", "CLI start-up: `trajlake --help` and a one-row `trajlake sql` vs `python -c 'import "
                               "typer'`, fresh processes")
    with tempfile.TemporaryDirectory() as tmp:
        lake = args.lake or small_lake(Path(tmp) / "lake")
        env, runs = child_env(), {name: [] for name in commands(lake)}
        loads = []
        for round_ in range(args.rounds + 1):
            loads.append(round(os.getloadavg()[0], 1))
            for name, command in commands(lake).items():
                result = run_once(command, env)
                if round_:
                    runs[name].append(result)
        imports_ms = {"help": command_imports(["--help"], env),
                      "sql_select_1": command_imports(["sql", "--lake", str(lake), "SELECT 1"], env)}
    median = {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("wall_s", "cpu_s", "rss_mb")}
              for name, rs in runs.items()}
    ratios = [Ratio(key, f"CPU s, {label} / python -c 'import typer'", better="lower",
                    runs=[round(a["cpu_s"] / b["cpu_s"], 2) for a, b in zip(runs[key], runs["import_typer"])])
              for key, label in (("help", "trajlake --help"), ("sql_select_1", "trajlake sql \"SELECT 1\""))]
    ratios += [Ratio(f"{key}_floor", f"CPU s, {label} / its import floor (python -c '{FLOORS[key]}')", better="lower",
                     runs=[round(a["cpu_s"] / b["cpu_s"], 2) for a, b in zip(runs[key], runs[f"floor_{key}"])])
               for key, label in (("help", "trajlake --help"), ("sql_select_1", "trajlake sql \"SELECT 1\""))]
    verdicts = [f"{label} {median[key]['wall_s']:.2f} s wall / {median[key]['cpu_s']:.2f} s CPU (goal < {GOALS_S[key]} s "
                f"wall: {'met' if median[key]['wall_s'] < GOALS_S[key] else 'missed'}; its import floor "
                f"{median['floor_' + key]['wall_s']:.2f} s wall / {median['floor_' + key]['cpu_s']:.2f} s CPU)"
                for key, label in (("help", "--help"), ("sql_select_1", "sql \"SELECT 1\""))]
    summary = (f"{'; '.join(verdicts)}; import typer {median['import_typer']['wall_s']:.2f} s wall / "
               f"{median['import_typer']['cpu_s']:.2f} s CPU, import duckdb {median['import_duckdb']['wall_s']:.2f} s "
               f"wall / {median['import_duckdb']['cpu_s']:.2f} s CPU, python {median['python']['cpu_s']:.2f} s CPU; "
               f"median of {args.rounds}, load {min(loads)}-{max(loads)}")
    result = recorder.write(
        ratios=ratios, summary=summary, peak_rss_mb={"trajlake --help": median["help"]["rss_mb"],
                                                     "trajlake sql": median["sql_select_1"]["rss_mb"]},
        detail={"median": median, "load_by_round": loads[1:], "goals_wall_s": GOALS_S,
                "top_level_imports_ms": imports_ms, "floors": FLOORS, "lake": "small workload lake (40 rollouts)"
                if args.lake is None else str(args.lake)})
    print(summary)
    for r in result["ratios"]:
        print(f"{r['label']}: {r['value']:.2f}x (rounds {r['runs']})")
    for key, found in imports_ms.items():
        print(f"{key} imports (ms, cumulative):", found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
