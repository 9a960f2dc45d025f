"""Token sessions' added latency at 200 req/s: the same 30-turn tool rollouts through the gateway, sessions on vs off.

Starts a minimal engine (``serve.py engine``: canned answers, one tool call;
it neither renders nor tokenizes, so it costs ~nothing on either route) and
two gateways in front of it (``serve.py gateway``, token sessions on and off,
events encoded and dropped), each its own process. After a warm-up round through each, in ``--rounds``
rounds alternating the two (order swapped each round, so both see the same
background load), ``--rollouts`` concurrent 30-turn tool-calling rollouts go
through one gateway open loop at ``--rate`` req/s: call j starts at
``j / rate`` seconds (rollout ``j % rollouts``, its next turn, after the
previous turn's answer), latency counts from that scheduled start. Measured:
p50/p99 latency per arm and round; the gateway's CPU per call (steady on a
shared machine, where latency is not), all of it and its event loop's alone
(the request path: planning, the engine request, the answer; the rest is the
emitter thread encoding events off the path); the share of stitched calls;
and the planner's own CPU per call replayed offline (``Stitcher.plan``,
thread time). On a machine with cores to spare the added latency is the
request path's added CPU; one that cannot offer ``--rate`` (2 shared cores do
not offer 200 req/s) runs at the highest rate both arms sustain, and the
summary says when a rate was not sustained. The added latency and CPU are
paired: per round, the p50 (CPU) of sessions on minus that of sessions off,
run back to back; the figure is the median of those differences over rounds
(``--rounds`` 5 or more on a shared machine).
Prints the results and writes ``bench/session_latency/results.json``.

    .venv/bin/python bench/session_latency/run.py [--rate 200] [--rollouts 40] [--turns 30] [--rounds 5]

Goal (issue 13): sessions add <= 0.3 ms p50 at 200 req/s.
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
sys.path[:0] = [str(ROOT)]

from bench.gateway.loadgen import Connection, Target  # noqa: E402
from bench.gateway.run import cpu_seconds, percentile  # noqa: E402
from bench.gateway.run import start as start_server  # noqa: E402
from bench.results import Ratio, Recorder  # noqa: E402
from devkit.ports import free_port  # noqa: E402
from devkit.tiny_model import build_tiny_model, default_model_dir  # noqa: E402

SERVE = Path(__file__).resolve().parent / "serve.py"
KEY = "sk-bench"
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
ARGUMENTS = '{"expression": "1 + 1"}'


def conversation(turns: int) -> list[list[dict]]:
    """The messages of each turn of a rollout whose every answer is the engine's canned tool call."""
    messages = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": "Work out the running total, one tool call per step."}]
    out = []
    for turn in range(turns):
        out.append(messages)
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "calculator", "arguments": ARGUMENTS}}
        messages = [*messages, {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{turn}", "content": str(turn * 7)}]
    return out


def start(args: list[str], port: int) -> subprocess.Popen:
    """One bench server (``serve.py``: the fake engine or a gateway), up once it lists its models."""
    return start_server([sys.executable, str(SERVE), args[0], str(port), *args[1:]], env={}, port=port,
                        path="/v1/models", timeout_s=120)


async def rollouts_at_rate(port: int, tag: str, turns: list[bytes], *, rollouts: int,
                           rate: float) -> tuple[list[float], int, float]:
    """``rollouts`` rollouts of ``len(turns)`` calls, open loop at ``rate``; (latencies in s, errors, elapsed s)."""
    targets = [[Target("127.0.0.1", port, "/v1/chat/completions",
                       {"authorization": f"Bearer {KEY}", "x-trajlake-rollout-id": f"{tag}-{r}"}, body).request()
                for body in turns] for r in range(rollouts)]
    pool: list[Connection] = []
    latencies: list[float] = []
    errors = 0
    done: dict[tuple[int, int], asyncio.Future] = {}

    async def one(r: int, t: int, scheduled: float) -> None:
        nonlocal errors
        if t:
            await done[(r, t - 1)]
        conn = pool.pop() if pool else await Connection.open(Target("127.0.0.1", port, "", {}, b""))
        try:
            status = await conn.exchange(targets[r][t])
        except (asyncio.IncompleteReadError, ConnectionError):  # an idle pooled connection the server closed
            conn.close()
            conn = await Connection.open(Target("127.0.0.1", port, "", {}, b""))
            status = await conn.exchange(targets[r][t])
        errors += status != 200
        latencies.append(time.perf_counter() - scheduled)
        pool.append(conn)
        done[(r, t)].set_result(None)

    loop = asyncio.get_running_loop()
    tasks = []
    start_at = time.perf_counter()
    for j in range(rollouts * len(turns)):
        r, t = j % rollouts, j // rollouts
        done[(r, t)] = loop.create_future()
        scheduled = start_at + j / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(r, t, scheduled)))
    await asyncio.gather(*tasks)
    for conn in pool:
        conn.close()
    return latencies, errors, time.perf_counter() - start_at


