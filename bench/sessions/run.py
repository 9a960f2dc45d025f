"""Token sessions benchmark: samples per rollout with and without sessions, bytes per rollout with
references (prompt ids, messages, tools) vs full events, the gateway's added cost, memory.

In one run: the split engine (``devkit.split_engine``: non-canonical token
splits, Hermes tool calls) behind three in-process gateways: without token
sessions, with sessions and references (the default: prompt ids, messages
and tools of the rollout's last call referenced), with sessions and full
events (``prefix_references`` off); the same 30-turn tool-using
rollouts (the official ``openai`` client, a calculator agent) through each;
every recorded call merged per rollout (``pipelines.datasets.merging``, full
prompts resolved from references by ``store.prompts``). Bytes per rollout:
Kafka = the events' key + value bytes as the gateway produced them
(uncompressed), and Kafka stored = the bytes an embedded broker (tansu)
serves back for the arm's topic (``devkit.kafka_bytes``: the record batches
as the gateway's producer sent them, zstd by default, plus fetch framing;
each call's two events are one batch here, the conservative end: a busier
gateway's batches hold several calls); lake =
every ingested table written from those events with the ingester's rows and
Parquet settings (``store.event_rows``, ``store.commit.WRITER_PROPERTIES``),
one commit per turn: Parquet data (column chunks), footers and ``_delta_log``,
as ingested and after ``trajlake compact`` (``lake_bytes``). Also: latency
per call (client-observed, sequential) through each gateway; the time the
session planner takes per call (the hot-path work sessions add); session
memory per 10k live rollouts at the measured prompt sizes (tracemalloc).
Logprobs: the split engine's are one constant, so the references arm's
events are sent again with real engine logprobs (``serve-model`` on the tiny
model, float32 values as the engine gives them) in every ``llm.response``,
once as JSON numbers and once in the compact form (base64 float32, what the
gateway writes by default: ``schemas.compact_logprobs``), and what the
broker stores of each is compared.
Writes ``bench/sessions/results.json`` (``bench.results`` format).

    .venv/bin/python bench/sessions/run.py [--rollouts 8] [--turns 30]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from deltalake import write_deltalake  # noqa: E402
from openai import OpenAI  # noqa: E402

from bench.results import Ratio, Recorder  # noqa: E402

from devkit.broker import EmbeddedBroker  # noqa: E402
from devkit.kafka_bytes import topic_bytes  # noqa: E402
from devkit.split_engine import create_split_engine  # noqa: E402
from devkit.tiny_model import build_tiny_model, default_model_dir  # noqa: E402
from ingest.gateway import create_gateway_app  # noqa: E402
from ingest.gateway.emitter import Emitter, KafkaSink  # noqa: E402
from ingest.gateway.sessions.state import DIGEST_BYTES, Session, SessionStore, pack_ids  # noqa: E402
from ingest.gateway.sessions.stitch import Stitcher  # noqa: E402
from ingest.spool import Spool  # noqa: E402
from pipelines.datasets.merging import Call, merge_calls  # noqa: E402
from serve.app import create_serve_app  # noqa: E402
from schemas import compact_logprobs  # noqa: E402
from schemas.events import EVENT_ADAPTER  # noqa: E402
from schemas.tables import INGESTED_TABLES  # noqa: E402
from store.commit import WRITER_PROPERTIES  # noqa: E402
from store.compact import compact  # noqa: E402
from store.event_rows import KafkaCoordinates, events_table, typed_tables  # noqa: E402
from store.lake import Lake  # noqa: E402
from store.prompts import StoredCall, full_prompts  # noqa: E402
from trajlake.background import serve_in_thread  # noqa: E402
from trajlake.commands.gateway import GatewaySettings  # noqa: E402

KEY = "sk-bench"
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


class ListSink:
    """Keeps every batch the emitter sends, and sends it on through the gateway's own Kafka sink."""

    def __init__(self, kafka: KafkaSink) -> None:
        self.kafka = kafka
        self.records: list[tuple[bytes, bytes]] = []
        self.batches: list[list[tuple[bytes, bytes]]] = []

    def send(self, records) -> None:
        self.kafka.send(records)
        self.records.extend(records)
        self.batches.append(list(records))

    def close(self) -> None:
        self.kafka.close()


