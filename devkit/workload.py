"""Synthetic agent rollouts: realistic, seeded, deterministic wire events.

Used by tests, the demo and the benchmarks. ``N tasks x K rollouts``; each
rollout is a root agent making ``min_calls..max_calls`` LLM calls, with tool
calls and results between them, and the irregularities a real fleet shows:

* **Growing contexts.** Each call's prompt is exactly the previous prompt +
  the previous response + the new messages (tool output, sub-agent reports),
  so it extends the previous call token for token.
* **Summarisation.** When the next prompt would not fit ``max_context_tokens``
  (and occasionally before that), the history is replaced by the system prompt
  and a shorter summary: the prompt stops extending the previous one.
* **Retokenization drift.** Occasionally a few tokens of the previous response
  come back split differently inside the next prompt (same text, different
  tokenization): the prefix is broken although the conversation continued.
* **Sub-agents.** The root may delegate to a sub-agent with its own context
  and ``span_id`` (``parent_span_id`` = the root's span); its calls are
  interleaved with the root's, and its report joins the root's context later.
* **Duplicates.** A request/response pair is sometimes resent with the same
  ``event_id`` (producer retry), and sometimes re-requested with the same
  ``idempotency_key`` but a new call id and new event ids (harness retry);
  both return the same tokens.
* **Rewards** arrive after ``rollout.finished``; some hours late (emitted after
  other rollouts' events), some twice (same name and value, new event id).
* **Endings.** Most rollouts succeed; some fail (a tool crashes, sub-agents
  are abandoned) and those that reach ``max_calls`` are truncated (last
  ``finish_reason`` "length").
* **Token sources.** Responses carry ``token_source`` "engine" with one
  negative logprob per token; a few are "retokenized" (ids, no logprobs) or
  "none" (no ids at all, prompt ids also missing).

``seq`` counts 0, 1, 2, ... per rollout (a resend repeats its ``seq``); ``ts``
follows a simulated clock starting at ``start_ms``, so runs are reproducible.
Token ids are structured, not text: ids below ``FIRST_TEXT_TOKEN`` are chat
template markers (``<|im_start|>``, roles, ``<|im_end|>``), the rest are drawn
from ``[FIRST_TEXT_TOKEN, vocab_size)``.

>>> events = list(generate_events(WorkloadConfig(tasks=2, rollouts_per_task=2, seed=7)))
>>> events[0]["type"]
'rollout.started'
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ingest.ids import rfc3339, uuid7
from schemas.events import INT32_MAX
from schemas.versions import SCHEMA_VERSION

__all__ = [
    "RolloutFacts",
    "SyntheticRollout",
    "WorkloadConfig",
    "generate_events",
    "generate_rollouts",
    "simulate_rollout",
]


class WorkloadConfig(BaseModel):
    """What to generate. Rates are probabilities per LLM call unless noted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tasks: int = Field(default=4, ge=1)
    rollouts_per_task: int = Field(default=4, ge=1)
    """K rollouts per task: one GRPO group."""
    seed: int = 0
    min_calls: int = Field(default=5, ge=1)
    """LLM calls of the root agent per rollout, drawn uniformly in [min_calls, max_calls]."""
    max_calls: int = Field(default=30, ge=1)
    max_context_tokens: int = Field(default=4000, ge=256, le=1_000_000)
    """Prompt + response never exceed this; message sizes scale with it."""
    vocab_size: int = Field(default=32_000, ge=1_000, le=INT32_MAX)
    subagent_rate: float = Field(default=0.08, ge=0, le=1)
    """Per root tool step: delegate to a sub-agent (2-4 calls of its own)."""
    summarisation_rate: float = Field(default=0.04, ge=0, le=1)
    """Summarise although the context still fits (it always does when it would not)."""
    drift_rate: float = Field(default=0.03, ge=0, le=1)
    duplicate_send_rate: float = Field(default=0.02, ge=0, le=1)
    """Request + response resent with the same event ids."""
    retry_request_rate: float = Field(default=0.02, ge=0, le=1)
    """Same idempotency_key requested again: new call id, new event ids, same tokens."""
    retokenized_rate: float = Field(default=0.03, ge=0, le=1)
    untokenized_rate: float = Field(default=0.02, ge=0, le=1)
    failure_rate: float = Field(default=0.05, ge=0, le=1)
    """Per rollout: a tool crashes and the rollout finishes as ``failed``."""
    late_reward_rate: float = Field(default=0.2, ge=0, le=1)
    """Per rollout: the reward comes 1-6 hours after the rollout finished."""
    double_reward_rate: float = Field(default=0.05, ge=0, le=1)
    """Per rollout: the reward is delivered twice (same name and value, new event id)."""
    harness_name: str = "synthetic-agent"
    harness_versions: tuple[str, ...] = Field(default=("1.4.0", "1.5.0"), min_length=1)
    tenants: tuple[str, ...] = Field(default=("default",), min_length=1)
    """Each task belongs to one tenant, drawn from these."""
    policy_versions: tuple[str, ...] = Field(default=("policy-7",), min_length=1)
    model: str = "synthetic-model"
    start_ms: int = Field(default=1_767_225_600_000, ge=0)
    """Simulated clock of the first rollout start (default 2026-01-01T00:00:00Z)."""
    rollout_spacing_ms: int = Field(default=2_000, ge=0)
    """Mean gap between rollout starts; rollouts last ~1 minute, so many overlap."""

    @model_validator(mode="after")
    def _calls_in_order(self) -> WorkloadConfig:
        if self.min_calls > self.max_calls:
            raise ValueError(f"min_calls ({self.min_calls}) must not exceed max_calls ({self.max_calls})")
        return self

    @property
    def rollouts(self) -> int:
        """How many rollouts the workload has (tasks x rollouts_per_task)."""
        return self.tasks * self.rollouts_per_task


