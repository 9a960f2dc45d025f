"""A large bench lake, fast: the typed tables written straight from columns, as the ingester leaves them.

``devkit.workload`` builds wire events one dict at a time (~5,500 LLM calls a
minute through validation and the ingester's conversion); a million calls
would take hours. This module draws the same rollouts' *shape* from the same
``WorkloadConfig`` (calls per rollout, sub-agents, summarisation at the
context limit, harness retries, untokenized and retokenized responses,
failures, truncation, late and doubled rewards, the simulated clock, the
size fractions of ``devkit.workload``) with one seeded RNG per commit, keeps
only lengths and scalars per event in Python, and builds every token list at
once with NumPy (each prompt is a prefix of its context's token stream, so
prompts are full prompts and extend the previous one as in the workload).
Rows go through ``Lake.append`` with the catalogue's schemas, ``per_commit``
rollouts per Delta commit per table; late rewards land one commit later.

What the ingester's dedupe leaves is kept on purpose: of the producer
resends (same event ids; the workload resends LLM pairs, here tool pairs and
rollout ends too), ``kept_resend_rate`` survive (the dedupe window is
bounded), and ``keyed_error_rate`` of calls are answered twice under one
call id, first by an error, then by the success. The views must collapse
both. Not drawn: retokenization drift (the SQL questions do not look inside
token lists) and the ``events`` table (no view reads it).
"""

from __future__ import annotations

import collections
import contextlib
import json
import multiprocessing
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from devkit.workload import (
    _OBSERVATION,
    _RESPONSE,
    _SUMMARY,
    _SYSTEM,
    _TASK,
    _WORDS,
    DELEGATE,
    FIRST_TEXT_TOKEN,
    IM_END,
    STATE_CHANGING_TOOLS,
    TOOL_SPECS,
    AgentTurns,
    RolloutPlan,
    WorkloadConfig,
)
from ingest.ids import uuid7
from schemas.tables import (
    LLM_REQUESTS_TABLE,
    LLM_RESPONSES_TABLE,
    REWARDS_TABLE,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
    TOOL_CALLS_TABLE,
    TOOL_RESULTS_TABLE,
    TYPED_TABLES,
)
from store.lake import Lake

SCHEMAS = {name: schema for name, schema in TYPED_TABLES.values()}
TOPIC = "bench.events"
KEYED_ERROR = "upstream error: 503 Service Unavailable"
TOOL_CRASH = "RuntimeError: tool process crashed"
_COMPACT = (",", ":")
_TOKEN_COLUMNS = ("prompt_token_ids", "response_token_ids", "logprobs")
_TOOLS_JSON = json.dumps(TOOL_SPECS, separators=_COMPACT)


