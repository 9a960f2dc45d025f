"""Run the trainer in its own process (distributed state is per process): one run, or a follower."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from devkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DRIVER = """
import json, logging, os, signal, sys, threading, time
from datetime import timedelta
logging.basicConfig(level="INFO", format="%(name)s %(message)s", stream=sys.stdout)
logging.getLogger("kafka").setLevel("WARNING")
args = json.loads(sys.argv[1])
if args.get("debug_versions"):
    logging.getLogger("trainer.versions").setLevel("DEBUG")
from store.lake import Lake
from trainer.config import TrainConfig
config = TrainConfig(**args["config"])
lake = Lake(args["lake"])
pause = args.get("pause_after_step")
crash = args.get("crash_after_step")
def on_step(entry):
    print(f"STEP {entry.step} loss={entry.metrics['loss']!r}", flush=True)
    if entry.step == crash:
        os._exit(3)
    if entry.step == pause:  # hang here holding the lease (its heartbeat thread renews it) until killed
        print("PAUSED", flush=True)
        while True:
            time.sleep(1)
if args.get("follow"):
    from trainer.follow import follow
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("READY", flush=True)
    while args.get("go_file") and not os.path.exists(args["go_file"]):
        time.sleep(0.01)
    print("FOLLOWING", flush=True)
    follow(lake, config, stop_event=stop, bootstrap_servers=args.get("bootstrap"),
           control_topic=args.get("topic", "trajlake.control"), datasets=["syn"],
           poll_interval_s=args.get("poll_s", 3600), lease=timedelta(seconds=args.get("lease_s", 120)), on_step=on_step)
    sys.exit(0)
from trainer.loop import train_dataset
record = train_dataset(lake, args["dataset"], args.get("version"), config, on_step=on_step)
if int(os.environ.get("RANK", "0")) == 0:
    print("RECORD " + json.dumps({"id": record.checkpoint_id, "metrics": record.metrics, "hf": record.hf_path}))
"""
CONFIG = {"lr": 1e-3, "epochs": 3, "micro_batch_tokens": 80, "save_every": 2, "seed": 0}


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return e | {"PYTHONPATH": str(REPO), "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}


def drive(args: dict, *, launcher: list[str] | None = None, expect_rc: int = 0) -> dict | None:
    """Run the driver (plain python, or a launcher on a script copy); its RECORD line, parsed."""
    payload = json.dumps({k: v for k, v in args.items() if k != "script"})
    cmd = [*launcher, str(args["script"]), payload] if launcher else [sys.executable, "-c", DRIVER, payload]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == expect_rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RECORD ")]
    return json.loads(lines[-1].removeprefix("RECORD ")) if lines else None


def config_for(model: Path, out: Path, **over) -> dict:
    return {"model": str(model), "out": str(out), **CONFIG, **over}


class Follower:
    """A follower process whose output goes to ``log``."""

    def __init__(self, args: dict, log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps({"follow": True, **args})],
                                         env=env(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for(predicate, *followers: Follower, limit_s: float = 240, what: str = "the condition") -> None:
    """Poll ``predicate`` until true; fail when a follower exits early or after ``limit_s`` (a hang, not a timing)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        for f in followers:
            assert f.proc.poll() is None, f"a follower exited early:\n{f.output()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s} s:\n" + "\n".join(
            f.output()[-2000:] for f in followers
        )
        time.sleep(0.2)