# Chat-template markers: ids below FIRST_TEXT_TOKEN never appear as text.
IM_START, IM_END = 1, 2
ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL = 3, 4, 5, 6
FIRST_TEXT_TOKEN = 256
GENERATION_PROMPT = (IM_START, ROLE_ASSISTANT)

TOOLS = ("search", "read_file", "run_python", "edit_file")
DELEGATE = "delegate"
STATE_CHANGING_TOOLS = frozenset({"run_python", "edit_file"})
TOOL_SPECS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
        },
    }
    for name in (*TOOLS, DELEGATE)
]
_WORDS = (
    "the file function test error value result search query patch config output step check run build "
    "list index token model call return parse update fix line module path import data table"
).split()

# Sizes as fractions of max_context_tokens: (low, high).
_SYSTEM = (0.04, 0.10)
_TASK = (0.02, 0.05)
_RESPONSE = (0.005, 0.075)
_OBSERVATION = (0.005, 0.15)
_SUMMARY = (0.05, 0.10)


@dataclass
class RolloutFacts:
    """What a generated rollout contains: ground truth for tests and demos."""

    status: str = "succeeded"
    reward: float = 0.0
    llm_calls: int = 0
    """Distinct LLM calls, sub-agents' included, retries and resends excluded."""
    subagents: int = 0
    summarisations: int = 0
    drifts: int = 0
    duplicate_sends: int = 0
    retried_requests: int = 0
    untokenized_calls: int = 0
    late_reward: bool = False
    double_reward: bool = False


@dataclass
class _Agent:
    """One context: the root agent or a sub-agent (own span, own tokens)."""

    span_id: str
    parent_span_id: str | None
    system: list[int]
    history: list[int]
    """What the next prompt starts with: the last prompt + response (or the opening)."""
    calls_left: int
    messages: list[dict]
    pending: list[int] = field(default_factory=list)
    """Message blocks (tool output, reports) not yet sent to the model."""
    last_response_at: int | None = None
    """Where the last response starts inside ``history`` (for retokenization drift)."""
    report_to: _Agent | None = None



class _Steps(Protocol):
    calls_left: int


