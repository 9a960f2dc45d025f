"""The upstream token-id format (vLLM >= 0.10.2 / SGLang): ask for it, read it, hide it.

The gateway always asks the engine for ``return_token_ids`` and logprobs, reads
the sampled ids out of the answer, and strips from what the client receives
whatever the client did not ask for (``prompt_token_ids``, ``token_ids``,
``logprobs``), streaming included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["chat", "completions"]


@dataclass(frozen=True)
class Asked:
    """What the client itself asked for (so the gateway knows what to strip)."""

    token_ids: bool
    logprobs: bool

    @property
    def everything(self) -> bool:
        return self.token_ids and self.logprobs


def asked_by(kind: Kind, body: dict[str, Any]) -> Asked:
    logprobs = body.get("logprobs")
    wants_logprobs = logprobs is True if kind == "chat" else (logprobs is not None and logprobs is not False)
    return Asked(token_ids=body.get("return_token_ids") is True, logprobs=wants_logprobs)


def upstream_body(kind: Kind, body: dict[str, Any], asked: Asked) -> dict[str, Any]:
    """The client's body plus the extras that make the engine return ids and logprobs."""
    out = dict(body)
    out["return_token_ids"] = True
    if not asked.logprobs:
        out["logprobs"] = True if kind == "chat" else 1
    return out


def strip(kind: Kind, obj: dict[str, Any], asked: Asked) -> bool:
    """Remove from a response or stream chunk what the client did not ask for; True if changed."""
    changed = False
    if not asked.token_ids and "prompt_token_ids" in obj:
        del obj["prompt_token_ids"]
        changed = True
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if not asked.token_ids:
            for name in ("token_ids", "prompt_token_ids"):
                if name in choice:
                    del choice[name]
                    changed = True
        if not asked.logprobs and choice.get("logprobs") is not None:
            choice["logprobs"] = None
            changed = True
    return changed


@dataclass
class Completion:
    """What the engine answered, as recorded (choice 0)."""

    model: str | None = None
    prompt_token_ids: Sequence[int] | None = None
    """A list, or a stitched call's ``array`` (token sessions)."""
    response_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def _logprob_values(kind: Kind, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if kind == "chat":
        content = logprobs.get("content")
        return [e.get("logprob") for e in content] if isinstance(content, list) else None
    values = logprobs.get("token_logprobs")
    return list(values) if isinstance(values, list) else None


def read_completion(kind: Kind, obj: dict[str, Any]) -> Completion:
    """Read choice 0 of a non-streaming response."""
    choices = obj.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    done = Completion(model=obj.get("model"), usage=obj.get("usage"), finish_reason=choice.get("finish_reason"))
    done.response_token_ids = choice.get("token_ids")
    done.logprobs = _logprob_values(kind, choice.get("logprobs"))
    if kind == "chat":
        done.prompt_token_ids = obj.get("prompt_token_ids")
        message = choice.get("message") or {}
        done.text = message.get("content")
        done.tool_calls = message.get("tool_calls") or None
    else:
        done.prompt_token_ids = choice.get("prompt_token_ids")
        done.text = choice.get("text")
    return done


@dataclass
class StreamAccumulator:
    """Rebuilds choice 0 of a streamed answer chunk by chunk."""

    kind: Kind
    done: Completion = field(default_factory=Completion)
    _text: list[str] = field(default_factory=list)
    _tools: dict[int, dict[str, Any]] = field(default_factory=dict)

    def feed(self, chunk: dict[str, Any]) -> None:
        done = self.done
        done.model = done.model or chunk.get("model")
        if chunk.get("usage"):
            done.usage = chunk["usage"]
        if self.kind == "chat" and chunk.get("prompt_token_ids") is not None:
            done.prompt_token_ids = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        done = self.done
        if choice.get("prompt_token_ids") is not None:
            done.prompt_token_ids = choice["prompt_token_ids"]
        if choice.get("token_ids"):
            done.response_token_ids = (done.response_token_ids or []) + list(choice["token_ids"])
        values = _logprob_values(self.kind, choice.get("logprobs"))
        if values:
            done.logprobs = (done.logprobs or []) + values
        if choice.get("finish_reason"):
            done.finish_reason = choice["finish_reason"]
        if self.kind == "completions":
            self._text.append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self._text.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            self._merge_tool_call(call)

    def _merge_tool_call(self, delta: dict[str, Any]) -> None:
        call = self._tools.setdefault(
            delta.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def result(self) -> Completion:
        done = self.done
        done.text = "".join(self._text) if self._text else None
        done.tool_calls = [self._tools[i] for i in sorted(self._tools)] or None
        return done