def loop_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process's main thread (the gateway's event loop: the request path)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stitched_share(port: int) -> float:
    counts = {"stitched": 0.0, "engine_rendered": 0.0}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith("trajlake_gateway_prompts_total{"):
            made = line.split('made="', 1)[1].split('"', 1)[0]
            counts[made] = counts.get(made, 0.0) + float(line.split()[-1])
    return counts["stitched"] / max(sum(counts.values()), 1.0)


def planner_cpu(model_dir: Path, turns: list[list[dict]], repeats: int = 3) -> dict:
    """CPU (thread time) ``Stitcher.plan`` takes per call of these rollouts, replayed offline with the canned answer
    (building a stitched call's completions request, its JSON included)."""
    from transformers import AutoTokenizer

    from bench.session_latency.serve import ANSWER
    from ingest.gateway.sessions.state import SessionStore
    from ingest.gateway.sessions.stitch import Stitcher

    tok = AutoTokenizer.from_pretrained(model_dir)
    stitcher = Stitcher(tok, SessionStore(max_bytes=1 << 28, ttl_s=3600))
    sampled = [*tok.encode(ANSWER, add_special_tokens=False), tok.convert_tokens_to_ids(tok.eos_token)]
    content, calls = stitcher.parser.parse(ANSWER)
    times: list[float] = []
    for k in range(repeats):
        for n, messages in enumerate(turns):
            started = time.thread_time()
            plan = stitcher.plan({"model": "bench", "messages": messages, "tools": TOOLS}, ("t", f"r{k}", 0, None))
            times.append(time.thread_time() - started)
            if n and plan.made != "stitched":
                raise RuntimeError(f"the planner replay was not stitched at turn {n}: {plan.reason}")
            prompt = plan.prompt_ids or list(range(200))
            stitcher.remember(plan, prompt_ids=prompt, sampled_ids=sampled, content=content, tool_calls=calls)
    ms = [x * 1e3 for x in times]
    checked = ms[len(turns):]  # the later rollouts: every shape checked by the first (a one-time cost per shape)
    return {"calls": len(ms), "cpu_ms_p50": round(statistics.median(ms), 3), "cpu_ms_p99": round(percentile(ms, 99), 3),
            "cpu_ms_p99_shapes_checked": round(percentile(checked, 99), 3),
            "cpu_ms_max_first_rollout": round(max(ms[:len(turns)]), 3),
            "cpu_ms_at_last_turn": round(statistics.median(ms[len(turns) - 1::len(turns)]), 3)}


async def measure(ports: dict[str, int], pids: dict[str, int], engine_pid: int, turns: list[bytes], *, rollouts: int,
                  rate: float, rounds: int) -> dict:
    for arm, port in ports.items():  # warm up (a whole round each): connections, imports, the engine's answers
        await rollouts_at_rate(port, f"warm-{arm}", turns, rollouts=rollouts, rate=rate)
    runs: dict[str, list[dict]] = {arm: [] for arm in ports}
    for k in range(rounds):
        for arm in (list(ports) if k % 2 == 0 else list(ports)[::-1]):
            before, engine_before, loop_before = cpu_seconds(pids[arm]), cpu_seconds(engine_pid), loop_cpu_seconds(pids[arm])
            latencies, errors, elapsed = await rollouts_at_rate(ports[arm], f"{arm}-{k}", turns, rollouts=rollouts, rate=rate)
            cpu, engine_cpu = cpu_seconds(pids[arm]) - before, cpu_seconds(engine_pid) - engine_before
            loop_cpu = loop_cpu_seconds(pids[arm]) - loop_before
            ms = [x * 1e3 for x in latencies]
            runs[arm].append({"calls": len(ms), "errors": errors, "p50_ms": round(percentile(ms, 50), 3),
                              "p99_ms": round(percentile(ms, 99), 3),
                              "gateway_cpu_ms_per_call": round(1e3 * cpu / len(ms), 3),
                              "request_path_cpu_ms_per_call": round(1e3 * loop_cpu / len(ms), 3),
                              "engine_cpu_ms_per_call": round(1e3 * engine_cpu / len(ms), 3),
                              "end_to_end_cpu_ms_per_call": round(1e3 * (cpu + engine_cpu) / len(ms), 3),
                              "achieved_req_s": round(len(ms) / elapsed, 1),
                              "load_average": os.getloadavg()[0]})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--rollouts", type=int, default=40, help="concurrent rollouts per round")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    recorder = Recorder("session_latency", f"{args.turns}-turn tool rollouts through the gateway, open loop at "
                                           f"{args.rate:.0f} req/s, token sessions on vs off (canned engine)")
    model_dir = build_tiny_model(default_model_dir())
    messages = conversation(args.turns)
    turns = [json.dumps({"model": "bench", "messages": m, "tools": TOOLS, "max_tokens": 64}).encode()
             for m in messages]
    ports = {"without": free_port(), "with": free_port()}
    engine_port = free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            procs.append(start(["engine", str(model_dir)], engine_port))
            upstream = f"http://127.0.0.1:{engine_port}/v1"
            gateways = {arm: start(["gateway", str(model_dir), upstream, f"{tmp}/{arm}", "on" if arm == "with" else "off"],
                                   port) for arm, port in ports.items()}
            procs += gateways.values()
            runs = asyncio.run(measure(ports, {arm: p.pid for arm, p in gateways.items()}, procs[0].pid, turns,
                                       rollouts=args.rollouts, rate=args.rate, rounds=args.rounds))
            stitched = stitched_share(ports["with"])
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    errors = sum(r["errors"] for arm in runs.values() for r in arm)
    if errors:
        raise SystemExit(f"{errors} calls failed: the figures would not be the gateway's")
    if stitched < (args.turns - 1) / args.turns - 0.01:
        raise SystemExit(f"only {stitched:.0%} of the calls with sessions were stitched: the bench measured no sessions")
    results = {"rate": args.rate, "rollouts": args.rollouts, "turns": args.turns, "runs": runs,
               "stitched_share": round(stitched, 3), "planner": planner_cpu(model_dir, messages)}
    print(json.dumps(results, indent=2))
    record(recorder, results)