def rollout(llm: OpenAI, turns: int, latencies: list[float], *, task: int) -> None:
    """One calculator rollout; ``task`` varies the question and the tool results, as different tasks would."""
    messages = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": f"Work out the running total from {task * 7919}, one tool call per step."}]
    for turn in range(turns):
        started = time.perf_counter()
        message = llm.chat.completions.create(model="split", messages=messages, tools=TOOLS).choices[0].message
        latencies.append(time.perf_counter() - started)
        answer = message.model_dump(exclude_none=True)
        if not answer.get("tool_calls"):
            return
        messages.append(answer)
        last = " final" if turn == turns - 2 else ""
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"{(task + 1) * turn * 104729 % 99991}{last}"}
                     for c in answer["tool_calls"]]


def samples(sink: ListSink) -> dict[str, int]:
    events = [json.loads(v) for _, v in sink.records]
    responses = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "llm.response"}
    requests: dict[str, list[dict]] = {}
    for e in sorted((e for e in events if e["type"] == "llm.request"), key=lambda e: e["seq"]):
        requests.setdefault(e["rollout_id"], []).append(e["payload"])
    out = {}
    for rollout_id, payloads in requests.items():
        prompts, problems = full_prompts(StoredCall(
            p["call_id"], p["prompt_token_ids"], responses[p["call_id"]]["response_token_ids"],
            p.get("extends_call_id"), p.get("extends_tokens")) for p in payloads)
        assert not problems, problems
        out[rollout_id] = len(merge_calls([Call(
            call_id=p["call_id"], span_id=None, tokenizer=None, chat_template_hash=None, prompt=prompts[p["call_id"]],
            response=np.array(responses[p["call_id"]]["response_token_ids"]), logprobs=None) for p in payloads]))
    return out


def kafka_bytes(sink: ListSink) -> dict:
    """Bytes the gateway produced (keys + values); the JSON bytes of their token id arrays, of the requests'
    messages + tools; the largest payload fields (``type.field``, compact JSON bytes) and the envelopes."""
    ids = history = 0
    parts: Counter[str] = Counter()
    for key, value in sink.records:
        event = json.loads(value)
        payload = event.pop("payload")
        parts["envelopes and keys"] += len(value) - len(json.dumps(payload, separators=(",", ":"))) + len(key)
        for name, field in payload.items():
            size = len(json.dumps(field, separators=(",", ":"), ensure_ascii=False))
            parts[f"{event['type']}.{name}"] += size
            if name in ("prompt_token_ids", "response_token_ids") and field is not None:
                ids += size
            if name in ("messages", "tools") and event["type"] == "llm.request":
                history += size
    return {"total": sum(len(k) + len(v) for k, v in sink.records), "token_ids": ids, "messages": history,
            "parts": parts}


def lake_bytes(sink: ListSink, root: Path, *, rollouts: int) -> dict:
    """The ingested tables' bytes per rollout, written from the sink's events as the ingester writes them,
    as the ingester leaves the lake and again after ``trajlake compact`` (``store.compact``, vacuumed at
    once: what the nightly compact leaves): Parquet data (column chunks, compressed), Parquet footers
    (each file's bytes outside its column chunks: schema, statistics, page index) and ``_delta_log``
    bytes, per table and by ``table.column``.

    One commit per turn, holding that turn's calls of every rollout: the ingester commits what arrived
    in the last moments, and a rollout's turns arrive seconds apart, so its calls land in different
    files, where zstd cannot see the history a full prompt repeats. Compaction z-orders by task and
    rollout: a rollout's calls then share pages, and zstd finds that history itself. Footers and log
    entries are per file and per commit: per rollout they shrink as more rollouts share a commit
    (``lake_commits``, ``lake_files`` give the counts to scale them).
    """
    events = [EVENT_ADAPTER.validate_json(v) for _, v in sink.records]
    turns: dict[int, list] = {}
    seen: dict[str, set[str]] = {}
    for event in sorted(events, key=lambda e: e.seq):
        calls = seen.setdefault(event.rollout_id, set())
        calls.add(event.payload.call_id)
        turns.setdefault(len(calls), []).append(event)
    for batch in turns.values():
        rows = events_table(batch, [KafkaCoordinates("bench", 0, i) for i in range(len(batch))])
        for name, table in {"events": rows, **typed_tables(rows)}.items():
            write_deltalake(str(root / name), table.cast(INGESTED_TABLES[name]), mode="append",
                            writer_properties=WRITER_PROPERTIES)
    ingested = lake_figures(root, rollouts, prefix="lake_")
    compact(Lake(str(root)), vacuum_retention=timedelta(0))
    return {**ingested, **lake_figures(root, rollouts, prefix="lake_compacted_"), "lake_commits": len(turns)}


