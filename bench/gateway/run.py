"""Gateway overhead benchmark: latency added over a direct call, and max proxied req/s, in one run.

Starts a real embedded broker, the fast fake engine and ``trajlake gateway``
(each its own process; events really go to Kafka), then for each rate sends
the same chat request to the engine directly and through the gateway (open
loop, latency from the scheduled start), and finally saturates both with a
closed loop (``--concurrency`` keep-alive connections). Direct and gateway
runs alternate in ``--rounds`` slices so both see the same background load.
Prints the results and writes ``bench/gateway/results.json``.

    .venv/bin/python bench/gateway/run.py [--rates 50,200,500] [--seconds 6]

Goals (issue): p50 overhead <= 1 ms and p99 <= 5 ms at 200 req/s; >= 1,000
proxied req/s on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from loadgen import RunResult, Target, at_rate, saturate  # noqa: E402

from bench.results import Ratio, Recorder  # noqa: E402
from devkit.broker import EmbeddedBroker  # noqa: E402
from devkit.ports import free_port  # noqa: E402

KEY = "sk-bench"
BODY = json.dumps({"model": "bench", "max_tokens": 16,
                   "messages": [{"role": "user", "content": "say something short please"}]}).encode()


def start(cmd: list[str], *, env: dict[str, str], port: int, path: str = "/healthz",
          timeout_s: float = 60.0) -> subprocess.Popen:
    """Start a server and wait until ``path`` answers on ``port``; a server that does not start is killed."""
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{cmd[:3]} did not start")
            time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else values[0]


def summary(result: RunResult) -> dict:
    ms = [x * 1000 for x in result.latencies_s]
    return {"n": len(ms), "errors": result.errors, "p50_ms": round(percentile(ms, 50), 3),
            "p99_ms": round(percentile(ms, 99), 3), "req_s": round(len(ms) / result.elapsed_s, 1)}


def pooled(results: list[RunResult]) -> RunResult:
    return RunResult([x for r in results for x in r.latencies_s], sum(r.errors for r in results),
                     sum(r.elapsed_s for r in results))


async def measure(direct: Target, gateway: Target, *, rates: list[int], seconds: float, rounds: int,
                  concurrency: int, pids: dict[str, int]) -> dict:
    """Direct and gateway runs alternate in short slices, so both see the same background load."""
    for target in (direct, gateway):  # warm up connections, imports, caches
        await at_rate(target, rate=100, seconds=1)
    slice_s = seconds / rounds
    out: dict = {"rates": {}}
    for rate in rates:
        runs: dict[str, list[RunResult]] = {"direct": [], "gateway": []}
        for _ in range(rounds):
            runs["direct"].append(await at_rate(direct, rate=rate, seconds=slice_s))
            runs["gateway"].append(await at_rate(gateway, rate=rate, seconds=slice_s))
        d, g = summary(pooled(runs["direct"])), summary(pooled(runs["gateway"]))
        out["rates"][rate] = {"direct": d, "gateway": g,
                              "overhead_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
                              "overhead_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3)}
    runs = {"direct": [], "gateway": []}
    cpu = {"engine_direct": 0.0, "gateway": 0.0}
    for _ in range(rounds):
        before = cpu_seconds(pids["engine"])
        runs["direct"].append(await saturate(direct, concurrency=concurrency, seconds=slice_s))
        cpu["engine_direct"] += cpu_seconds(pids["engine"]) - before
        before = cpu_seconds(pids["gateway"])
        runs["gateway"].append(await saturate(gateway, concurrency=concurrency, seconds=slice_s))
        cpu["gateway"] += cpu_seconds(pids["gateway"]) - before
    out["max_direct"], out["max_gateway"] = summary(pooled(runs["direct"])), summary(pooled(runs["gateway"]))
    out["max_ratio"] = round(out["max_gateway"]["req_s"] / out["max_direct"]["req_s"], 3)
    # CPU per request does not depend on how much of the box other processes take.
    engine_ms = 1000 * cpu["engine_direct"] / max(out["max_direct"]["n"], 1)
    gateway_ms = 1000 * cpu["gateway"] / max(out["max_gateway"]["n"], 1)
    out["cpu_ms_per_request"] = {"engine": round(engine_ms, 3), "gateway_process": round(gateway_ms, 3),
                                 "gateway_req_s_per_free_core": round(1000 / gateway_ms) if gateway_ms else None}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,500")
    parser.add_argument("--seconds", type=float, default=6.0, help="per rate and target, split into rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    recorder = Recorder("gateway", "added latency vs the same upstream called directly (fast local upstream), "
                                   "open-loop at fixed rates, then closed-loop at saturation")
    engine_port, gateway_port = free_port(), free_port()
    fake_dir = ROOT / "tests" / "ingest" / "gateway"
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        broker.create_topic("bench.events", partitions=4)
        engine = start(
            [sys.executable, "-m", "uvicorn", "--factory", "gateway_fake_engine:create_fake_engine",
             "--port", str(engine_port), "--log-level", "warning", "--no-access-log"],
            env={"PYTHONPATH": str(fake_dir)}, port=engine_port)
        gateway = start(
            [sys.executable, "-m", "trajlake.cli", "gateway", "--port", str(gateway_port)],
            env={"TRAJLAKE_UPSTREAM_URL": f"http://127.0.0.1:{engine_port}/v1",
                 "TRAJLAKE_GATEWAY_KEYS": f"{KEY}=bench", "TRAJLAKE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                 "TRAJLAKE_TOPIC": "bench.events", "TRAJLAKE_SPOOL_DIR": f"{tmp}/spool"},
            port=gateway_port)
        try:
            direct = Target("127.0.0.1", engine_port, "/v1/chat/completions", {}, BODY)
            through = Target("127.0.0.1", gateway_port, "/v1/chat/completions",
                             {"authorization": f"Bearer {KEY}", "x-trajlake-rollout-id": "bench-rollout"}, BODY)
            results = asyncio.run(measure(direct, through, rates=rates, seconds=args.seconds, rounds=args.rounds,
                                          concurrency=args.concurrency,
                                          pids={"engine": engine.pid, "gateway": gateway.pid}))
            results["load_average"] = os.getloadavg()
            metrics = httpx.get(f"http://127.0.0.1:{gateway_port}/metrics").text
            results["events_produced"] = next(
                float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("trajlake_gateway_events_produced_total"))
        finally:
            for proc in (gateway, engine):
                proc.terminate()
                proc.wait(30)
    print(json.dumps(results, indent=2))
    record(recorder, results)


def record(recorder: Recorder, results: dict) -> None:
    """results.json in the common format (``bench.results``); every figure above goes under ``detail``."""
    at_200 = results["rates"].get(200)
    latency = (f"200 req/s: p50 +{at_200['overhead_p50_ms']:.2f} ms, p99 +{at_200['overhead_p99_ms']:.2f} ms "
               "(goal p50 <= 1 ms, p99 <= 5 ms); " if at_200 else "")
    summary = (f"{latency}max {results['max_gateway']['req_s']:,.0f} proxied req/s (goal >= 1,000; direct "
               f"{results['max_direct']['req_s']:,.0f}); {results['cpu_ms_per_request']['gateway_process']:.2f} ms "
               "gateway CPU per call")
    recorder.write(ratios=[Ratio("max_throughput", "max req/s, through the gateway / direct", [results["max_ratio"]])],
                   summary=summary, detail=results)


if __name__ == "__main__":
    main()
