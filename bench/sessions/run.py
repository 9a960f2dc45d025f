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
Batched: the references and full-events arms again with the rollouts in
parallel (one thread each), so the gateway's emitter and producer batch
the calls that arrive together (group commit, librdkafka's per-partition
batches) as a busier gateway does; their stored bytes are reported apart.
Token-id encodings: the references arm's events (real logprobs, compact)
stored with response and prompt ids as JSON numbers, as base64 of
little-endian uint32 and as base64 of LEB128 varints.
Floor: the bytes references cannot remove, each rollout's own tokens (new
prompt ids, response ids, logprobs: real, compact), measured like for like
against the full events with the same real logprobs: on Kafka as bytes
(those fields' JSON) and as stored records (the same batches, zstd), in
the lake as the token columns' data (one copy: ``llm_requests``,
``llm_responses``) against the full events' data.
Writes ``bench/sessions/results.json`` (``bench.results`` format).

    .venv/bin/python bench/sessions/run.py [--rollouts 8] [--turns 30]
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
import tempfile
import time
import tracemalloc
import uuid
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
    envelope: Counter[str] = Counter()
    for key, value in sink.records:
        event = json.loads(value)
        payload = event.pop("payload")
        parts["envelopes and keys"] += len(value) - len(json.dumps(payload, separators=(",", ":"))) + len(key)
        envelope["(key)"] += len(key)
        for name, field in event.items():  # "name":value, and its comma
            envelope[name] += len(name) + 4 + len(json.dumps(field, separators=(",", ":"), ensure_ascii=False))
        for name, field in payload.items():
            size = len(json.dumps(field, separators=(",", ":"), ensure_ascii=False))
            parts[f"{event['type']}.{name}"] += size
            if name in ("prompt_token_ids", "response_token_ids") and field is not None:
                ids += size
            if name in ("messages", "tools") and event["type"] == "llm.request":
                history += size
    return {"total": sum(len(k) + len(v) for k, v in sink.records), "token_ids": ids, "messages": history,
            "parts": parts, "envelope": envelope}


def lake_bytes(records: list[tuple[bytes, bytes]], root: Path, *, rollouts: int) -> dict:
    """The ingested tables' bytes per rollout, written from ``records`` (the events) as the ingester writes them,
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
    events = [EVENT_ADAPTER.validate_json(v) for _, v in records]
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
    """Bytes per rollout of the ingested tables under ``root`` as they are now (every Parquet file there is live);
    the tables ``trajlake compact`` derives from them (pre-joined calls, rollouts, tool steps and their marks: a
    copy for fast reads) apart, as ``derived_all_bytes_per_rollout``."""
    parts: Counter[str] = Counter()
    files = 0
    derived = sum(f.stat().st_size for table in root.iterdir() if table.is_dir() and table.name not in INGESTED_TABLES
                  for f in table.rglob("*") if f.is_file())
    for table in sorted(p for p in root.iterdir() if p.is_dir() and p.name in INGESTED_TABLES):
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
        f"{prefix}token_bytes_per_rollout": per_rollout(lambda n: n in TOKEN_COLUMNS),
        f"{prefix}files": files,
        f"{prefix}derived_all_bytes_per_rollout": round(derived / rollouts),
        f"{prefix}tables_per_rollout": {t: per_rollout(lambda n, t=t: n.startswith(f"{t}.")) for t in tables},
        f"{prefix}largest_parts_per_rollout": largest(parts, rollouts, 10),
    }


TOKEN_COLUMNS = ("llm_requests.prompt_token_ids", "llm_responses.response_token_ids", "llm_responses.logprobs")
"""A rollout's own tokens in the lake, one copy (``events`` holds them again)."""


def largest(parts: Counter[str], rollouts: int, n: int = 6) -> dict[str, int]:
    """The ``n`` largest parts, in bytes per rollout."""
    return {name: round(size / rollouts) for name, size in parts.most_common(n)}


def stored_bytes(broker: EmbeddedBroker, topic: str, records: int) -> int:
    """What the broker serves back of ``topic`` (``records`` records): its batches as stored + framing."""
    return topic_bytes(broker.bootstrap_servers, topic, records=records, timeout_s=120).served_bytes