def lake_figures(root: Path, rollouts: int, *, prefix: str) -> dict:
    """Bytes per rollout of the lake under ``root`` as it is now (every Parquet file there is live)."""
    parts: Counter[str] = Counter()
    files = 0
    for table in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in table.glob("*.parquet"):
            meta = pq.ParquetFile(f).metadata
            chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
            for chunk in chunks:
                parts[f"{table.name}.{chunk.path_in_schema.split('.')[0]}"] += chunk.total_compressed_size
            parts[f"{table.name}.(footers)"] += f.stat().st_size - sum(c.total_compressed_size for c in chunks)
            files += 1
        parts[f"{table.name}.(_delta_log)"] = sum(f.stat().st_size for f in (table / "_delta_log").rglob("*") if f.is_file())

    def per_rollout(select) -> int:
        return round(sum(size for name, size in parts.items() if select(name)) / rollouts)

    tables = sorted({name.split(".")[0] for name in parts})
    return {
        f"{prefix}all_bytes_per_rollout": per_rollout(lambda n: True),
        f"{prefix}bytes_per_rollout": per_rollout(lambda n: "(" not in n),
        f"{prefix}footer_bytes_per_rollout": per_rollout(lambda n: n.endswith("(footers)")),
        f"{prefix}log_bytes_per_rollout": per_rollout(lambda n: n.endswith("(_delta_log)")),
        f"{prefix}prompt_id_bytes_per_rollout": per_rollout(lambda n: n == "llm_requests.prompt_token_ids"),
        f"{prefix}message_bytes_per_rollout": per_rollout(lambda n: n in ("llm_requests.messages", "llm_requests.tools")),
        f"{prefix}files": files,
        f"{prefix}tables_per_rollout": {t: per_rollout(lambda n, t=t: n.startswith(f"{t}.")) for t in tables},
        f"{prefix}largest_parts_per_rollout": largest(parts, rollouts, 10),
    }


def largest(parts: Counter[str], rollouts: int, n: int = 6) -> dict[str, int]:
    """The ``n`` largest parts, in bytes per rollout."""
    return {name: round(size / rollouts) for name, size in parts.most_common(n)}


def stored_bytes(broker: EmbeddedBroker, topic: str, records: int) -> int:
    """What the broker serves back of ``topic`` (``records`` records): its batches as stored + framing."""
    return topic_bytes(broker.bootstrap_servers, topic, records=records, timeout_s=120).served_bytes


def run_arm(engine_url: str, model_dir: Path, workdir: Path, broker: EmbeddedBroker, *, sessions: bool,
            references: bool, rollouts: int, turns: int) -> tuple[dict, ListSink]:
    settings = GatewaySettings(upstream_url=engine_url, gateway_keys=f"{KEY}=bench", spool_dir=workdir / "spool",
                               bootstrap_servers=broker.bootstrap_servers, topic=workdir.name, tokenizer=str(model_dir),
                               token_sessions=sessions, prefix_references=references)
    broker.create_topic(settings.topic, partitions=4)
    sink = ListSink(KafkaSink(settings.bootstrap_servers, settings.topic, timeout_s=30.0,
                              compression=settings.kafka_compression))
    emitter = Emitter(sink, Spool(workdir / "spool", max_bytes=1 << 30), compact_logprobs=settings.compact_logprobs)
    app = create_gateway_app(settings, emitter=emitter)
    latencies: list[float] = []
    with serve_in_thread(app, name="gateway") as url:
        for k in range(rollouts):
            llm = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                         default_headers={"x-trajlake-task-id": "t", "x-trajlake-rollout-id": f"r-{k}"})
            rollout(llm, turns, latencies, task=k)
    emitter.close()
    assert emitter.spooled == 0, "the broker did not take every batch: the stored bytes would be short"
    per_rollout = samples(sink)
    counts = list(per_rollout.values())
    out = {"rollouts": len(counts), "calls": len(latencies),
           "samples_per_rollout": round(sum(counts) / len(counts), 3),
           "single_sample_share": round(sum(c == 1 for c in counts) / len(counts), 3),
           "latency_p50_ms": round(statistics.median(latencies) * 1e3, 2)}
    kafka = kafka_bytes(sink)
    out["kafka_bytes_per_rollout"] = round(kafka["total"] / len(counts))
    out["kafka_compression"] = settings.kafka_compression
    out["kafka_stored_bytes_per_rollout"] = round(stored_bytes(broker, settings.topic, len(sink.records)) / len(counts))
    out["kafka_token_id_bytes_per_rollout"] = round(kafka["token_ids"] / len(counts))
    out["kafka_message_bytes_per_rollout"] = round(kafka["messages"] / len(counts))
    out["kafka_largest_parts_per_rollout"] = largest(kafka["parts"], len(counts))
    out.update(lake_bytes(sink, workdir / "lake", rollouts=len(counts)))
    return out, sink


