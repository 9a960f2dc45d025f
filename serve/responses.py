"""Response objects in vLLM's OpenAI-compatible format, with token ids and logprobs.

Non-streaming: ``chat.completion`` / ``text_completion`` with top-level
``prompt_token_ids`` (chat) or per-choice ``prompt_token_ids`` (completions)
and per-choice ``token_ids`` when ``return_token_ids`` is set. Streaming: one
chunk per generated token carrying that token's ``token_ids`` and logprobs;
the first chunk carries the prompt ids; the last token's chunk carries
``finish_reason``; a usage chunk with empty choices comes last when asked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from serve.engine import Step
from serve.protocol import ChatRequest, CompletionRequest
from serve.text import TokenStrings
from schemas.tool_parsers import HermesStream, close_delta, finish_reason, parse_tool_calls


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_logprobs(strings: TokenStrings, steps: Sequence[Step]) -> dict:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}``, one entry per token."""
    def entry(token_id: int, logprob: float) -> dict:
        return {"token": strings.string(token_id), "logprob": logprob, "bytes": strings.bytes(token_id)}

    return {"content": [
        {**entry(s.token.token_id, s.token.logprob), "top_logprobs": [entry(i, lp) for i, lp in s.token.top]}
        for s in steps
    ]}


def completion_logprobs(strings: TokenStrings, steps: Sequence[Step]) -> dict:
    """The legacy completions shape; each ``top_logprobs`` dict also holds the sampled token."""
    tops = []
    for s in steps:
        top = {strings.string(i): lp for i, lp in s.token.top}
        top.setdefault(strings.string(s.token.token_id), s.token.logprob)
        tops.append(top)
    return {
        "tokens": [strings.string(s.token.token_id) for s in steps],
        "token_logprobs": [s.token.logprob for s in steps],
        "top_logprobs": tops,
        "text_offset": [s.text_offset for s in steps],
    }


def _finish(steps: Sequence[Step]) -> dict:
    last = steps[-1]
    return {"finish_reason": last.finish_reason, "stop_reason": last.stop_reason}


class ChatCompletion:
    """Builds one ``chat.completion`` (or its chunks) from generation steps."""

    def __init__(self, request: ChatRequest, prompt_ids: list[int], strings: TokenStrings, model: str) -> None:
        self.request, self.prompt_ids, self.strings, self.model = request, prompt_ids, strings, model
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self._tools = HermesStream() if request.parses_tool_calls() else None
        self._count = 0

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, steps: Sequence[Step]) -> dict:
        text = "".join(s.text for s in steps)
        content, calls = parse_tool_calls(text) if self._tools else (text, [])
        content = content.strip() if self._tools else content
        finish = _finish(steps)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content or None, "tool_calls": calls},
            "logprobs": chat_logprobs(self.strings, steps) if self.request.logprobs else None,
            **finish,
            "finish_reason": finish_reason(finish["finish_reason"], calls),
        }
        body = {**self._head("chat.completion"), "choices": [choice], "usage": usage(len(self.prompt_ids), len(steps))}
        if self.request.return_token_ids:
            choice["token_ids"] = [s.token.token_id for s in steps]
            body["prompt_token_ids"] = self.prompt_ids
        return body

    def opening(self) -> list[dict]:
        chunk = {**self._head("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]}
        if self.request.return_token_ids:
            chunk["prompt_token_ids"] = self.prompt_ids
        return [chunk]

    def chunk(self, step: Step) -> dict:
        self._count += 1
        content = self._tools.push(step.text) if self._tools else step.text
        delta: dict = {"content": content}
        choice: dict = {"index": 0, "delta": delta, "finish_reason": None}
        if step.finish_reason is not None:
            calls = close_delta(self._tools, delta)
            choice["finish_reason"] = finish_reason(step.finish_reason, calls)
            choice["stop_reason"] = step.stop_reason
        choice["logprobs"] = chat_logprobs(self.strings, [step]) if self.request.logprobs else None
        if self.request.return_token_ids:
            choice["token_ids"] = [step.token.token_id]
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def closing(self) -> list[dict]:
        options = self.request.stream_options
        if options is None or not options.include_usage:
            return []
        return [{**self._head("chat.completion.chunk"), "choices": [], "usage": usage(len(self.prompt_ids), self._count)}]


class TextCompletion:
    """Builds one ``text_completion`` (or its chunks) from generation steps."""

    def __init__(self, request: CompletionRequest, prompt_ids: list[int], strings: TokenStrings, model: str) -> None:
        self.request, self.prompt_ids, self.strings, self.model = request, prompt_ids, strings, model
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self._count = 0

    def _head(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def _choice(self, steps: Sequence[Step], *, with_prompt: bool) -> dict:
        choice = {
            "index": 0,
            "text": "".join(s.text for s in steps),
            "logprobs": completion_logprobs(self.strings, steps) if self.request.logprobs is not None else None,
            **_finish(steps),
        }
        if self.request.return_token_ids:
            if with_prompt:
                choice["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = [s.token.token_id for s in steps]
        return choice

    def response(self, steps: Sequence[Step]) -> dict:
        return {**self._head(), "choices": [self._choice(steps, with_prompt=True)],
                "usage": usage(len(self.prompt_ids), len(steps))}

    def opening(self) -> list[dict]:
        return []

    def chunk(self, step: Step) -> dict:
        self._count += 1
        return {**self._head(), "choices": [self._choice([step], with_prompt=self._count == 1)]}

    def closing(self) -> list[dict]:
        options = self.request.stream_options
        if options is None or not options.include_usage:
            return []
        return [{**self._head(), "choices": [], "usage": usage(len(self.prompt_ids), self._count)}]
