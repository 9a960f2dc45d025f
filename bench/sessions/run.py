"""Token sessions benchmark: samples per rollout with and without sessions, the gateway's added cost, memory.

In one run: the split engine (``devkit.split_engine``: non-canonical token
splits, Hermes tool calls) behind two in-process gateways, one with token
sessions and one without; the same 30-turn tool-using rollouts (the official
``openai`` client, a calculator agent) through each; every recorded call
merged per rollout (``pipelines.datasets.merging``). Also: latency per call
(client-observed, sequential) through each gateway; the time the session
planner takes per call (the hot-path work sessions add); session memory per
10k live rollouts at the measured prompt sizes (tracemalloc). Prints the
results and writes ``bench/sessions/results.json``.

    .venv/bin/python bench/sessions/run.py [--rollouts 8] [--turns 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from openai import OpenAI  # noqa: E402

from devkit.split_engine import create_split_engine  # noqa: E402
from devkit.tiny_model import build_tiny_model, default_model_dir  # noqa: E402
from ingest.gateway import create_gateway_app  # noqa: E402
from ingest.gateway.emitter import Emitter  # noqa: E402
from ingest.gateway.sessions.state import Session, SessionStore  # noqa: E402
from ingest.gateway.sessions.stitch import Stitcher  # noqa: E402
from ingest.spool import Spool  # noqa: E402
from pipelines.datasets.merging import Call, merge_calls  # noqa: E402
from trajlake.background import serve_in_thread  # noqa: E402
from trajlake.commands.gateway import GatewaySettings  # noqa: E402

KEY = "sk-bench"
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


class ListSink:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def send(self, records) -> None:
        self.records.extend(records)

    def close(self) -> None:
        pass


def rollout(llm: OpenAI, turns: int, latencies: list[float]) -> None:
    messages = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": "Work out the running total, one tool call per step."}]
    for turn in range(turns):
        started = time.perf_counter()
        message = llm.chat.completions.create(model="split", messages=messages, tools=TOOLS).choices[0].message
        latencies.append(time.perf_counter() - started)
        answer = message.model_dump(exclude_none=True)
        if not answer.get("tool_calls"):
            return
        messages.append(answer)
        last = " final" if turn == turns - 2 else ""
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"{turn * 7}{last}"}
                     for c in answer["tool_calls"]]


def samples(sink: ListSink) -> dict[str, int]:
    events = [json.loads(v) for _, v in sink.records]
    responses = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "llm.response"}
    calls: dict[str, list[Call]] = {}
    for e in sorted((e for e in events if e["type"] == "llm.request"), key=lambda e: e["seq"]):
        p, r = e["payload"], responses[e["payload"]["call_id"]]
        calls.setdefault(e["rollout_id"], []).append(Call(
            call_id=p["call_id"], span_id=None, tokenizer=None, chat_template_hash=None,
            prompt=np.array(p["prompt_token_ids"]), response=np.array(r["response_token_ids"]), logprobs=None))
    return {rollout_id: len(merge_calls(c)) for rollout_id, c in calls.items()}


def run_arm(engine_url: str, model_dir: Path, workdir: Path, *, sessions: bool, rollouts: int, turns: int) -> dict:
    settings = GatewaySettings(upstream_url=engine_url, gateway_keys=f"{KEY}=bench", spool_dir=workdir / "spool",
                               bootstrap_servers="127.0.0.1:1", tokenizer=str(model_dir), token_sessions=sessions)
    sink = ListSink()
    emitter = Emitter(sink, Spool(workdir / "spool", max_bytes=1 << 30))
    app = create_gateway_app(settings, emitter=emitter)
    latencies: list[float] = []
    with serve_in_thread(app, name="gateway") as url:
        for k in range(rollouts):
            llm = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                         default_headers={"x-trajlake-task-id": "t", "x-trajlake-rollout-id": f"r-{k}"})
            rollout(llm, turns, latencies)
    emitter.close()
    per_rollout = samples(sink)
    counts = list(per_rollout.values())
    out = {"rollouts": len(counts), "calls": len(latencies),
           "samples_per_rollout": round(sum(counts) / len(counts), 3),
           "single_sample_share": round(sum(c == 1 for c in counts) / len(counts), 3),
           "latency_p50_ms": round(statistics.median(latencies) * 1e3, 2)}
    return out


def plan_cost(model_dir: Path, turns: int) -> dict:
    """Time the planner takes for each call of a ``turns``-turn rollout, replayed offline (no engine)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    store = SessionStore(max_bytes=1 << 28, ttl_s=3600)
    stitcher = Stitcher(tok, store)
    messages = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": "Work out the running total, one tool call per step."}]
    key, times, prompt = ("t", "r", 0, None), [], None
    for turn in range(turns):
        body = {"model": "split", "messages": messages, "tools": TOOLS}
        started = time.perf_counter()
        plan = stitcher.plan(body, key)
        times.append(time.perf_counter() - started)
        prompt = plan.prompt_ids or tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                                            tokenize=True, return_dict=False)
        arguments = json.dumps({"expression": f"{turn} + 1"})
        text = f'Step {turn}: let me compute.\n<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
        sampled = tok.encode(text) + [tok.convert_tokens_to_ids(tok.eos_token)]
        content, calls = stitcher.parser.parse(text)
        stitcher.remember(plan, prompt_ids=list(prompt), sampled_ids=sampled, content=content, tool_calls=calls)
        messages = [*messages, {"role": "assistant", "content": content, "tool_calls": calls},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": str(turn * 7)}]
    return {"plan_p50_ms": round(statistics.median(times) * 1e3, 3),
            "plan_at_last_turn_ms": round(times[-1] * 1e3, 3), "prompt_tokens_at_last_turn": len(prompt)}


def session_memory(tokens: int, messages: int, live: int = 10_000) -> dict:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = SessionStore(max_bytes=1 << 40, ttl_s=3600)
    for k in range(live):
        store.put(("tenant", f"rollout-{k:06d}", 0, None), Session(
            messages=tuple(bytes(20) for _ in range(messages)), context=bytes(20),
            prompt_ids=array("i", range(tokens - 60)), sampled_ids=array("i", range(60))))
    measured = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    return {"live_rollouts": live, "tokens_per_session": tokens, "measured_mib": round(measured / 2**20, 1),
            "accounted_mib": round(store.bytes / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    model_dir = build_tiny_model(default_model_dir())
    results: dict = {"turns": args.turns}
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(create_split_engine(model_dir), name="engine") as engine:
        for name, on in (("without_sessions", False), ("with_sessions", True)):
            results[name] = run_arm(f"{engine}/v1", model_dir, Path(tmp) / name, sessions=on,
                                             rollouts=args.rollouts, turns=args.turns)
    results["planner"] = plan_cost(model_dir, args.turns)
    results["memory"] = session_memory(results["planner"]["prompt_tokens_at_last_turn"], 2 * args.turns + 3)
    print(json.dumps(results, indent=2))
    (Path(__file__).parent / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
