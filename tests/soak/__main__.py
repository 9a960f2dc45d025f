"""The long mixed-fault soak: ``python -m tests.soak --minutes 30 --seed 1`` (from the repository root).

Prints the report (faults by kind, calls, lost, duplicated, what became of every
message in the log) and exits 0 only when nothing answered was lost or doubled.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
from pathlib import Path

from tests.soak.harness import SoakPlan, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long calls are made (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    parser.add_argument("--rate", type=float, default=10.0, help="calls per second (default 10)")
    parser.add_argument("--ingesters", type=int, choices=(1, 2), default=2, help="ingesters in the group")
    parser.add_argument("--local-lake", action="store_true", help="lake in a local folder, not on the S3 server")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"),
                        help="TRAJLAKE_LOG_LEVEL of the gateway and the ingesters (DEBUG: their clients' group joins, "
                             "fetches and every commit)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and spool (default: a new temp folder)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trajlake-soak-"))
    plan = SoakPlan(seed=args.seed, load_s=args.minutes * 60, calls_per_s=args.rate, ingesters=args.ingesters,
                    lake_on_object_store=not args.local_lake, fault_gap_s=(10.0, 40.0), freeze_s=(5.0, 20.0),
                    broker_down_s=(60.0, 60.0), warmup_s=12.0, log_level=args.log_level,
                    drain_max_s=max(900.0, args.minutes * 60))
    signal.signal(signal.SIGTERM, _terminated)
    report = run_soak(plan, workdir=workdir)
    print(report.render())
    return 0 if report.ok else 1


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM: unwind like Ctrl-C, so the run stops its processes (a SIGKILL leaves that to its watchdog)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