@dataclass(frozen=True)
class FastLakeConfig:
    """The workload to draw (rates, sizes, clock) and what this generator adds to it."""

    workload: WorkloadConfig
    per_commit: int = 50
    """Rollouts per Delta commit (per table), as an ingester batch would hold them."""
    kept_resend_rate: float = 0.1
    """Fraction of producer resends (same event ids) that outlive the ingester's bounded dedupe window."""
    keyed_error_rate: float = 0.005
    """Per LLM call: an error response first, then the success, under the same call id."""

    @classmethod
    def for_rollouts(cls, rollouts: int, *, seed: int = 0, per_commit: int = 50,
                     max_context_tokens: int = 512) -> FastLakeConfig:
        """``rollouts`` rollouts, 8 per task (as ``bench.build.make_lake``), contexts of ``max_context_tokens``."""
        workload = WorkloadConfig(tasks=max(1, -(-rollouts // 8)), rollouts_per_task=min(8, rollouts), seed=seed,
                                  max_context_tokens=max_context_tokens)
        return cls(workload, per_commit=per_commit)


@dataclass
class _Context:
    """One agent context's token stream: a region of the commit's token pool; prompts are its prefixes."""

    start: int
    length: int
    started: bool = False


@dataclass
class _Agent:
    span_id: str
    parent_span_id: str | None
    system_len: int
    context: _Context
    calls_left: int
    messages: list[str]
    pending: int = 0
    report_to: _Agent | None = None


class _Commit(AgentTurns):
    """Draws ``rollouts`` consecutive rollouts into rows; token lists are built at the end."""

    def __init__(self, config: FastLakeConfig, first: int, count: int, offset: int) -> None:
        self.cfg, self.w = config, config.workload
        self.subagent_rate = self.w.subagent_rate
        self.rng = random.Random(f"trajlake-fast-lake/{self.w.seed}/commit/{first}")
        self.first, self.count, self.offset = first, count, offset
        self.rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SCHEMAS}
        self.late: list[dict[str, Any]] = []
        self.pool_len = 0
        self.region = self.w.max_context_tokens + 64
        # token lists as (pool start, length, present) per request / response row, in row order
        self.prompts: list[tuple[int, int, bool]] = []
        self.answers: list[tuple[int, int, bool, bool]] = []
        self.calls = 0

    # ------------------------------------------------------------ primitives

    def _n(self, size: tuple[float, float], rng: random.Random | None = None) -> int:
        return max(2, int(self.w.max_context_tokens * (rng or self.rng).uniform(*size)))

    def _words(self, n: int) -> str:
        return " ".join(self.rng.choices(_WORDS, k=max(1, min(40, n))))

    def _context(self, length: int) -> _Context:
        ctx = _Context(self.pool_len, length)
        self.pool_len += self.region
        return ctx

    def _advance(self, low: float, high: float) -> float:
        ms = round(self.rng.uniform(low, high), 1)
        self.clock += int(ms) + 1
        return ms

    def _row(self, agent: _Agent, **values: Any) -> dict[str, Any]:
        row = {
            "event_id": uuid7(unix_ms=self.clock, random_bytes=self.rng.randbytes(10)),
            "ts": self.clock * 1000, "seq": self.seq, "span_id": agent.span_id,
            "parent_span_id": agent.parent_span_id, **self.key, **values,
        }
        self.seq += 1
        return row

    def _put(self, table: str, row: dict[str, Any]) -> None:
        row["kafka_offset"] = self.offset
        self.offset += 1
        self.rows[table].append(row)

    def _resend(self, pairs: list[tuple[str, dict[str, Any]]], resent: bool) -> None:
        """A producer resend (same event ids) the dedupe window missed: the rows again, later on the wire."""
        if resent and self.rng.random() < self.cfg.kept_resend_rate:
            for table, row in pairs:
                self._put(table, dict(row))
                if table == LLM_REQUESTS_TABLE:
                    self.prompts.append(self.prompts[-1])
                elif table == LLM_RESPONSES_TABLE:
                    self.answers.append(self.answers[-1])

    # ------------------------------------------------------------ one rollout

    def rollout(self, index: int) -> None:
        w, rng = self.w, self.rng
        task = index // w.rollouts_per_task
        task_rng = random.Random(f"trajlake-fast-lake/{w.seed}/task/{task}")
        version = rng.choice(w.harness_versions)
        version_rng = random.Random(f"trajlake-fast-lake/harness/{version}")
        self.system_len = self._n(_SYSTEM, version_rng) + 3
        self.sub_system_len = self._n(_SYSTEM, version_rng) + 3
        self.template_hash = f"sha256:{version_rng.getrandbits(64):016x}"
        start_ms = w.start_ms + index * w.rollout_spacing_ms
        self.clock, self.seq = start_ms, 0
        self.policy = rng.choice(w.policy_versions)
        self.key = {
            "tenant": task_rng.choice(w.tenants), "task_id": f"task-s{w.seed}-{task:05d}",
            "rollout_id": uuid7(unix_ms=start_ms, random_bytes=rng.randbytes(10)), "attempt": 0,
            "harness_name": w.harness_name, "harness_version": version,
            "harness_config_hash": f"sha256:{version_rng.getrandbits(64):016x}",
            "kafka_topic": TOPIC, "kafka_partition": 0,
        }
        self.subs: list[_Agent] = []
        plan = RolloutPlan.draw(w, rng)
        task_len = self._n(_TASK, task_rng) + 3
        root = self._agent(self.system_len, task_len, plan.calls, None)
        self._put(ROLLOUT_STARTS_TABLE, self._row(root, group_id=self.key["task_id"], policy_version=self.policy,
            metadata=f'{{"env":"synthetic","max_calls":{plan.calls}}}'))
        made = plan.drive(root, self.subs, self._step)
        status, reason = plan.outcome(w)
        self._advance(5, 50)
        end = self._row(root, status=status, reason=reason, steps=made)
        self._put(ROLLOUT_ENDS_TABLE, end)
        self._resend([(ROLLOUT_ENDS_TABLE, end)], rng.random() < w.duplicate_send_rate)
        self._rewards(root, status)

    def _agent(self, system_len: int, opening: int, calls: int, parent: _Agent | None) -> _Agent:
        return _Agent(
            span_id=self._id("span"), parent_span_id=parent.span_id if parent else None, system_len=system_len,
            context=self._context(system_len + opening), calls_left=calls,
            messages=[_message("system", "You are a careful agent."), _message("user", self._words(opening // 4))],
            report_to=parent)

    def _prompt(self, agent: _Agent) -> tuple[int, int]:
        """(pool start, length) of the next prompt; summarises first when the context is full or drawn."""
        w = self.w
        ctx = agent.context
        longest = int(w.max_context_tokens * _RESPONSE[1]) + 1
        needed = ctx.length + agent.pending + 2 + longest
        if ctx.started and (needed > w.max_context_tokens or (
                self.rng.random() < w.summarisation_rate and ctx.length > w.max_context_tokens // 3)):
            agent.context = ctx = self._context(agent.system_len + self._n(_SUMMARY) + 3)
            agent.messages = [agent.messages[0], _message("user", "Summary: " + self._words(20))]
        ctx.length += agent.pending + 2
        agent.pending = 0
        if ctx.length > self.region - longest:
            raise AssertionError(f"context of {ctx.length} tokens outgrew its region of {self.region}")
        return ctx.start, ctx.length

    def _llm_call(self, agent: _Agent, tool: tuple[str, str] | None, finish_reason: str) -> int:
        """One request/response pair (plus what retries leave); returns the response body's length."""
        w, rng = self.w, self.rng
        p_start, p_len = self._prompt(agent)
        body = self._n(_RESPONSE)
        r_len = body + 1
        draw = rng.random()
        source = "none" if draw < w.untokenized_rate else (
            "retokenized" if draw < w.untokenized_rate + w.retokenized_rate else "engine")
        tokens = source != "none"
        call_id, text = self._id("call"), self._words(body // 4)
        tool_calls = None if tool is None else (
            f'[{{"id":"{tool[1]}","type":"function","function":{{"name":"{tool[0]}","arguments":'
            '"{\\"input\\": \\"...\\"}"}}]')
        request = {
            "model": w.model, "messages": "[" + ",".join(agent.messages) + "]", "prompt": None,
            "tools": _TOOLS_JSON, "params": f'{{"temperature":1.0,"max_tokens":{r_len + 64}}}',
            "n_prompt_tokens": p_len if tokens else None, "tokenizer": f"synthetic-bpe-{w.vocab_size}",
            "chat_template_hash": self.template_hash, "idempotency_key": self._id("idem"),
        }
        answer = {
            "text": text, "tool_calls": tool_calls, "finish_reason": finish_reason,
            "n_response_tokens": r_len if tokens else None, "token_source": source,
            "usage": f'{{"prompt_tokens":{p_len},"completion_tokens":{r_len},"total_tokens":{p_len + r_len}}}',
            "upstream_retries": 0, "policy_version": self.policy, "error": None,
        }
        keyed_error = rng.random() < self.cfg.keyed_error_rate
        prompt, response = (p_start, p_len, tokens), (p_start + p_len, r_len, tokens, source == "engine")
        pairs = self._pair(agent, call_id, request, answer, prompt, response, r_len, keyed_error)
        self._resend(pairs, rng.random() < w.duplicate_send_rate)
        if rng.random() < w.retry_request_rate:  # the harness asks again: new call id, same tokens
            self._pair(agent, self._id("call"), request, answer, prompt, response, r_len, False)
        agent.context.length = p_len + r_len
        agent.context.started = True
        agent.messages = [*agent.messages, _message("assistant", text)]
        return body

    def _pair(self, agent: _Agent, call_id: str, request: dict[str, Any], answer: dict[str, Any],
              prompt: tuple[int, int, bool], response: tuple[int, int, bool, bool], r_len: int,
              keyed_error: bool) -> list[tuple[str, dict[str, Any]]]:
        req = self._row(agent, call_id=call_id, **request)
        self._put(LLM_REQUESTS_TABLE, req)
        self.prompts.append(prompt)
        self.calls += 1
        if keyed_error:  # the first answer is an error; the proxy retries under the same call id
            latency = self._advance(50, 400)
            self._put(LLM_RESPONSES_TABLE, self._row(agent, call_id=call_id, token_source="none", upstream_retries=0,
                latency_ms=latency, policy_version=self.policy, error=KEYED_ERROR))
            self.answers.append((0, 0, False, False))
        latency = self._advance(150 + 8 * r_len, 300 + 25 * r_len)
        res = self._row(agent, call_id=call_id, latency_ms=latency, **answer)
        if keyed_error:
            res["upstream_retries"] = 1
        self._put(LLM_RESPONSES_TABLE, res)
        self.answers.append(response)
        return [(LLM_REQUESTS_TABLE, req), (LLM_RESPONSES_TABLE, res)]

    def _tool(self, agent: _Agent, name: str, call_id: str, *, crash: bool) -> None:
        call = self._row(agent, call_id=call_id, name=name,
                         arguments=f'{{"input":"{self._words(6)}"}}')
        self._put(TOOL_CALLS_TABLE, call)
        duration = self._advance(20, 3000)
        if name == DELEGATE:
            sub = self._agent(self.sub_system_len, self._n(_TASK) + 3, self.rng.randint(2, 4), agent)
            self.subs.append(sub)
            result, body = f'{{"status":"started","span_id":"{sub.span_id}"}}', self._n((0.001, 0.005))
        else:
            body = self._n(_OBSERVATION)
            result = f'{{"output":"{self._words(body // 4)}","tokens":{body}}}'
        res = self._row(agent, call_id=call_id, name=name,
                        result=None if crash else result,
                        error=TOOL_CRASH if crash else None, duration_ms=duration,
                        state_changed=(name in STATE_CHANGING_TOOLS) and not crash)
        self._put(TOOL_RESULTS_TABLE, res)
        self._resend([(TOOL_CALLS_TABLE, call), (TOOL_RESULTS_TABLE, res)], self.rng.random() < self.w.duplicate_send_rate)
        agent.pending += body + 3
        agent.messages = [*agent.messages,
                          _message("tool", "error: tool process crashed" if crash else self._words(8))]

    def _report(self, parent: _Agent, body: int) -> None:
        parent.pending += body + 3

    def _rewards(self, root: _Agent, status: str) -> None:
        w, rng = self.w, self.rng
        value = float(status == "succeeded" and rng.random() < 0.5)
        late, double = rng.random() < w.late_reward_rate, rng.random() < w.double_reward_rate
        self._advance(3_600_000, 6 * 3_600_000) if late else self._advance(50, 2_000)
        rows = [self._row(root, name="correctness", value=value, source="verifier")]
        if double:
            self._advance(1_000, 120_000)
            rows.append(self._row(root, name="correctness", value=value, source="verifier"))
        for row in rows:
            if late:
                self.late.append(row)
            else:
                self._put(REWARDS_TABLE, row)

    # ------------------------------------------------------------ columns

    def tables(self) -> dict[str, pa.Table]:
        """Every table's rows of this commit; token lists gathered from one pool of random ids."""
        tokens = np.random.Generator(np.random.PCG64(self.rng.getrandbits(64)))
        pool = tokens.integers(FIRST_TEXT_TOKEN, self.w.vocab_size, self.pool_len, dtype=np.int32)
        ends = np.array([a[0] + a[1] - 1 for a in self.answers if a[1]], dtype=np.int64)
        pool[ends] = IM_END  # a response ends with IM_END, in its own row and in the prompts that extend it
        built = {"prompt_token_ids": lambda: _gather(pool, self.prompts),
                 "response_token_ids": lambda: _gather(pool, self.answers),
                 "logprobs": lambda: _logprobs(tokens, self.answers)}
        out = {}
        for name, schema in SCHEMAS.items():
            rows = pa.Table.from_pylist(self.rows[name], schema=_scalar_schema(name))
            out[name] = pa.Table.from_arrays(
                [built[f.name]() if f.name in built else rows[f.name].cast(f.type) for f in schema], schema=schema)
        return out


def _scalar_schema(table: str) -> pa.Schema:
    """The table's columns but its token lists, ``ts`` as int64 microseconds (cast after)."""
    return pa.schema([f.with_type(pa.int64()) if f.name == "ts" else f
                      for f in SCHEMAS[table] if f.name not in _TOKEN_COLUMNS])


def _message(role: str, content: str) -> str:
    """One chat message as compact JSON (contents are plain words: nothing to escape)."""
    return f'{{"role":"{role}","content":"{content}"}}'


def _offsets(spans: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, present, offsets) of token lists given as (start, length, present, ...)."""
    arr = np.array([s[:3] for s in spans], dtype=np.int64).reshape(-1, 3)
    present = arr[:, 2].astype(bool)
    lengths = np.where(present, arr[:, 1], 0)
    offsets = np.zeros(len(arr) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return arr[:, 0], lengths, present, offsets


def _gather(pool: np.ndarray, spans: list[tuple[int, ...]]) -> pa.Array:
    """list<int32> whose rows are pool[start:start + length] (null where not present)."""
    starts, lengths, present, offsets = _offsets(spans)
    idx = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    values = pool[idx]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()),
                                    mask=pa.array(~present))


def _logprobs(rng: np.random.Generator, answers: list[tuple[int, int, bool, bool]]) -> pa.Array:
    """list<float32>: one negative logprob per token of an engine response, null otherwise."""
    spans = [(0, a[1], a[3]) for a in answers]
    _, _, present, offsets = _offsets(spans)
    values = (-np.round(rng.exponential(0.4, int(offsets[-1])) + 1e-4, 4)).astype(np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()), mask=pa.array(~present))


OFFSETS_PER_COMMIT = 10_000_000
"""Kafka offsets of commit i start at i x this, so commits can be drawn apart (in any order, in parallel)."""


@dataclass(frozen=True)
class Drawn:
    """One commit's rows: table name -> rows, the late rewards that land in the next commit, its LLM calls."""

    tables: dict[str, pa.Table]
    late_rewards: pa.Table
    calls: int


def draw_commit(config: FastLakeConfig, commit: int, rollouts: int) -> Drawn:
    """Commit ``commit``: rollouts ``commit x per_commit`` onwards, at most ``rollouts`` in all."""
    first = commit * config.per_commit
    drawn = _Commit(config, first, min(config.per_commit, rollouts - first), commit * OFFSETS_PER_COMMIT)
    for index in range(first, first + drawn.count):
        drawn.rollout(index)
    late = pa.Table.from_pylist([{**row, "kafka_offset": drawn.offset + i} for i, row in enumerate(drawn.late)],
                                schema=_scalar_schema(REWARDS_TABLE))
    late = pa.Table.from_arrays([late[f.name].cast(f.type) for f in SCHEMAS[REWARDS_TABLE]],
                                schema=SCHEMAS[REWARDS_TABLE])
    return Drawn(drawn.tables(), late, drawn.calls)


def _draw(args: tuple[FastLakeConfig, int, int]) -> Drawn:
    return draw_commit(*args)


def write_lake(root: str, config: FastLakeConfig, *, rollouts: int, workers: int = 1) -> dict[str, int]:
    """Write ``rollouts`` rollouts under ``root``, one Delta commit per table per ``config.per_commit``.

    ``workers`` > 0 draws commits in that many processes while this one writes. Returns rows per table,
    LLM calls (distinct call ids), prompt and response token counts and the commits made.
    """
    lake = Lake(root)
    per_commit = config.per_commit
    totals = {"llm_calls": 0, "prompt_tokens": 0, "response_tokens": 0, "commits": 0}
    jobs = [(config, i, rollouts) for i in range(-(-rollouts // per_commit))]
    late: pa.Table | None = None
    with multiprocessing.get_context("spawn").Pool(workers) if workers else contextlib.nullcontext() as pool:
        for drawn in (_bounded(pool, jobs, 2 * workers) if pool else map(_draw, jobs)):
            tables = dict(drawn.tables)
            if late is not None:  # rewards that arrived after the previous commit's rollouts finished
                tables[REWARDS_TABLE] = pa.concat_tables([late, tables[REWARDS_TABLE]])
            late = drawn.late_rewards
            if totals["commits"] == len(jobs) - 1:  # the last commit: nothing comes after it
                tables[REWARDS_TABLE] = pa.concat_tables([tables[REWARDS_TABLE], late])
            _append(lake, tables, totals)
            totals["llm_calls"] += drawn.calls
            totals["commits"] += 1
    return totals


def _bounded(pool: Any, jobs: list[tuple[FastLakeConfig, int, int]], ahead: int) -> Iterator[Drawn]:
    """The jobs' results in order, at most ``ahead`` drawn but not yet written (a slow writer holds no backlog)."""
    pending: collections.deque[Any] = collections.deque()
    for job in jobs:
        pending.append(pool.apply_async(_draw, (job,)))
        if len(pending) > ahead:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _append(lake: Lake, tables: dict[str, pa.Table], totals: dict[str, int]) -> None:
    for name, rows in tables.items():
        if rows.num_rows:
            lake.append(name, rows, schema=SCHEMAS[name])
            totals[f"rows_{name}"] = totals.get(f"rows_{name}", 0) + rows.num_rows
    totals["prompt_tokens"] += int(pc.sum(tables[LLM_REQUESTS_TABLE]["n_prompt_tokens"]).as_py() or 0)
    totals["response_tokens"] += int(pc.sum(tables[LLM_RESPONSES_TABLE]["n_response_tokens"]).as_py() or 0)
