"""Chat messages of a GenAI span, in the OpenAI chat format the lake stores.

Three sources, first found wins:

- attributes ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (+
  ``gen_ai.system_instructions``), JSON in the GenAI semantic conventions'
  parts format (``{"role", "parts": [{"type": "text"|"tool_call"|"tool_call_response", ...}]}``),
  also found on a ``gen_ai.client.inference.operation.details`` span event;
- span events ``gen_ai.{system,user,assistant,tool}.message`` and
  ``gen_ai.choice`` (the earlier event form of the conventions);
- OpenLLMetry's indexed attributes ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``;
- OpenInference's ``llm.input_messages.N.message.*`` / ``llm.output_messages.N.message.*``.

Messages already in the OpenAI format (no ``parts``) are kept as they are.
Anything unreadable raises ``SpanError`` naming the attribute.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ingest.otlp.wire import Span

DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system", "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool",
}
_FINISH_REASONS = {"tool_call": "tool_calls"}
"""Finish reasons the conventions spell otherwise than OpenAI's format, which the lake stores."""
_INDEXED = re.compile(r"gen_ai\.(prompt|completion)\.(\d+)\.(.+)")
_TOOL_CALL_KEY = re.compile(r"tool_calls\.(\d+)\.(id|name|arguments)")
_OPENINFERENCE = re.compile(r"llm\.(input|output)_messages\.(\d+)\.message\.(.+)")
_OPENINFERENCE_CALL = re.compile(r"tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)")


class SpanError(ValueError):
    """A span that claims to be GenAI but cannot be read; the message is the quarantine reason."""


@dataclass(frozen=True)
class Output:
    """The model's answer: text, OpenAI-format tool calls, finish reason (each possibly None)."""

    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


def json_attribute(value: Any, name: str) -> Any:
    """An attribute that carries JSON text (or, from OTLP/JSON kvlists, the value itself)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise SpanError(f"{name} is not valid JSON: {exc}") from None


def loose_json(value: Any) -> Any:
    """JSON text parsed when it is JSON, else the value itself (tool arguments and results)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def input_messages(span: Span) -> list[dict[str, Any]] | None:
    attrs = _with_details(span)
    if "gen_ai.input.messages" in attrs:
        messages = [_openai(m, "gen_ai.input.messages") for m in _list(attrs["gen_ai.input.messages"],
                                                                       "gen_ai.input.messages")]
        system = attrs.get("gen_ai.system_instructions")
        if system is not None:
            text = _text(_list(system, "gen_ai.system_instructions"), "gen_ai.system_instructions")
            messages.insert(0, {"role": "system", "content": text})
        return messages
    from_events = [_event_message(e.name, e.attributes) for e in span.events if e.name in _MESSAGE_EVENTS]
    if from_events:
        return from_events
    return _indexed(span.attributes, "prompt") or _openinference(span.attributes, "input") or None


def output(span: Span) -> Output:
    attrs = _with_details(span)
    finish_reasons = attrs.get("gen_ai.response.finish_reasons")
    default_reason = (finish_reasons[0] if isinstance(finish_reasons, list) and finish_reasons
                      else attrs.get("llm.finish_reason"))  # OpenInference
    if "gen_ai.output.messages" in attrs:
        messages = [_openai(m, "gen_ai.output.messages") for m in _list(attrs["gen_ai.output.messages"],
                                                                        "gen_ai.output.messages")]
        raw = _list(attrs["gen_ai.output.messages"], "gen_ai.output.messages")
        reason = next((m.get("finish_reason") for m in raw if m.get("finish_reason")), default_reason)
        return _answer(messages[:1], reason)
    choices = [e for e in span.events if e.name == "gen_ai.choice"]
    if choices:
        first = choices[0].attributes
        message = json_attribute(first.get("message", "{}"), "gen_ai.choice message")
        if not isinstance(message, dict):
            raise SpanError("gen_ai.choice message must be a JSON object")
        return _answer([_openai({"role": "assistant", **message}, "gen_ai.choice")],
                       first.get("finish_reason") or default_reason)
    completions = _indexed(span.attributes, "completion") or _openinference(span.attributes, "output")
    reason = span.attributes.get("gen_ai.completion.0.finish_reason") or default_reason
    return _answer(completions[:1], reason)