def run_arm(engine_url: str, model_dir: Path, workdir: Path, broker: EmbeddedBroker, *, sessions: bool,
            references: bool, rollouts: int, turns: int, parallel: bool = False) -> tuple[dict, ListSink]:
    """One arm: ``rollouts`` rollouts through a gateway, one after the other (each call's events one Kafka batch)
    or ``parallel`` (one thread each: the calls that arrive together share batches; no lake then)."""
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
        def one(k: int) -> None:
            llm = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                         default_headers={"x-trajlake-task-id": "t", "x-trajlake-rollout-id": f"r-{k}"})
            rollout(llm, turns, latencies, task=k)

        if parallel:
            with ThreadPoolExecutor(rollouts) as pool:
                list(pool.map(one, range(rollouts)))
        else:
            for k in range(rollouts):
                one(k)
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
    out["kafka_envelope_fields_per_rollout"] = largest(kafka["envelope"], len(counts), 20)
    out["kafka_sends"] = len(sink.batches)
    out["calls_per_send"] = round(len(sink.records) / 2 / len(sink.batches), 2)
    if not parallel:
        out.update(lake_bytes(sink.records, workdir / "lake", rollouts=len(counts)))
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


Batches = list[list[tuple[bytes, bytes]]]


def with_real_logprobs(batches: Batches, values: list[float], encode) -> tuple[Batches, int]:
    """``batches`` with ``values`` (cycled from the start) as every response's logprobs, ``encode``-d; and the
    logprobs' bytes."""
    pool, out, field = itertools.cycle(values), [], 0
    for batch in batches:
        records, size = with_logprobs(batch, pool, encode)
        out.append(records)
        field += size
    return out, field


def resend(batches: Batches, broker: EmbeddedBroker, topic: str) -> int:
    """The bytes the broker stores of ``batches``, each sent as one producer send (zstd) to a new ``topic``."""
    broker.create_topic(topic, partitions=4)
    kafka = KafkaSink(broker.bootstrap_servers, topic, timeout_s=30.0, compression="zstd")
    for batch in batches:
        if batch:
            kafka.send(batch)
    kafka.close()
    return stored_bytes(broker, topic, sum(map(len, batches)))


def key_value_bytes(batches: Batches) -> int:
    return sum(len(k) + len(v) for batch in batches for k, v in batch)


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
        batches, field = with_real_logprobs(sink.batches, values, encode)
        out[f"{name}_logprob_bytes_per_rollout"] = round(field / rollouts)
        out[f"{name}_stored_bytes_per_rollout"] = round(resend(batches, broker, f"logprobs-{name}") / rollouts)
    out["full_events_json_bytes_per_rollout"] = round(
        key_value_bytes(with_real_logprobs(full.batches, values, list)[0]) / rollouts)
    return out


def batched(sinks: dict[str, ListSink], values: list[float], broker: EmbeddedBroker, rollouts: int) -> dict:
    """Per rollout, the parallel arms' batches (as their gateways sent them) with real logprobs, compact: the
    bytes the broker stores of the references and of the full events."""
    out = {}
    for name in ("with_sessions_batched", "with_sessions_full_prompts_batched"):
        batches = with_real_logprobs(sinks[name].batches, values, compact_logprobs.encode)[0]
        out[f"{name}_stored_bytes_per_rollout"] = round(resend(batches, broker, f"real-{name}") / rollouts)
    return out


def varint_base64(ids: list[int]) -> str:
    """Base64 of the ids as LEB128 varints (7 bits a byte: 1 byte below 128, 2 below 16,384, 3 below 2,097,152)."""
    out = bytearray()
    for i in ids:
        while i >= 0x80:
            out.append(i & 0x7F | 0x80)
            i >>= 7
        out.append(i)
    return base64.b64encode(bytes(out)).decode("ascii")


def uint32_base64(ids: list[int]) -> str:
    return base64.b64encode(np.asarray(ids, dtype="<u4").tobytes()).decode("ascii")


def with_ids(batch: list[tuple[bytes, bytes]], encode: Callable[[list[int]], str]) -> tuple[list, int]:
    """``batch`` with every token id array ``encode``-d; and their bytes."""
    records, field = [], 0
    for key, value in batch:
        event = json.loads(value)
        for name in ("prompt_token_ids", "response_token_ids"):
            if event["payload"].get(name) is not None:
                event["payload"][name] = encode(event["payload"][name])
                field += len(event["payload"][name]) + 2
        records.append((key, json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()))
    return records, field


