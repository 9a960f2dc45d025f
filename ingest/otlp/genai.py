"""GenAI spans -> trajlake events (pure; no I/O).

Operation (``gen_ai.operation.name``, else OpenLLMetry's ``llm.request.type``
/ ``traceloop.span.kind``, else OpenInference's ``openinference.span.kind``
LLM / TOOL / AGENT; its other kinds, CHAIN, RETRIEVER..., are structure and ignored):

- ``chat`` / ``generate_content`` / ``text_completion``: ``llm.request`` at the
  span's start and ``llm.response`` at its end;
- ``execute_tool``: ``tool.call`` and ``tool.result``;
- ``invoke_agent``: the rollout itself when the span is a root (no parent):
  ``rollout.started`` and ``rollout.finished``; a nested agent span records
  nothing of its own, its span id is the parent of its calls (sub-agents nest);
- any other operation, or an unreadable GenAI span: rejected with a reason, and
  the span kept for quarantine (``SpanOutcome.quarantine``, ``ingest.rejected``);
- a span with no GenAI attributes at all (HTTP, database, ...): ignored.

Rollout identity (``ROLLOUT_ATTRIBUTES``): the span's attribute, else the
nearest ancestor's in the same export, else the resource's; without a rollout
id the trace id is the rollout id, and without a task id the task is the
caller's ``default_task`` (the gateway passes its ``_unattached``). ``seq`` is microseconds since the
epoch of the span's start (request, call) and end (response, result); event
ids derive from (tenant, trace, span, kind), so a re-sent export is stored once.
Token ids are recorded only when the span carries ``trajlake.prompt_token_ids``
/ ``trajlake.response_token_ids`` (and ``trajlake.logprobs``): ``token_source``
``engine``; otherwise ``none`` and no ids.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ingest.otlp.messages import SpanError, input_messages, json_attribute, loose_json, output
from ingest.otlp.wire import Span
from ingest.rejected import RejectedInput
from schemas.errors import InvalidEvent
from schemas.events import Event
from schemas.versions import SCHEMA_VERSION, validate_event

LLM_OPERATIONS = {"chat": "chat", "generate_content": "chat", "text_completion": "text"}
KNOWN_OPERATIONS = (*LLM_OPERATIONS, "execute_tool", "invoke_agent")
ROLLOUT_ATTRIBUTES = {
    "task_id": "trajlake.task_id", "rollout_id": "trajlake.rollout_id", "attempt": "trajlake.attempt",
    "harness_name": "trajlake.harness.name", "harness_version": "trajlake.harness.version",
    "harness_config_hash": "trajlake.harness.config_hash", "policy_version": "trajlake.policy_version",
}
"""Envelope field -> span (or ancestor, or resource) attribute that sets it."""
_PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty", "seed",
           "stop_sequences", "choice.count")
_OPENLLMETRY_KINDS = {"chat": "chat", "completion": "text_completion"}
_OPENINFERENCE_KINDS = {"LLM": "chat", "TOOL": "execute_tool", "AGENT": "invoke_agent"}
_IDS = uuid.UUID("5d1c0f3e-8a2b-4c6d-9e7f-0a1b2c3d4e5f")


@dataclass(frozen=True)
class SpanOutcome:
    """What became of one span: its events, or the reason it was rejected, or neither (ignored)."""

    span: Span
    events: list[Event] = field(default_factory=list)
    rejected: str | None = None
    quarantine: RejectedInput | None = None
    """A rejected span as it goes to the events topic, for the ingester to quarantine with its reason."""

    @property
    def ignored(self) -> bool:
        return not self.events and self.rejected is None


def span_events(spans: Sequence[Span], *, tenant: str, default_task: str) -> list[SpanOutcome]:
    """The outcome of every span of one export, in order.

    >>> [o.rejected for o in span_events(spans, tenant="acme", default_task="_unattached")]  # doctest: +SKIP
    [None, "unsupported gen_ai.operation.name 'embeddings': ..."]
    """
    by_id = {s.span_id: s for s in spans}
    outcomes = []
    for span in spans:
        try:
            outcomes.append(SpanOutcome(span, events=_events(span, _Envelope(span, tenant, default_task, by_id))))
        except (SpanError, InvalidEvent) as exc:
            where, problem = (exc.field, exc.problem) if isinstance(exc, InvalidEvent) else ("(span)", str(exc))
            rollout_id = _identity(span, by_id)["rollout_id"] or span.trace_id
            kept = RejectedInput(tenant, rollout_id, where, problem, dataclasses.asdict(span))
            outcomes.append(SpanOutcome(span, rejected=str(exc), quarantine=kept))
    return outcomes


def operation(span: Span) -> str | None:
    """The GenAI operation of a span; None for a span that is not GenAI at all."""
    attrs = span.attributes
    op = attrs.get("gen_ai.operation.name")
    if op is None:
        op = _OPENLLMETRY_KINDS.get(attrs.get("llm.request.type"))
    if op is None:
        op = {"tool": "execute_tool", "agent": "invoke_agent"}.get(attrs.get("traceloop.span.kind"))
    if op is None:
        op = _OPENINFERENCE_KINDS.get(attrs.get("openinference.span.kind"))
    if op is None and any(k.startswith("gen_ai.") for k in attrs):
        raise SpanError("GenAI span without gen_ai.operation.name: set it (chat, text_completion, execute_tool, "
                        "invoke_agent)")
    return op


def _events(span: Span, envelope: _Envelope) -> list[Event]:
    op = operation(span)
    if op is None:
        return []
    if op not in KNOWN_OPERATIONS:
        raise SpanError(f"unsupported gen_ai.operation.name {op!r}: trajlake records "
                        f"{', '.join(KNOWN_OPERATIONS)}")
    if len(span.trace_id) != 32 or len(span.span_id) != 16 or span.end_ns < span.start_ns:
        raise SpanError("span needs a 16-byte trace id, an 8-byte span id and an end time not before its start")
    if op in LLM_OPERATIONS:
        return _llm(span, envelope, kind=LLM_OPERATIONS[op])
    if op == "execute_tool":
        return _tool(span, envelope)
    return _agent(span, envelope)


def _identity(span: Span, by_id: Mapping[str, Span]) -> dict[str, Any]:
    chain = []
    current: Span | None = span
    while current is not None and len(chain) < 1000:
        chain.append(current.attributes)
        current = by_id.get(current.parent_span_id) if current.parent_span_id else None
    chain.append(span.resource)
    found = {f: next((a[attr] for a in chain if attr in a), None) for f, attr in ROLLOUT_ATTRIBUTES.items()}
    return {k: str(v) if v is not None and k != "attempt" else v for k, v in found.items()}


class _Envelope:
    """Builds and validates the events of one span (shared envelope, one seq per end)."""

    def __init__(self, span: Span, tenant: str, default_task: str, by_id: Mapping[str, Span]) -> None:
        self.span, self.tenant, self.default_task = span, tenant, default_task
        self.identity = _identity(span, by_id)

    def event(self, kind: str, payload: dict[str, Any], *, at_end: bool) -> Event:
        span, ident = self.span, self.identity
        start_us = span.start_ns // 1000
        seq = max(span.end_ns // 1000, start_us + 1) if at_end else start_us
        harness = None
        if ident["harness_name"] is not None or ident["harness_version"] is not None:
            harness = {"name": ident["harness_name"], "version": ident["harness_version"],
                       "config_hash": ident["harness_config_hash"]}
        return validate_event({
            "event_id": str(uuid.uuid5(_IDS, "\x00".join((self.tenant, span.trace_id, span.span_id, kind)))),
            "type": kind,
            "schema_version": SCHEMA_VERSION,
            "ts": datetime.fromtimestamp((span.end_ns if at_end else span.start_ns) / 1e9, tz=timezone.utc),
            "tenant": self.tenant,
            "task_id": ident["task_id"] or self.default_task,
            "rollout_id": ident["rollout_id"] or span.trace_id,
            "attempt": ident["attempt"] if ident["attempt"] is not None else 0,
            "seq": seq,
            "span_id": span.span_id,
            "parent_span_id": span.parent_span_id,
            "harness": harness,
            "payload": payload,
        })

    @property
    def duration_ms(self) -> float:
        return (self.span.end_ns - self.span.start_ns) / 1e6


def _llm(span: Span, envelope: _Envelope, *, kind: str) -> list[Event]:
    attrs = span.attributes
    call_id = f"span-{span.span_id}"
    messages = input_messages(span)
    prompt = None
    if kind == "text":
        prompt = next((m.get("content") for m in messages or [] if isinstance(m.get("content"), str)), None)
        messages = None
    params = {p.replace(".", "_"): attrs[f"gen_ai.request.{p}"] for p in _PARAMS if f"gen_ai.request.{p}" in attrs}
    if not params and "llm.invocation_parameters" in attrs:  # OpenInference: the call's parameters as JSON
        params = json_attribute(attrs["llm.invocation_parameters"], "llm.invocation_parameters")
        if not isinstance(params, dict):
            raise SpanError("llm.invocation_parameters must be a JSON object")
        params = {k: v for k, v in params.items() if k != "model"}  # the model is the request's own field
    answer = output(span)
    response_ids = attrs.get("trajlake.response_token_ids")
    request = {
        "call_id": call_id,
        "model": attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model") or attrs.get("llm.model_name"),
        "messages": messages,
        "prompt": prompt,
        "tools": _tools(attrs),
        "params": params,
        "prompt_token_ids": attrs.get("trajlake.prompt_token_ids"),
    }
    response = {
        "call_id": call_id,
        "text": answer.text,
        "tool_calls": answer.tool_calls,
        "finish_reason": answer.finish_reason,
        "response_token_ids": response_ids,
        "logprobs": attrs.get("trajlake.logprobs"),
        "token_source": "engine" if response_ids is not None else "none",
        "usage": _usage(attrs),
        "latency_ms": envelope.duration_ms,
        "policy_version": (envelope.identity["policy_version"] or attrs.get("gen_ai.response.model")
                           or attrs.get("llm.model_name")),
        "error": span.error,
    }
    return [envelope.event("llm.request", request, at_end=False), envelope.event("llm.response", response, at_end=True)]


def _tool(span: Span, envelope: _Envelope) -> list[Event]:
    attrs = span.attributes
    name = attrs.get("gen_ai.tool.name") or attrs.get("traceloop.entity.name") or attrs.get("tool.name")
    if not isinstance(name, str) or not name:
        raise SpanError("execute_tool span without gen_ai.tool.name: set the tool's name")
    call_id = str(attrs.get("gen_ai.tool.call.id") or attrs.get("tool_call.id") or f"span-{span.span_id}")
    arguments = loose_json(_first(attrs, "gen_ai.tool.call.arguments", "traceloop.entity.input", "input.value"))
    result = loose_json(_first(attrs, "gen_ai.tool.call.result", "traceloop.entity.output", "output.value"))
    return [
        envelope.event("tool.call", {"call_id": call_id, "name": name, "arguments": arguments}, at_end=False),
        envelope.event("tool.result", {"call_id": call_id, "name": name, "result": result, "error": span.error,
                                       "duration_ms": envelope.duration_ms}, at_end=True),
    ]


def _agent(span: Span, envelope: _Envelope) -> list[Event]:
    if span.parent_span_id is not None:
        return []
    agent = {k: span.attributes[f"gen_ai.agent.{k}"] for k in ("name", "id") if f"gen_ai.agent.{k}" in span.attributes}
    started = {"policy_version": envelope.identity["policy_version"], "metadata": {"agent": agent} if agent else {}}
    finished = {"status": "failed" if span.error else "succeeded", "reason": span.error}
    return [envelope.event("rollout.started", started, at_end=False),
            envelope.event("rollout.finished", finished, at_end=True)]


def _tools(attrs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    if "gen_ai.tool.definitions" in attrs:
        tools = json_attribute(attrs["gen_ai.tool.definitions"], "gen_ai.tool.definitions")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise SpanError("gen_ai.tool.definitions must be a JSON list of objects")
        return [_openai_tool(t) for t in tools]
    schemas = sorted((int(k.split(".")[2]), v) for k, v in attrs.items()
                     if k.startswith("llm.tools.") and k.endswith(".tool.json_schema") and k.split(".")[2].isdigit())
    if schemas:  # OpenInference: one JSON tool definition per index
        return [json_attribute(v, "llm.tools.N.tool.json_schema") for _, v in schemas]
    functions: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        parts = key.split(".")
        if len(parts) == 5 and key.startswith("llm.request.functions.") and parts[3].isdigit():
            functions.setdefault(int(parts[3]), {})[parts[4]] = value
    if not functions:
        return None
    tools = []
    for _, function in sorted(functions.items()):
        if "parameters" in function:
            function["parameters"] = json_attribute(function["parameters"], "llm.request.functions.N.parameters")
        tools.append({"type": "function", "function": function})
    return tools


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool definition in OpenAI's form; the conventions' flat form (``name`` beside ``type``) is nested."""
    if "function" in tool or "name" not in tool:
        return tool
    return {"type": tool.get("type", "function"), "function": {k: v for k, v in tool.items() if k != "type"}}


def _usage(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    prompt = _first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
    completion = _first(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                        "llm.token_count.completion")
    if prompt is None and completion is None:
        return None
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["total_tokens"] = prompt + completion
    return usage


def _first(attrs: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` the span carries (conventions differ in naming), else None."""
    return next((attrs[n] for n in names if n in attrs), None)