@dataclass
class RolloutPlan:
    """How a synthetic rollout goes: its number of root calls, the call it crashes at (if any), whether it is
    cut at ``max_calls``. Shared by the event workload and ``bench/sql``'s vectorised lake (same draws, same
    order of random numbers)."""

    calls: int
    crash_at: int | None
    truncated: bool

    @classmethod
    def draw(cls, cfg: WorkloadConfig, rng: random.Random) -> RolloutPlan:
        calls = rng.randint(cfg.min_calls, cfg.max_calls)
        crash_at = rng.randint(1, calls - 1) if calls > 1 and rng.random() < cfg.failure_rate else None
        return cls(calls, crash_at, crash_at is None and calls == cfg.max_calls and cfg.max_calls > cfg.min_calls)

    def drive(self, root: _Steps, subs: list, step: Callable[..., None]) -> int:
        """Step the root agent and its sub-agents in turn until every call is made (or the crash); the root's
        calls made."""
        made = 0
        while root.calls_left > 0 or subs:
            if root.calls_left > 1 or (root.calls_left == 1 and not subs):
                made += 1
                step(root, crash=made == self.crash_at, finish_reason="length" if self.truncated else "stop")
                if made == self.crash_at:
                    break
            for sub in list(subs):
                step(sub)
                if sub.calls_left == 0:
                    subs.remove(sub)
        return made

    def outcome(self, cfg: WorkloadConfig) -> tuple[str, str | None]:
        """The rollout's status and reason."""
        if self.crash_at is not None:
            return "failed", "tool process crashed"
        if self.truncated:
            return "truncated", f"reached max_calls={cfg.max_calls}"
        return "succeeded", None


class AgentTurns:
    """An agent's turn, shared by the event workload and ``bench/sql``'s vectorised lake (same draws, same order
    of random numbers): an LLM call, then the tool it asked for (a sub-agent's delegation only from the root),
    or on the agent's last call its final answer, which a sub-agent reports to its parent. Subclasses set
    ``rng`` and ``subagent_rate`` and make the call, the tool step, the ids and the report their own way."""

    rng: random.Random
    subagent_rate: float

    def _step(self, agent: Any, *, crash: bool = False, finish_reason: str = "stop") -> None:
        """One turn of ``agent`` (``RolloutPlan.drive``'s step)."""
        final = agent.calls_left == 1
        tool = None
        if not final:
            use_delegate = agent.report_to is None and self.rng.random() < self.subagent_rate
            tool = (DELEGATE if use_delegate else self.rng.choice(TOOLS), self._id("tool"))
        body = self._llm_call(agent, tool, finish_reason if final else "tool_calls")
        agent.calls_left -= 1
        if tool is not None:
            self._tool(agent, *tool, crash=crash)
        elif agent.report_to is not None:
            self._report(agent.report_to, body)

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{self.rng.getrandbits(64):016x}"

    def _llm_call(self, agent: Any, tool: tuple[str, str] | None, finish_reason: str) -> Any:
        """One request/response pair; returns the response body as the report needs it."""
        raise NotImplementedError

    def _tool(self, agent: Any, name: str, call_id: str, *, crash: bool) -> None:
        raise NotImplementedError

    def _report(self, parent: Any, body: Any) -> None:
        """A sub-agent's final answer ``body`` joins its parent's pending messages."""
        raise NotImplementedError