def id_encodings(real: Batches, broker: EmbeddedBroker, rollouts: int) -> dict:
    """Per rollout, the references arm's events (``real``: real logprobs, compact) with their token ids as JSON
    numbers, as base64 of little-endian uint32 and as base64 of LEB128 varints: the ids' bytes and what the
    broker stores (each batch as the gateway sent it, zstd)."""
    out = {}
    for name, encode in (("json", None), ("uint32_base64", uint32_base64), ("varint_base64", varint_base64)):
        if encode is None:
            batches, field = real, sum(len(json.dumps(json.loads(v)["payload"].get(f), separators=(",", ":")))
                                       for batch in real for _, v in batch
                                       for f in ("prompt_token_ids", "response_token_ids")
                                       if json.loads(v)["payload"].get(f) is not None)
        else:
            pairs = [with_ids(batch, encode) for batch in real]
            batches, field = [records for records, _ in pairs], sum(size for _, size in pairs)
        out[f"{name}_id_bytes_per_rollout"] = round(field / rollouts)
        out[f"{name}_stored_bytes_per_rollout"] = round(resend(batches, broker, f"ids-{name}") / rollouts)
    return out


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def base32_id(text: str) -> str:
    """A UUID's 128 bits as 26 Crockford base32 characters (ULID's form: sorts as the UUID does)."""
    n = uuid.UUID(text).int
    return "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in range(25, -1, -1))


def with_short_ids(batch: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``batch`` with every event id and gateway call id (``call-`` + a UUID) in 26-character base32."""
    records = []
    for key, value in batch:
        event = json.loads(value)
        event["event_id"] = base32_id(event["event_id"])
        payload = event["payload"]
        for name in ("call_id", "extends_call_id"):
            if payload.get(name):
                payload[name] = "call-" + base32_id(payload[name].removeprefix("call-"))
        records.append((key, json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()))
    return records


def id_forms(real: Batches, broker: EmbeddedBroker, rollouts: int) -> dict:
    """Per rollout, the references arm's events (``real``) with event and call ids as UUID text (36 characters)
    and as 26-character base32: key + value bytes, and what the broker stores (each batch as sent, zstd)."""
    short = [with_short_ids(batch) for batch in real]
    return {"uuid_bytes_per_rollout": round(key_value_bytes(real) / rollouts),
            "base32_bytes_per_rollout": round(key_value_bytes(short) / rollouts),
            "uuid_stored_bytes_per_rollout": round(resend(real, broker, "ids-uuid") / rollouts),
            "base32_stored_bytes_per_rollout": round(resend(short, broker, "ids-base32") / rollouts)}


OWN_FIELDS = ("prompt_token_ids", "response_token_ids", "logprobs")
"""What references cannot remove: a rollout's own tokens (a reference's prompt ids are only the new ones)."""


def floor(references: Batches, full: Batches, broker: EmbeddedBroker, workdir: Path, rollouts: int) -> dict:
    """Per rollout, the bytes references cannot remove against the full events, like for like (both with the
    same real logprobs, compact): on Kafka the own fields' JSON bytes and the records of only those fields
    (same keys and batches) as stored; in the lake the token columns' data of the references lake (one copy)
    against the full events lake's data, as ingested and after compact."""
    own_batches, own = [], 0
    for batch in references:
        records = []
        for key, value in batch:
            payload = json.loads(value)["payload"]
            fields = {name: payload[name] for name in OWN_FIELDS if payload.get(name) is not None}
            if fields:
                records.append((key, json.dumps(fields, separators=(",", ":")).encode()))
                own += sum(len(json.dumps(v, separators=(",", ":"))) for v in fields.values())
        own_batches.append(records)
    out = {"kafka_own_bytes_per_rollout": round(own / rollouts),
           "kafka_own_stored_bytes_per_rollout": round(resend(own_batches, broker, "floor-own") / rollouts),
           "kafka_full_bytes_per_rollout": round(key_value_bytes(full) / rollouts),
           "kafka_full_stored_bytes_per_rollout": round(resend(full, broker, "floor-full") / rollouts)}
    kept = ("lake_bytes_per_rollout", "lake_token_bytes_per_rollout", "lake_compacted_bytes_per_rollout",
            "lake_compacted_token_bytes_per_rollout")
    for name, batches in (("references", references), ("full", full)):
        lake = lake_bytes([r for batch in batches for r in batch], workdir / f"floor-{name}", rollouts=rollouts)
        out[f"lake_{name}"] = {key: lake[key] for key in kept}
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
    arms = (("without_sessions", False, False, False), ("with_sessions", True, True, False),
            ("with_sessions_full_prompts", True, False, False), ("with_sessions_batched", True, True, True),
            ("with_sessions_full_prompts_batched", True, False, True))
    sinks = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker, \
            serve_in_thread(create_split_engine(model_dir), name="engine") as engine:
        for name, sessions, references, parallel in arms:
            results[name], sinks[name] = run_arm(f"{engine}/v1", model_dir, Path(tmp) / name, broker, sessions=sessions,
                                                 references=references, rollouts=args.rollouts, turns=args.turns,
                                                 parallel=parallel)
        values = engine_logprobs(model_dir, 4096)
        results["logprobs"] = logprob_encodings(sinks["with_sessions"], sinks["with_sessions_full_prompts"],
                                                values, broker, args.rollouts)
        results["batched"] = batched(sinks, values, broker, args.rollouts)
        real = {name: with_real_logprobs(sinks[name].batches, values, compact_logprobs.encode)[0]
                for name in ("with_sessions", "with_sessions_full_prompts")}
        results["token_ids"] = id_encodings(real["with_sessions"], broker, args.rollouts)
        results["id_forms"] = id_forms(real["with_sessions"], broker, args.rollouts)
        results["floor"] = floor(real["with_sessions"], real["with_sessions_full_prompts"], broker, Path(tmp),
                                 args.rollouts)
    results["planner"] = plan_cost(model_dir, args.turns)
    from transformers import AutoTokenizer

    tokens = results["planner"]["prompt_tokens_at_last_turn"]
    results["memory"] = session_memory(tokens, 2 * args.turns + 3, len(AutoTokenizer.from_pretrained(model_dir)))
    results["memory_4_byte_ids"] = session_memory(tokens, 2 * args.turns + 3, 151_936)  # a Qwen-sized vocabulary
    print(json.dumps(results, indent=2))
    write(recorder, results)


