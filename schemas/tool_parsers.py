"""Tool-call parsers per model family: raw completion text -> (content, OpenAI ``tool_calls``).

Shared by the reference engine (``serve``, its chat route) and the gateway's
token sessions (a stitched call's raw completion), so both answer alike.

A registry by name; ``hermes`` (Qwen 2.5/3, Hermes, the tiny model) is the
one built in: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (a
last unclosed block counts too). If any block is not a JSON object with a
string ``name``, nothing is parsed and the whole text is content (as vLLM's
Hermes parser does). Text outside the tags, with surrounding whitespace
stripped, is the content. Llama-3 JSON or Mistral ``[TOOL_CALLS]`` parsers
are added by registering a ``ToolParser`` under their name.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Protocol


class ParserStream(Protocol):
    def push(self, delta: str) -> str:
        """Add generated text; return the content that is safe to stream now."""

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet streamed, parsed tool calls) once the generation has ended."""


class ToolParser(Protocol):
    name: str

    def parse(self, text: str) -> tuple[str, list[dict]]:
        """(content, tool calls) of a whole generated text."""

    def stream(self) -> ParserStream:
        """A parser for one streamed generation."""


OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG) + "|" + re.escape(OPEN_TAG) + r"(.*)\Z", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Split generated text into (content outside the tags, OpenAI tool calls); content is not stripped.

    >>> parse_tool_calls('Let me look.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')[1][0]["function"]
    {'name': 'f', 'arguments': '{"x": 1}'}
    """
    calls: list[dict] = []
    outside: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        call = _parse_block(body)
        if call is None:
            return text, []
        calls.append(call)
        outside.append(text[position : match.start()])
        position = match.end()
    outside.append(text[position:])
    return "".join(outside), calls


def _parse_block(body: str) -> dict | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or not parsed["name"]:
        return None
    arguments = parsed.get("arguments", parsed.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": parsed["name"], "arguments": arguments},
    }


class HermesStream:
    """Streams content up to the first ``<tool_call>``, then buffers; parses at the end.

    Content is the text outside the tags with surrounding whitespace stripped,
    so the stream holds back trailing whitespace and a possible partial tag;
    what it releases, plus the ``content`` of :meth:`finish`, equals that content.
    """

    def __init__(self) -> None:
        self._text = ""
        self._released = ""
        self._in_call = False

    def push(self, delta: str) -> str:
        self._text += delta
        if self._in_call:
            return ""
        tag = self._text.find(OPEN_TAG)
        self._in_call = tag >= 0
        end = tag if self._in_call else len(self._text) - _partial_tag_suffix(self._text)
        candidate = self._text[:end].strip()
        out = candidate[len(self._released) :]
        self._released = candidate if out else self._released
        return out

    def finish(self) -> tuple[str, list[dict]]:
        content, calls = parse_tool_calls(self._text)
        return content.strip()[len(self._released) :], calls


def finish_reason(reason: str | None, calls: list[dict]) -> str | None:
    """OpenAI's finish reason: ``tool_calls`` when the model stopped after calling tools."""
    return "tool_calls" if calls and reason == "stop" else reason


def close_delta(stream: ParserStream | None, delta: dict) -> list[dict]:
    """The last chunk of a streamed answer: what ``stream`` held back joins ``delta``'s content and its
    parsed calls become ``delta["tool_calls"]``; returns the calls."""
    calls: list[dict] = []
    if stream is not None:
        rest, calls = stream.finish()
        delta["content"] += rest
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    return calls


def _partial_tag_suffix(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0


class HermesParser:
    name = "hermes"

    def parse(self, text: str) -> tuple[str, list[dict]]:
        content, calls = parse_tool_calls(text)
        return content.strip(), calls

    def stream(self) -> HermesStream:
        return HermesStream()


PARSERS: dict[str, ToolParser] = {"hermes": HermesParser()}
"""Parsers by name; ``qwen`` is an alias of ``hermes``."""
_ALIASES = {"qwen": "hermes"}


def resolve_parser(name: str, chat_template: str | None) -> ToolParser | None:
    """The parser named ``name``; ``auto`` picks by the chat template's tool-call markup. None when unknown."""
    if name == "auto":
        template = chat_template or ""
        return PARSERS["hermes"] if OPEN_TAG in template else None
    return PARSERS.get(_ALIASES.get(name, name))
