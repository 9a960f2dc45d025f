"""Decide how a chat call's prompt is made, and build the token-id prompt when it extends the last call.

A call is **stitched** when its messages are the previous call's messages, then
the assistant message the gateway returned (compared structurally: text, and
tool calls by name and parsed arguments), then at least one new message, with
the same model and tools. Its prompt is the previous prompt ids + the ids the
engine sampled + the chat template's rendering of only what follows: the
bridge after the assistant turn (e.g. ``\\n`` after ``<|im_end|>``, or
``<|im_end|>\\n`` when the answer was cut at ``max_tokens``), the new messages,
the generation prompt. The template must be prefix-preserving for that step
(checked on every call: the conversation rendered with and without the new
messages); templates that rewrite history (e.g. strip earlier reasoning) fail
the check and the call is **engine_rendered**, with the reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from dataclasses import dataclass, field
from typing import Any

from ingest.gateway.sessions.state import Session, SessionKey, SessionStore
from ingest.otlp.messages import loose_json
from schemas.tool_parsers import ToolParser, resolve_parser

log = logging.getLogger(__name__)

FALLBACK_REASONS = (
    "unattached", "first_call", "no_session", "history_changed", "context_changed", "multimodal",
    "unsupported_params", "unknown_parser", "template_not_prefix", "template_error",
)
"""Why a call went the plain chat route. ``no_session``: the history has an assistant turn but this gateway holds
no state for the rollout (restart, another replica, evicted); ``context_changed``: another model or other tools."""

_PASSED = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "n", "stream", "stream_options",
    "ignore_eos", "min_tokens",
})
"""Chat parameters that mean the same on the completions route."""
_HANDLED = frozenset({
    "messages", "tools", "tool_choice", "max_completion_tokens", "logprobs", "top_logprobs", "return_token_ids",
    "response_format", "parallel_tool_calls", "user", "metadata", "store", "service_tier",
})
"""Chat parameters mapped or dropped below; any other parameter sends the call the plain route."""


class _Multimodal(Exception):
    pass


@dataclass
class Plan:
    """How one chat call's prompt is made; what to remember of it afterwards."""

    made: str
    """``stitched`` or ``engine_rendered``."""
    reason: str | None = None
    """The fallback reason of an engine-rendered call."""
    key: SessionKey | None = None
    digests: tuple[bytes, ...] = ()
    context: bytes = b""
    prompt_ids: list[int] = field(default_factory=list)
    upstream_body: dict[str, Any] | None = None
    """The completions request of a stitched call."""
    parser: ToolParser | None = None
    """Parses the raw completion of a stitched call; None: the whole text is content."""
    previous: Session | None = None
    """The rollout's last call as this call found it: what its recorded prompt may reference."""

    def record(self) -> dict[str, str]:
        """What the ``llm.request`` event says about how its prompt was made."""
        return {"made": self.made, **({"fallback": self.reason} if self.reason else {})}


def message_digest(message: dict[str, Any]) -> bytes:
    """A digest of what a message means to the template: role, text, tool calls (name, parsed arguments), ids."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = (call or {}).get("function") or {}
        calls.append([function.get("name"), loose_json(function.get("arguments"))])
    core = [message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id"),
            message.get("name")]
    return hashlib.sha1(json.dumps(core, sort_keys=True, ensure_ascii=False).encode()).digest()


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    raise _Multimodal


def _context(body: dict[str, Any]) -> bytes:
    core = [body.get("model"), body.get("tools")]
    return hashlib.sha1(json.dumps(core, sort_keys=True, ensure_ascii=False).encode()).digest()


def completion_body(body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any] | None:
    """The engine's ``/completions`` request for a chat request; None when a parameter cannot be mapped."""
    unknown = set(body) - _PASSED - _HANDLED
    if unknown or body.get("n", 1) != 1 or body.get("tool_choice") not in (None, "auto", "none"):
        return None
    if body.get("response_format") not in (None, {"type": "text"}):
        return None
    out = {k: v for k, v in body.items() if k in _PASSED}
    if body.get("max_completion_tokens") is not None:
        out["max_tokens"] = body["max_completion_tokens"]
    top = body.get("top_logprobs") if body.get("logprobs") is True else None
    out.update(prompt=prompt_ids, return_token_ids=True, logprobs=top or 0)
    return out