def engine_logprobs(model_dir: Path, n: int) -> list[float]:
    """``n`` logprobs of tokens the reference engine sampled (``serve-model``, the tiny model, temperature 1)."""
    values: list[float] = []
    with serve_in_thread(create_serve_app(model_dir, served_name="tiny", max_new_tokens_cap=64), name="serve") as url:
        llm = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        while len(values) < n:
            answer = llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Count {len(values)}"}],
                                                 max_tokens=64, temperature=1.0, logprobs=True)
            values += [entry.logprob for entry in answer.choices[0].logprobs.content]
    return values[:n]


def with_logprobs(batch: list[tuple[bytes, bytes]], pool: Iterator[float], encode) -> tuple[list, int]:
    """``batch`` with the next values of ``pool`` as every response's logprobs, ``encode``-d; and their bytes."""
    records, field = [], 0
    for key, value in batch:
        event = json.loads(value)
        if event["type"] == "llm.response" and event["payload"].get("logprobs"):  # compact or not: one a token
            real = [next(pool) for _ in event["payload"]["response_token_ids"]]
            event["payload"]["logprobs"] = encode(real)
            assert encode is list or compact_logprobs.decode(event["payload"]["logprobs"]) == real
            field += len(json.dumps(event["payload"]["logprobs"], separators=(",", ":")))
            value = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
        records.append((key, value))
    return records, field


def logprob_encodings(sink: ListSink, full: ListSink, values: list[float], broker: EmbeddedBroker,
                      rollouts: int) -> dict:
    """Per rollout, with ``values`` (cycled) as every response's logprobs: the logprobs' bytes and the bytes the
    broker stores of the references arm's events (each batch as the gateway sent it, zstd), as JSON numbers and
    compact (base64 float32, decoding to the same numbers: checked); and the key + value bytes of the full
    events arm with them as JSON numbers (the uncompressed events before references and compression)."""
    assert np.array_equal(np.asarray(values, dtype=np.float32).astype(np.float64), np.asarray(values)), \
        "the engine's logprobs are not float32 values: the compact form would not be exact"
    out: dict = {}
    for name, encode in (("json", list), ("f32_base64", compact_logprobs.encode)):
        pool, field = itertools.cycle(values), 0
        topic = f"logprobs-{name}"
        broker.create_topic(topic, partitions=4)
        kafka = KafkaSink(broker.bootstrap_servers, topic, timeout_s=30.0, compression="zstd")
        for batch in sink.batches:
            records, size = with_logprobs(batch, pool, encode)
            kafka.send(records)
            field += size
        kafka.close()
        out[f"{name}_logprob_bytes_per_rollout"] = round(field / rollouts)
        out[f"{name}_stored_bytes_per_rollout"] = round(stored_bytes(broker, topic, len(sink.records)) / rollouts)
    pool = itertools.cycle(values)
    before = sum(len(k) + len(v) for batch in full.batches for k, v in with_logprobs(batch, pool, list)[0])
    out["full_events_json_bytes_per_rollout"] = round(before / rollouts)
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


