"""The engine's raw completion of a stitched call -> the chat answer the client asked for.

Non-streaming: one ``chat.completion`` (content and tool calls parsed by the
model family's parser, finish reason ``tool_calls`` when calls were parsed,
usage; ``prompt_token_ids`` / ``token_ids`` / logprobs only when the client
asked). Streaming: each ``text_completion`` chunk becomes a
``chat.completion.chunk`` (an opening chunk with the role, content deltas,
the tool calls with the finish reason, the usage chunk when asked).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from schemas.tool_parsers import ParserStream, ToolParser, close_delta, finish_reason
from ingest.gateway.tokens import Asked, Completion


def _chat_logprobs(logprobs: Any, top: int) -> dict | None:
    """Completions logprobs (tokens, token_logprobs, top_logprobs) -> chat ``{"content": [...]}``."""
    if not isinstance(logprobs, dict):
        return None
    tokens, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    content = []
    for token, value, alternatives in zip(tokens, values, tops, strict=False):
        entries = sorted((alternatives or {}).items(), key=lambda kv: -kv[1])[:top]
        content.append({"token": token, "logprob": value, "bytes": list(token.encode("utf-8")),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
                                         for t, v in entries]})
    return {"content": content}


_ECHO = b'"prompt_token_ids":['


def without_echo(raw: bytes, prompt_json: bytes) -> bytes | None:
    """The engine's raw completion with its echo of the stitched prompt (``"prompt_token_ids":[...]``, ids as
    ``prompt_json``) set to ``null``, when it holds that key once and spelled exactly as sent (compact JSON, as
    vLLM and SGLang write it): the ids are then known equal without parsing ~2k numbers. None: not so (the echo
    is parsed and compared id by id, ``Stitcher.remember``)."""
    at = raw.find(_ECHO)
    start = at + len(_ECHO)
    if at < 0 or raw.find(_ECHO, start) >= 0 or not raw.startswith(prompt_json, start):
        return None
    end = start + len(prompt_json)
    if not raw.startswith(b"]", end):
        return None
    return raw[:at] + b'"prompt_token_ids":null' + raw[end + 1:]


def _chat_id(engine_id: Any) -> str:
    text = str(engine_id or "")
    return "chatcmpl-" + (text[5:] if text.startswith("cmpl-") else text)


def _values(logprobs: Any) -> list[float] | None:
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return list(values) if isinstance(values, list) else None


class ChatAnswer:
    """Builds the chat answer of one stitched call and what is recorded of it."""

    def __init__(self, body: dict[str, Any], asked: Asked, parser: ToolParser | None, prompt: Sequence[int]) -> None:
        self.asked, self.parser, self.prompt = asked, parser, prompt
        self.top = int(body.get("top_logprobs") or 0)
        self.record = Completion()
        """A streamed call's prompt ids are the stitched ones (``prompt``, from its first chunk); a whole
        answer's are those the engine echoes (the stitched ones when it echoes none, or exactly them)."""
        self._stream: ParserStream | None = None
        self._opened = False
        self._text: list[str] = []

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.tolist() if isinstance(self.prompt, array) else list(self.prompt)

    def _split(self, text: str) -> tuple[str, list[dict]]:
        return self.parser.parse(text) if self.parser else (text, [])

    def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The ``chat.completion`` of a ``text_completion`` answer; fills ``record``."""
        choice = (answer.get("choices") or [{}])[0]
        content, calls = self._split(choice.get("text") or "")
        finish = finish_reason(choice.get("finish_reason"), calls)
        out_choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content or None, "tool_calls": calls},
            "logprobs": _chat_logprobs(choice.get("logprobs"), self.top) if self.asked.logprobs else None,
            "finish_reason": finish,
            "stop_reason": choice.get("stop_reason"),
        }
        out = {"id": _chat_id(answer.get("id")), "object": "chat.completion", "created": answer.get("created"),
               "model": answer.get("model"), "choices": [out_choice], "usage": answer.get("usage")}
        prompt_ids = choice.get("prompt_token_ids") or self.prompt  # not echoed (or known equal): the stitched ids
        if self.asked.token_ids:
            out_choice["token_ids"] = choice.get("token_ids")
            out["prompt_token_ids"] = prompt_ids if isinstance(prompt_ids, list) else self.prompt_ids
        self.record = Completion(
            model=answer.get("model"), prompt_token_ids=prompt_ids, response_token_ids=choice.get("token_ids"),
            logprobs=_values(choice.get("logprobs")), text=content or None, tool_calls=calls or None,
            finish_reason=finish, usage=answer.get("usage"),
        )
        return out

    def chunks(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chat chunks of one streamed ``text_completion`` chunk; fills ``record`` as they pass."""
        if "error" in chunk:
            return [chunk]  # an in-band engine error reaches the client as sent (OpenAI clients raise it)
        head = {"id": _chat_id(chunk.get("id")), "object": "chat.completion.chunk", "created": chunk.get("created"),
                "model": chunk.get("model")}
        record = self.record
        record.model = record.model or chunk.get("model")
        out: list[dict[str, Any]] = []
        if not self._opened:
            self._opened = True
            record.prompt_token_ids = self.prompt
            self._stream = self.parser.stream() if self.parser else None
            opening = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]}
            if self.asked.token_ids:
                opening["prompt_token_ids"] = self.prompt_ids
            out.append(opening)
        if chunk.get("usage") and not chunk.get("choices"):
            record.usage = chunk["usage"]
            return [*out, {**head, "choices": [], "usage": chunk["usage"]}]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out.append({**head, "choices": [self._choice(choice)]})
        return out

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        record = self.record
        text = choice.get("text") or ""
        self._text.append(text)
        ids = choice.get("token_ids") or []
        record.response_token_ids = (record.response_token_ids or []) + list(ids)
        values = _values(choice.get("logprobs"))
        if values:
            record.logprobs = (record.logprobs or []) + values
        content = self._stream.push(text) if self._stream else text
        delta: dict[str, Any] = {"content": content}
        out: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        if choice.get("finish_reason") is not None:
            calls = close_delta(self._stream, delta)
            out["finish_reason"] = record.finish_reason = finish_reason(choice["finish_reason"], calls)
            out["stop_reason"] = choice.get("stop_reason")
            record.text, _ = self._split("".join(self._text))
            record.text = record.text or None
            record.tool_calls = calls or None
        out["logprobs"] = _chat_logprobs(choice.get("logprobs"), self.top) if self.asked.logprobs else None
        if self.asked.token_ids:
            out["token_ids"] = ids
        return out