def write(recorder: Recorder, results: dict) -> None:
    off, on, full = results["without_sessions"], results["with_sessions"], results["with_sessions_full_prompts"]
    on_par, full_par = results["with_sessions_batched"], results["with_sessions_full_prompts_batched"]
    planner, memory, logprobs = results["planner"], results["memory"], results["logprobs"]
    real_par, ids, fl, forms = results["batched"], results["token_ids"], results["floor"], results["id_forms"]
    lake_on, lake_full = fl["lake_references"], fl["lake_full"]

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
        Ratio("kafka_batched_stored_bytes", f"Kafka bytes stored per rollout, {on_par['rollouts']} rollouts in parallel "
              f"(the gateway batches calls that arrive together: {on_par['calls_per_send']} calls a send with "
              "references), full events / references; the split engine's constant logprobs",
              [round(full_par["kafka_stored_bytes_per_rollout"] / on_par["kafka_stored_bytes_per_rollout"], 2)]),
        Ratio("kafka_batched_real_logprobs", "the same with real engine logprobs (compact both), full events / "
              "references", [round(real_par["with_sessions_full_prompts_batched_stored_bytes_per_rollout"]
                                   / real_par["with_sessions_batched_stored_bytes_per_rollout"], 2)], goal=10.0),
        Ratio("kafka_batched_before_after_real_logprobs", "Kafka bytes per rollout with real engine logprobs: full "
              "events uncompressed, JSON logprobs (before) / references stored zstd, compact logprobs, rollouts in "
              "parallel (now, batched)", [round(logprobs["full_events_json_bytes_per_rollout"]
                                               / real_par["with_sessions_batched_stored_bytes_per_rollout"], 2)],
              goal=10.0),
        Ratio("kafka_floor", "the most references allow on Kafka, uncompressed: full events / a rollout's own tokens "
              "(new prompt ids, response ids, real logprobs compact)",
              [round(fl["kafka_full_bytes_per_rollout"] / fl["kafka_own_bytes_per_rollout"], 2)]),
        Ratio("kafka_stored_floor", "the same stored (zstd, one call per batch): full events / records of only a "
              "rollout's own tokens", [round(fl["kafka_full_stored_bytes_per_rollout"]
                                             / fl["kafka_own_stored_bytes_per_rollout"], 2)]),
        Ratio("lake_floor", "the most references allow in the lake, data as ingested: full events / a rollout's own "
              "token columns, one copy (real logprobs)", [round(lake_full["lake_bytes_per_rollout"]
                                                                / lake_on["lake_token_bytes_per_rollout"], 2)]),
        Ratio("lake_compacted_floor", "the same after compact",
              [round(lake_full["lake_compacted_bytes_per_rollout"]
                     / lake_on["lake_compacted_token_bytes_per_rollout"], 2)]),
        Ratio("kafka_id_encoding", "Kafka bytes stored per rollout with token ids as JSON numbers / as base64 LEB128 "
              "varints (references, real logprobs; kept as JSON)",
              [round(ids["json_stored_bytes_per_rollout"] / ids["varint_base64_stored_bytes_per_rollout"], 2)]),
        Ratio("kafka_short_ids", "Kafka bytes stored per rollout with event and call ids as UUID text / as 26-character "
              "base32 (references, real logprobs; kept as UUIDs)",
              [round(forms["uuid_stored_bytes_per_rollout"] / forms["base32_stored_bytes_per_rollout"], 2)]),
    ]
    envelope = ", ".join(f"{name} {size / 1e3:.1f}" for name, size in list(
        on["kafka_envelope_fields_per_rollout"].items())[:6])
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
               f"{logprobs['full_events_json_bytes_per_rollout'] / 1e3:,.1f} KB uncompressed); envelope fields (KB "
               f"per rollout, fields at their defaults left out): {envelope}; batched ({on_par['rollouts']} rollouts "
               f"in parallel, {on_par['calls_per_send']} calls a send with references, {full_par['calls_per_send']} "
               f"full) stored {kb(on_par, full_par, 'kafka_stored_bytes_per_rollout')}, with real logprobs "
               f"{real_par['with_sessions_batched_stored_bytes_per_rollout'] / 1e3:,.1f} vs "
               f"{real_par['with_sessions_full_prompts_batched_stored_bytes_per_rollout'] / 1e3:,.1f} KB; floor (real "
               f"logprobs, compact): a rollout's own tokens {fl['kafka_own_bytes_per_rollout'] / 1e3:,.1f} KB on Kafka "
               f"({fl['kafka_own_stored_bytes_per_rollout'] / 1e3:,.1f} stored) vs full events "
               f"{fl['kafka_full_bytes_per_rollout'] / 1e3:,.1f} ({fl['kafka_full_stored_bytes_per_rollout'] / 1e3:,.1f} "
               f"stored), lake token columns {lake_on['lake_token_bytes_per_rollout'] / 1e3:,.1f} KB "
               f"({lake_on['lake_compacted_token_bytes_per_rollout'] / 1e3:,.1f} after compact) vs full events' data "
               f"{lake_full['lake_bytes_per_rollout'] / 1e3:,.1f} ({lake_full['lake_compacted_bytes_per_rollout'] / 1e3:,.1f}); "
               f"token ids stored {ids['json_stored_bytes_per_rollout'] / 1e3:,.1f} KB as JSON, "
               f"{ids['uint32_base64_stored_bytes_per_rollout'] / 1e3:,.1f} as base64 uint32, "
               f"{ids['varint_base64_stored_bytes_per_rollout'] / 1e3:,.1f} as base64 varints (uncompressed "
               f"{ids['json_id_bytes_per_rollout'] / 1e3:,.1f}, {ids['uint32_base64_id_bytes_per_rollout'] / 1e3:,.1f}, "
               f"{ids['varint_base64_id_bytes_per_rollout'] / 1e3:,.1f}); event and call ids as UUID text vs 26-character "
               f"base32: {forms['uuid_bytes_per_rollout'] / 1e3:,.1f} vs "
               f"{forms['base32_bytes_per_rollout'] / 1e3:,.1f} KB uncompressed, stored "
               f"{forms['uuid_stored_bytes_per_rollout'] / 1e3:,.1f} vs {forms['base32_stored_bytes_per_rollout'] / 1e3:,.1f} KB; planning p50 {planner['plan_p50_ms']:.1f} ms, "
               f"{planner['plan_at_last_turn_ms']:.1f} ms at turn {results['turns']} "
               f"({planner['prompt_tokens_at_last_turn']:,}-token prompt); client p50 per call {on['latency_p50_ms']:.0f} ms "
               f"with sessions vs {off['latency_p50_ms']:.0f} ms without; session memory {memory['measured_mib']:.0f} MiB "
               f"per {memory['live_rollouts']:,} live rollouts ({results['memory_4_byte_ids']['measured_mib']:.0f} MiB with "
               f"a vocabulary over 65,536: 4-byte ids)")
    recorder.write(ratios=ratios, summary=summary, detail=results)


if __name__ == "__main__":
    main()