def record(recorder: Recorder, results: dict) -> None:
    with_, without = results["runs"]["with"], results["runs"]["without"]

    def paired(field: str) -> list[float]:
        """Per round, sessions on - off: the two arms ran back to back, under the same background load."""
        return [round(w[field] - o[field], 3) for w, o in zip(with_, without, strict=True)]

    def median(runs: list[dict], field: str) -> float:
        return statistics.median(r[field] for r in runs)

    added = {f: round(statistics.median(paired(f)), 3)
             for f in ("p50_ms", "p99_ms", "gateway_cpu_ms_per_call", "request_path_cpu_ms_per_call",
                       "engine_cpu_ms_per_call")}
    # medians of the paired differences, not differences of the arms' medians: on a shared machine the spread
    # between rounds is larger than the difference within one
    results["added"] = added
    planner = results["planner"]
    achieved = {arm: median(runs, "achieved_req_s") for arm, runs in results["runs"].items()}
    sustained = "" if min(achieved.values()) >= 0.95 * results["rate"] else (
        f"rate NOT sustained on this machine (achieved {achieved['with']:.0f} req/s with, {achieved['without']:.0f} "
        "without: the latencies are queueing, the CPU per call is the figure); ")

    def pair(field: str) -> str:
        return f"{median(with_, field):.2f} vs {median(without, field):.2f} ms, paired {added[field]:+.2f}"

    summary = sustained + (
        f"{results['rate']:.0f} req/s: sessions add p50 {added['p50_ms']:+.2f} ms (median of the rounds' paired "
        f"differences; goal <= +0.3 ms; p50 {median(with_, 'p50_ms'):.2f} vs {median(without, 'p50_ms'):.2f} ms), "
        f"p99 {added['p99_ms']:+.2f} ms; CPU per call, request path {pair('request_path_cpu_ms_per_call')}, "
        f"gateway with its event encoding {pair('gateway_cpu_ms_per_call')}; planner CPU p50 "
        f"{planner['cpu_ms_p50']:.2f} ms, p99 {planner['cpu_ms_p99']:.2f} ms per call "
        f"({planner['cpu_ms_p99_shapes_checked']:.2f} once the first rollout checked its shapes, whose first calls "
        f"take up to {planner['cpu_ms_max_first_rollout']:.1f}); {results['stitched_share']:.0%} of calls stitched")

    def ratio(field: str) -> list[float]:
        return [w[field] / o[field] for w, o in zip(with_, without, strict=True)]

    ratios = [
        Ratio("p50_added", "p50 latency at rate added by sessions, on - off per round", paired("p50_ms"), goal=0.3,
              better="lower", unit="ms"),
        Ratio("request_path_cpu_added", "gateway request-path (event loop) CPU per call added by sessions, "
              "on - off per round", paired("request_path_cpu_ms_per_call"), better="lower", unit="ms"),
        Ratio("p50", "p50 latency at rate, sessions on / off", ratio("p50_ms"), better="lower"),
        Ratio("request_path_cpu", "gateway request-path (event loop) CPU per call, sessions on / off",
              ratio("request_path_cpu_ms_per_call"), better="lower"),
        Ratio("cpu", "gateway CPU per call (with event encoding), sessions on / off", ratio("gateway_cpu_ms_per_call"),
              better="lower"),
    ]
    recorder.write(ratios=ratios, summary=summary, detail=results)


if __name__ == "__main__":
    main()