class Stitcher:
    """Plans each chat call of a rollout and remembers what the next one must extend."""

    def __init__(self, tokenizer: Any, store: SessionStore, *, parser: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.store = store
        template = getattr(tokenizer, "chat_template", None)
        self.parser = resolve_parser(parser, template if isinstance(template, str) else None)
        self.end = tokenizer.eos_token
        """The string that ends an assistant turn in the template (``<|im_end|>`` in ChatML)."""

    def plan(self, body: dict[str, Any], key: SessionKey | None) -> Plan:
        messages = body.get("messages") or []
        try:
            digests = tuple(message_digest(m) for m in messages)
        except _Multimodal:
            return Plan("engine_rendered", "multimodal")
        plan = Plan("engine_rendered", key=key, digests=digests, context=_context(body))
        if key is None:
            plan.reason = "unattached"
            return plan
        session = plan.previous = self.store.get(key)
        plan.reason = self._mismatch(session, plan, messages)
        if plan.reason is not None:
            return plan
        parses = bool(body.get("tools")) and body.get("tool_choice") != "none"
        if parses and self.parser is None:
            plan.reason = "unknown_parser"
            return plan
        suffix = self._suffix(session, messages, body.get("tools"), plan)
        if suffix is None:
            return plan
        prompt_ids = [*session.prompt_ids, *session.sampled_ids, *suffix]
        upstream = completion_body(body, prompt_ids)
        if upstream is None:
            plan.reason = "unsupported_params"
            return plan
        plan.made, plan.reason, plan.prompt_ids, plan.upstream_body = "stitched", None, prompt_ids, upstream
        plan.parser = self.parser if parses else None
        return plan

    def _mismatch(self, session: Session | None, plan: Plan, messages: list[dict]) -> str | None:
        if session is None:
            return "no_session" if any(m.get("role") == "assistant" for m in messages) else "first_call"
        if session.context != plan.context:
            return "context_changed"
        known = len(session.messages)
        if len(plan.digests) <= known or plan.digests[:known] != session.messages:
            return "history_changed"
        return None

    def _suffix(self, session: Session, messages: list[dict], tools: list | None, plan: Plan) -> list[int] | None:
        """Ids of the bridge, the new messages and the generation prompt; None (reason set) when unsafe."""
        k = len(session.messages) - 1  # the assistant message the gateway returned
        try:
            before = self._render(messages[:k], tools, generation=True)
            with_answer = self._render(messages[: k + 1], tools, generation=False)
            full = self._render(messages, tools, generation=True)
        except Exception as exc:  # any template failure: the engine will say what is wrong
            log.debug("event=session_template_error error=%r", exc)
            plan.reason = "template_error"
            return None
        answer = with_answer[len(before):]
        end = answer.rfind(self.end) if self.end else -1
        if not with_answer.startswith(before) or not full.startswith(with_answer) or end < 0:
            plan.reason = "template_not_prefix"
            return None
        sampled_end = bool(session.sampled_ids) and self._ends_turn(session.sampled_ids[-1])
        bridge = answer[end + len(self.end):] if sampled_end else answer[end:]
        text = bridge + full[len(with_answer):]
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _ends_turn(self, token_id: int) -> bool:
        return self.tokenizer.convert_ids_to_tokens(int(token_id)) == self.end

    def _render(self, messages: list[dict], tools: list | None, *, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation, tokenize=False
        )

    def remember(self, plan: Plan, *, prompt_ids: list[int] | None, sampled_ids: list[int] | None,
                 content: str | None, tool_calls: list[dict] | None, call_id: str = "") -> None:
        """After a successful call: the next call of the rollout may extend this one."""
        if plan.key is None or not plan.digests or not prompt_ids or not sampled_ids:
            return
        answer = message_digest({"role": "assistant", "content": content, "tool_calls": tool_calls})
        self.store.put(plan.key, Session(
            messages=(*plan.digests, answer), context=plan.context,
            prompt_ids=array("i", prompt_ids), sampled_ids=array("i", sampled_ids), call_id=call_id,
        ))