def session_memory(tokens: int, messages: int, vocab: int, live: int = 10_000) -> dict:
    """Memory of ``live`` sessions whose last prompt and answer hold ``tokens`` ids below ``vocab`` (tracemalloc)."""
    ids = [7919 * n % vocab for n in range(tokens)]  # spread over the vocabulary, as a rollout's are
    kinds = frozenset({("system", ("content",), 0), ("user", ("content",), 0), ("tool", ("content",), 0)})
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = SessionStore(max_bytes=1 << 40, ttl_s=3600)
    for k in range(live):
        store.put(("tenant", f"rollout-{k:06d}", 0, None), Session(
            messages=bytes(DIGEST_BYTES * messages), context=bytes(20), prompt_ids=pack_ids(ids[:-60]),
            sampled_ids=pack_ids(ids[-60:]), call_id=f"call-{k:026d}", raw=bytes(20), kinds=kinds))
    measured = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    return {"live_rollouts": live, "tokens_per_session": tokens, "vocab": vocab, "measured_mib": round(measured / 2**20, 1),
            "accounted_mib": round(store.bytes / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    recorder = Recorder("sessions", f"{args.rollouts} rollouts of {args.turns} tool-using turns through the gateway "
                                    "to an engine that samples non-canonical splits")
    model_dir = build_tiny_model(default_model_dir())
    results: dict = {"turns": args.turns}
    arms = (("without_sessions", False, False), ("with_sessions", True, True), ("with_sessions_full_prompts", True, False))
    sinks = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker, \
            serve_in_thread(create_split_engine(model_dir), name="engine") as engine:
        for name, sessions, references in arms:
            results[name], sinks[name] = run_arm(f"{engine}/v1", model_dir, Path(tmp) / name, broker, sessions=sessions,
                                                 references=references, rollouts=args.rollouts, turns=args.turns)
        results["logprobs"] = logprob_encodings(sinks["with_sessions"], sinks["with_sessions_full_prompts"],
                                                engine_logprobs(model_dir, 4096), broker, args.rollouts)
    results["planner"] = plan_cost(model_dir, args.turns)
    from transformers import AutoTokenizer

    tokens = results["planner"]["prompt_tokens_at_last_turn"]
    results["memory"] = session_memory(tokens, 2 * args.turns + 3, len(AutoTokenizer.from_pretrained(model_dir)))
    results["memory_4_byte_ids"] = session_memory(tokens, 2 * args.turns + 3, 151_936)  # a Qwen-sized vocabulary
    print(json.dumps(results, indent=2))
    write(recorder, results)


def write(recorder: Recorder, results: dict) -> None:
    off, on, full = results["without_sessions"], results["with_sessions"], results["with_sessions_full_prompts"]
    planner, memory, logprobs = results["planner"], results["memory"], results["logprobs"]

    def kb(a: dict, b: dict, key: str) -> str:
        return f"{a[key] / 1e3:,.1f} vs {b[key] / 1e3:,.1f} KB"

    def fewer(key: str) -> float:
        return round(full[key] / on[key], 2)

    ratios = [
        Ratio("samples_per_rollout", "samples per rollout, without token sessions / with",
              [round(off["samples_per_rollout"] / on["samples_per_rollout"], 2)]),
        Ratio("kafka_bytes", "Kafka key + value bytes (uncompressed) per rollout, full events / references",
              [fewer("kafka_bytes_per_rollout")], goal=10.0),
        Ratio("kafka_stored_bytes", f"Kafka bytes stored ({on['kafka_compression']} batches, as the broker serves them) "
              "per rollout, full events / references", [fewer("kafka_stored_bytes_per_rollout")], goal=10.0),
        Ratio("kafka_before_after", "Kafka bytes per rollout, full events uncompressed (before) / references stored "
              f"{on['kafka_compression']} (now); the split engine's constant logprobs (flatter zstd: no goal)",
              [round(full["kafka_bytes_per_rollout"] / on["kafka_stored_bytes_per_rollout"], 2)]),
        Ratio("kafka_before_after_real_logprobs", "the same with real engine logprobs: full events uncompressed, "
              "JSON logprobs (before) / references stored zstd, compact logprobs (now)",
              [round(logprobs["full_events_json_bytes_per_rollout"] / logprobs["f32_base64_stored_bytes_per_rollout"],
                     2)], goal=10.0),
        Ratio("kafka_logprob_encoding", "Kafka bytes stored per rollout with real engine logprobs, as JSON numbers / "
              "compact (base64 float32)", [round(logprobs["json_stored_bytes_per_rollout"]
                                       / logprobs["f32_base64_stored_bytes_per_rollout"], 2)]),
        Ratio("lake_bytes", "lake data bytes (column chunks) per rollout as ingested, full events / references",
              [fewer("lake_bytes_per_rollout")], goal=10.0),
        Ratio("lake_file_bytes", "lake bytes per rollout as ingested (data + Parquet footers + _delta_log), "
              "full events / references", [fewer("lake_all_bytes_per_rollout")]),
        Ratio("lake_compacted_bytes", "lake bytes per rollout after compact (data + Parquet footers + _delta_log), "
              "full events / references", [fewer("lake_compacted_all_bytes_per_rollout")], goal=10.0),
        Ratio("lake_compacted_data_bytes", "lake data bytes (column chunks) per rollout after compact, "
              "full events / references", [fewer("lake_compacted_bytes_per_rollout")]),
        Ratio("kafka_token_id_bytes", "Kafka token-id bytes per rollout, full prompts / prefix references",
              [fewer("kafka_token_id_bytes_per_rollout")], goal=10.0),
        Ratio("lake_prompt_id_bytes", "lake prompt-id bytes (llm_requests) per rollout, full prompts / references",
              [fewer("lake_prompt_id_bytes_per_rollout")], goal=10.0),
        Ratio("kafka_message_bytes", "Kafka messages + tools bytes per rollout, full / references",
              [fewer("kafka_message_bytes_per_rollout")]),
        Ratio("lake_message_bytes", "lake messages + tools bytes (llm_requests) per rollout, full / references",
              [fewer("lake_message_bytes_per_rollout")]),
    ]
    left = ", ".join(f"{name} {size / 1e3:.1f}" for name, size in list(on["kafka_largest_parts_per_rollout"].items())[:4])
    left_lake = ", ".join(f"{name} {size / 1e3:.1f}" for name, size in list(
        (n, b) for n, b in on["lake_compacted_largest_parts_per_rollout"].items() if "(" not in n)[:3])
    summary = (f"with sessions {on['samples_per_rollout']:.2f} samples per rollout "
               f"({on['single_sample_share']:.0%} single-sample; without {off['samples_per_rollout']:.2f}); "
               f"per rollout with references vs full events: Kafka {kb(on, full, 'kafka_bytes_per_rollout')} "
               f"(token ids {kb(on, full, 'kafka_token_id_bytes_per_rollout')}, messages + tools "
               f"{kb(on, full, 'kafka_message_bytes_per_rollout')}), lake {kb(on, full, 'lake_bytes_per_rollout')} "
               f"(prompt ids {kb(on, full, 'lake_prompt_id_bytes_per_rollout')}, messages + tools "
               f"{kb(on, full, 'lake_message_bytes_per_rollout')}; Parquet footers "
               f"{kb(on, full, 'lake_footer_bytes_per_rollout')}, _delta_log {kb(on, full, 'lake_log_bytes_per_rollout')}: "
               f"per file and per commit, here {on['lake_files']} files in {on['lake_commits']} commits of "
               f"{on['rollouts']} rollouts), after compact {kb(on, full, 'lake_compacted_bytes_per_rollout')} "
               f"(footers {kb(on, full, 'lake_compacted_footer_bytes_per_rollout')}, _delta_log "
               f"{kb(on, full, 'lake_compacted_log_bytes_per_rollout')}; largest data with references: {left_lake}); "
               f"Kafka stored ({on['kafka_compression']}, one call "
               f"per batch) {kb(on, full, 'kafka_stored_bytes_per_rollout')}; what is left on Kafka is mostly per call "
               f"(uncompressed KB per rollout: {left}); with real engine logprobs (the split engine's are one constant) "
               f"stored {logprobs['json_stored_bytes_per_rollout'] / 1e3:,.1f} KB as JSON numbers vs "
               f"{logprobs['f32_base64_stored_bytes_per_rollout'] / 1e3:,.1f} KB compact, base64 float32 (logprobs "
               f"{logprobs['json_logprob_bytes_per_rollout'] / 1e3:,.1f} vs "
               f"{logprobs['f32_base64_logprob_bytes_per_rollout'] / 1e3:,.1f} KB uncompressed; full events "
               f"{logprobs['full_events_json_bytes_per_rollout'] / 1e3:,.1f} KB uncompressed); planning p50 {planner['plan_p50_ms']:.1f} ms, "
               f"{planner['plan_at_last_turn_ms']:.1f} ms at turn {results['turns']} "
               f"({planner['prompt_tokens_at_last_turn']:,}-token prompt); client p50 per call {on['latency_p50_ms']:.0f} ms "
               f"with sessions vs {off['latency_p50_ms']:.0f} ms without; session memory {memory['measured_mib']:.0f} MiB "
               f"per {memory['live_rollouts']:,} live rollouts ({results['memory_4_byte_ids']['measured_mib']:.0f} MiB with "
               f"a vocabulary over 65,536: 4-byte ids)")
    recorder.write(ratios=ratios, summary=summary, detail=results)


if __name__ == "__main__":
    main()