class _RolloutSim(AgentTurns):
    """Builds one rollout's events on a simulated clock."""

    def __init__(self, config: WorkloadConfig, *, task: int, index: int, start_ms: int) -> None:
        self.config = config
        self.subagent_rate = config.subagent_rate
        seed = config.seed
        self.rng = random.Random(f"trajlake-workload/{seed}/rollout/{task}/{index}")
        self.arrays = np.random.Generator(np.random.PCG64(self.rng.getrandbits(64)))
        """Bulk draws (token ids, logprobs); PCG64 streams are reproducible for a numpy version."""
        task_rng = random.Random(f"trajlake-workload/{seed}/task/{task}")
        self.task_id = f"task-s{seed}-{task:05d}"
        self.tenant = task_rng.choice(config.tenants)
        self.task_tokens = self._block(ROLE_USER, self._tokens(_TASK, task_rng))
        version = self.rng.choice(config.harness_versions)
        harness_rng = random.Random(f"trajlake-workload/harness/{version}")
        self.system = self._block(ROLE_SYSTEM, self._tokens(_SYSTEM, harness_rng))
        self.sub_system = self._block(ROLE_SYSTEM, self._tokens(_SYSTEM, harness_rng))
        self.harness = {"name": config.harness_name, "version": version,
                        "config_hash": f"sha256:{harness_rng.getrandbits(64):016x}"}
        self.template_hash = f"sha256:{harness_rng.getrandbits(64):016x}"
        self.policy_version = self.rng.choice(config.policy_versions)
        self.clock = start_ms
        self.rollout_id = uuid7(unix_ms=start_ms, random_bytes=self.rng.randbytes(10))
        self.seq = 0
        self.events: list[dict] = []
        self.emitted_at_ms: list[int] = []
        self.facts = RolloutFacts()
        self.subs: list[_Agent] = []

    # ------------------------------------------------------------ primitives

    def _tokens(self, size: tuple[float, float], rng: random.Random | None = None) -> list[int]:
        """Text token ids, their count drawn in ``size`` x max_context_tokens."""
        rng = rng or self.rng
        n = max(2, int(self.config.max_context_tokens * rng.uniform(*size)))
        arrays = self.arrays if rng is self.rng else np.random.Generator(np.random.PCG64(rng.getrandbits(64)))
        return arrays.integers(FIRST_TEXT_TOKEN, self.config.vocab_size, n).tolist()

    @staticmethod
    def _block(role: int, body: list[int]) -> list[int]:
        return [IM_START, role, *body, IM_END]

    def _words(self, n: int) -> str:
        return " ".join(self.rng.choices(_WORDS, k=max(1, min(40, n))))

    def _emit(self, event_type: str, payload: dict, agent: _Agent) -> dict:
        event = {
            "event_id": uuid7(unix_ms=self.clock, random_bytes=self.rng.randbytes(10)),
            "type": event_type,
            "schema_version": SCHEMA_VERSION,
            "ts": rfc3339(self.clock),
            "tenant": self.tenant,
            "task_id": self.task_id,
            "rollout_id": self.rollout_id,
            "attempt": 0,
            "seq": self.seq,
            "span_id": agent.span_id,
            "parent_span_id": agent.parent_span_id,
            "harness": dict(self.harness),
            "payload": payload,
        }
        self.seq += 1
        self._send(event)
        return event

    def _send(self, event: dict) -> None:
        self.events.append(event)
        self.emitted_at_ms.append(self.clock)

    def _advance(self, low_ms: float, high_ms: float) -> float:
        ms = round(self.rng.uniform(low_ms, high_ms), 1)
        self.clock += int(ms) + 1
        return ms

    # ------------------------------------------------------------ contexts

    def _agent(self, system: list[int], opening: list[int], calls: int, parent: _Agent | None) -> _Agent:
        return _Agent(
            span_id=self._id("span"),
            parent_span_id=parent.span_id if parent else None,
            system=system,
            history=system + opening,
            calls_left=calls,
            messages=[{"role": "system", "content": "You are a careful agent."},
                      {"role": "user", "content": self._words(len(opening) // 4)}],
            report_to=parent,
        )

    def _next_prompt(self, agent: _Agent) -> list[int]:
        """History + pending messages + generation prompt; summarises or drifts first when drawn."""
        cfg = self.config
        longest_response = int(cfg.max_context_tokens * _RESPONSE[1]) + 1
        needed = len(agent.history) + len(agent.pending) + len(GENERATION_PROMPT) + longest_response
        started = agent.last_response_at is not None
        if started and (needed > cfg.max_context_tokens or (
                self.rng.random() < cfg.summarisation_rate and len(agent.history) > cfg.max_context_tokens // 3)):
            summary = self._block(ROLE_USER, self._tokens(_SUMMARY))
            agent.history = agent.system + summary
            agent.messages = [agent.messages[0], {"role": "user", "content": "Summary: " + self._words(20)}]
            agent.last_response_at = None
            self.facts.summarisations += 1
        elif started and self.rng.random() < cfg.drift_rate:
            self._drift(agent)
        prompt = agent.history + agent.pending
        prompt.extend(GENERATION_PROMPT)
        agent.pending = []
        return prompt

    def _drift(self, agent: _Agent) -> None:
        """Split 1-3 tokens of the last response in two: same text, different tokenization."""
        start, end = agent.last_response_at, len(agent.history) - 1  # keep the closing IM_END
        for pos in sorted(self.rng.sample(range(start, end), k=min(3, end - start, self.rng.randint(1, 3))),
                          reverse=True):
            agent.history[pos:pos + 1] = self.arrays.integers(FIRST_TEXT_TOKEN, self.config.vocab_size, 2).tolist()
        self.facts.drifts += 1

    # ------------------------------------------------------------ steps

    def _llm_call(self, agent: _Agent, tool: tuple[str, str] | None, finish_reason: str) -> list[int]:
        """One request/response pair (plus resends and retries); returns the response body."""
        cfg, rng = self.config, self.rng
        prompt = self._next_prompt(agent)
        body = self._tokens(_RESPONSE)
        response = body + [IM_END]
        draw = rng.random()
        source = "none" if draw < cfg.untokenized_rate else (
            "retokenized" if draw < cfg.untokenized_rate + cfg.retokenized_rate else "engine")
        logprobs = None
        if source == "engine":
            logprobs = (-np.round(self.arrays.exponential(0.4, len(response)) + 1e-4, 4)).tolist()
        tool_calls = None if tool is None else [
            {"id": tool[1], "type": "function", "function": {"name": tool[0], "arguments": '{"input": "..."}'}}]
        request = {
            "call_id": self._id("call"), "model": cfg.model, "messages": list(agent.messages),
            "tools": TOOL_SPECS, "params": {"temperature": 1.0, "max_tokens": len(response) + 64},
            "prompt_token_ids": None if source == "none" else prompt,
            "tokenizer": f"synthetic-bpe-{cfg.vocab_size}", "chat_template_hash": self.template_hash,
            "idempotency_key": self._id("idem"),
        }
        answer = {
            "text": self._words(len(body) // 4), "tool_calls": tool_calls, "finish_reason": finish_reason,
            "response_token_ids": None if source == "none" else response, "logprobs": logprobs,
            "token_source": source,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response),
                      "total_tokens": len(prompt) + len(response)},
            "upstream_retries": 0, "policy_version": self.policy_version, "error": None,
        }
        self._call_pair(agent, request, answer, len(response))
        if rng.random() < cfg.duplicate_send_rate:
            self._advance(50, 500)
            for event in self.events[-2:]:
                self._send(_clone(event))
            self.facts.duplicate_sends += 1
        if rng.random() < cfg.retry_request_rate:
            retry = {**_clone(request), "call_id": self._id("call")}
            self._call_pair(agent, retry, _clone(answer), len(response))
            self.facts.retried_requests += 1
        self.facts.llm_calls += 1
        self.facts.untokenized_calls += source == "none"
        agent.last_response_at = len(prompt)
        agent.history = prompt + response
        agent.messages = [*agent.messages, {"role": "assistant", "content": answer["text"]}]
        return body

    def _call_pair(self, agent: _Agent, request: dict, answer: dict, response_tokens: int) -> None:
        self._emit("llm.request", request, agent)
        latency = self._advance(150 + 8 * response_tokens, 300 + 25 * response_tokens)
        self._emit("llm.response", {"call_id": request["call_id"], **answer, "latency_ms": latency}, agent)

    def _tool(self, agent: _Agent, name: str, call_id: str, *, crash: bool) -> None:
        """tool.call + tool.result; the output joins the agent's pending messages."""
        self._emit("tool.call", {"call_id": call_id, "name": name, "arguments": {"input": self._words(6)}}, agent)
        duration = self._advance(20, 3000)
        if name == DELEGATE:
            sub = self._agent(self.sub_system, self._block(ROLE_USER, self._tokens(_TASK)),
                              self.rng.randint(2, 4), agent)
            self.subs.append(sub)
            self.facts.subagents += 1
            result, body = {"status": "started", "span_id": sub.span_id}, self._tokens((0.001, 0.005))
        else:
            body = self._tokens(_OBSERVATION)
            result = {"output": self._words(len(body) // 4), "tokens": len(body)}
        self._emit("tool.result", {
            "call_id": call_id, "name": name, "result": None if crash else result,
            "error": "RuntimeError: tool process crashed" if crash else None, "duration_ms": duration,
            "state_changed": (name in STATE_CHANGING_TOOLS) and not crash,
        }, agent)
        agent.pending += self._block(ROLE_TOOL, body)
        content = "error: tool process crashed" if crash else self._words(8)
        agent.messages = [*agent.messages, {"role": "tool", "content": content}]

    def _report(self, parent: _Agent, body: list[int]) -> None:
        parent.pending += self._block(ROLE_USER, body)

    # ------------------------------------------------------------ the rollout

    def run(self) -> None:
        cfg, rng = self.config, self.rng
        plan = RolloutPlan.draw(cfg, rng)
        root = self._agent(self.system, self.task_tokens, plan.calls, None)
        self._emit("rollout.started", {"group_id": self.task_id, "policy_version": self.policy_version,
                                       "metadata": {"env": "synthetic", "max_calls": plan.calls}}, root)
        made = plan.drive(root, self.subs, self._step)
        status, reason = plan.outcome(cfg)
        self._advance(5, 50)
        self._emit("rollout.finished", {"status": status, "reason": reason, "steps": made}, root)
        self.facts.status = status
        self._rewards(root, status)

    def _rewards(self, root: _Agent, status: str) -> None:
        cfg, rng, facts = self.config, self.rng, self.facts
        facts.reward = float(status == "succeeded" and rng.random() < 0.5)
        facts.late_reward = rng.random() < cfg.late_reward_rate
        facts.double_reward = rng.random() < cfg.double_reward_rate
        if facts.late_reward:
            self._advance(3_600_000, 6 * 3_600_000)
        else:
            self._advance(50, 2_000)
        payload = {"name": "correctness", "value": facts.reward, "source": "verifier"}
        self._emit("reward", payload, root)
        if facts.double_reward:
            self._advance(1_000, 120_000)
            self._emit("reward", dict(payload), root)


def _clone(value):
    """Copy dicts and lists all the way down (much faster than copy.deepcopy on token lists)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value] if value and isinstance(value[0], (dict, list)) else list(value)
    return value


@dataclass(frozen=True)
class SyntheticRollout:
    """One generated rollout: its wire events in emission order and what it contains."""

    task_id: str
    rollout_id: str
    events: list[dict]
    """Wire-event dicts (treat as read-only), duplicates and late rewards included."""
    emitted_at_ms: list[int]
    """When the producer sends each event (a duplicate is sent later than its ``ts``)."""
    facts: RolloutFacts


def simulate_rollout(config: WorkloadConfig, *, task: int, index: int) -> SyntheticRollout:
    """Rollout ``index`` (0-based over all rollouts) of task ``task``.

    It depends only on (seed, task, index), so generating a subset or a
    different count leaves the others unchanged.
    """
    sim = _RolloutSim(config, task=task, index=index, start_ms=config.start_ms + index * config.rollout_spacing_ms)
    sim.run()
    return SyntheticRollout(task_id=sim.task_id, rollout_id=sim.rollout_id, events=sim.events,
                            emitted_at_ms=sim.emitted_at_ms, facts=sim.facts)


def generate_rollouts(config: WorkloadConfig) -> Iterator[SyntheticRollout]:
    """Every rollout, in start order (task by task, K rollouts per task)."""
    for task in range(config.tasks):
        for k in range(config.rollouts_per_task):
            yield simulate_rollout(config, task=task, index=task * config.rollouts_per_task + k)


def generate_events(config: WorkloadConfig) -> Iterator[dict]:
    """All wire events in emission order: rollouts interleaved by time.

    Streams: a rollout is generated when the clock reaches its start, and its
    events are released as they are yielded, so memory stays flat.
    """
    heap: list[tuple[int, int, deque[tuple[int, dict]]]] = []  # (next emission ms, rollout serial, queue)
    rollouts = iter(generate_rollouts(config))
    upcoming = next(rollouts, None)
    serial = 0  # tie-break on equal times: the earlier rollout first, deterministic
    while heap or upcoming is not None:
        if upcoming is not None and (not heap or upcoming.emitted_at_ms[0] <= heap[0][0]):
            queue = deque(zip(upcoming.emitted_at_ms, upcoming.events))
            heapq.heappush(heap, (queue[0][0], serial, queue))
            serial += 1
            upcoming = next(rollouts, None)
            continue
        _, order, queue = heapq.heappop(heap)
        _, event = queue.popleft()
        if queue:
            heapq.heappush(heap, (queue[0][0], order, queue))
        yield event