def _answer(messages: list[dict[str, Any]], reason: str | None) -> Output:
    reason = _FINISH_REASONS.get(reason, reason) if reason is not None else None
    if not messages:
        return Output(finish_reason=reason)
    m = messages[0]
    return Output(text=m.get("content"), tool_calls=m.get("tool_calls"), finish_reason=reason)


def _with_details(span: Span) -> dict[str, Any]:
    details = next((e.attributes for e in span.events if e.name == DETAILS_EVENT), {})
    return {**details, **span.attributes}


def _list(value: Any, name: str) -> list[dict[str, Any]]:
    items = json_attribute(value, name)
    if not isinstance(items, list) or not all(isinstance(m, dict) for m in items):
        raise SpanError(f"{name} must be a JSON list of objects")
    return items


def _text(parts: list[dict[str, Any]], name: str) -> str:
    texts = [p.get("content") for p in parts if p.get("type") == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise SpanError(f"{name}: a text part's content must be a string")
    return "".join(texts)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


def _openai(message: dict[str, Any], name: str) -> dict[str, Any]:
    """One semantic-conventions message (role + parts) as an OpenAI chat message."""
    if "parts" not in message:
        return message
    role, parts = message.get("role"), message["parts"]
    if not isinstance(role, str) or not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise SpanError(f"{name}: each message needs a string 'role' and a list of 'parts'")
    responses = [p for p in parts if p.get("type") == "tool_call_response"]
    if responses:
        response = responses[0].get("response")
        return {"role": "tool", "tool_call_id": responses[0].get("id"),
                "content": response if isinstance(response, str) else json.dumps(response)}
    out: dict[str, Any] = {"role": role}
    if any(p.get("type") == "text" for p in parts):
        out["content"] = _text(parts, name)
    calls = [_tool_call(p.get("id"), p.get("name"), p.get("arguments")) for p in parts if p.get("type") == "tool_call"]
    if calls:
        out["tool_calls"] = calls
    return out


def _event_message(event_name: str, attrs: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": attrs.get("role") or _MESSAGE_EVENTS[event_name]}
    if "content" in attrs:
        message["content"] = attrs["content"]
    if "tool_calls" in attrs:
        message["tool_calls"] = json_attribute(attrs["tool_calls"], f"{event_name} tool_calls")
    if "id" in attrs and message["role"] == "tool":
        message["tool_call_id"] = attrs["id"]
    return message


def _indexed(attrs: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """OpenLLMetry's ``gen_ai.prompt.N.role`` / ``.content`` / ``.tool_call_id`` / ``.tool_calls.M.*``."""
    return _numbered_messages(attrs, kind, _INDEXED, _TOOL_CALL_KEY)


def _openinference(attrs: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """OpenInference's ``llm.input_messages.N.message.role`` / ``.content`` / ``.tool_call_id`` /
    ``.tool_calls.M.tool_call.{id,function.name,function.arguments}``."""
    return _numbered_messages(attrs, kind, _OPENINFERENCE, _OPENINFERENCE_CALL)


def _numbered_messages(attrs: dict[str, Any], kind: str, message_key: re.Pattern[str],
                       call_key: re.Pattern[str]) -> list[dict[str, Any]]:
    """Messages flattened into numbered attributes: ``message_key`` matches (kind, N, rest of the key) and
    ``call_key`` matches a tool call's part of the rest (M, field; a dotted field keeps its last part)."""
    messages: dict[int, dict[str, Any]] = {}
    calls: dict[tuple[int, int], dict[str, Any]] = {}
    for key, value in attrs.items():
        match = message_key.fullmatch(key)
        if not match or match.group(1) != kind:
            continue
        index, rest = int(match.group(2)), match.group(3)
        message = messages.setdefault(index, {})
        call = call_key.fullmatch(rest)
        if call:
            calls.setdefault((index, int(call.group(1))), {})[call.group(2).rpartition(".")[2]] = value
        elif rest in ("role", "content", "tool_call_id"):
            message[rest] = value
    for (index, _), call in sorted(calls.items()):
        messages[index].setdefault("tool_calls", []).append(
            _tool_call(call.get("id"), call.get("name"), call.get("arguments"))
        )
    return [messages[i] for i in sorted(messages)]
