"""Reading request bodies: size limit, nesting limit, JSON, and the few types the gateway relies on.

Everything else in a completion request is the engine's business and is
passed through untouched (the engine answers its own 400s).

Nesting: a body nested deeper than ``MAX_NESTING`` levels of arrays/objects
is a 400. Past ~250 levels pydantic can no longer serialize the event that
records the call (and past ~1,000 Python's parser raises RecursionError), so
the limit sits well below both. The precise walk runs only for bodies with
more than ``MAX_NESTING`` brackets (a C-speed count), so common bodies pay ~nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ingest.gateway.errors import BadRequest, BodyTooLarge
from ingest.gateway.tokens import Kind
from schemas.versions import UnstorableValue, loads_finite


async def read_limited(chunks: AsyncIterator[bytes], *, content_length: str | None, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes ``limit`` bytes."""
    too_large = BodyTooLarge(f"request body exceeds the gateway's {limit}-byte limit (TRAJLAKE_MAX_BODY_BYTES)")
    if content_length and content_length.isdigit() and int(content_length) > limit:
        raise too_large
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


MAX_NESTING = 200
"""Deepest accepted nesting of arrays and objects in a request body (the body itself is level 1)."""


def parse_object(raw: bytes) -> Any:
    """The parsed JSON body; raises ``BadRequest`` for empty, invalid or too deeply nested bodies, and for
    NaN/Infinity (not JSON, naming where: ``events.0.payload.arguments.x``)."""
    if not raw:
        raise BadRequest("request body is empty: send a JSON object")
    too_deep = BadRequest(f"request body nests arrays/objects deeper than {MAX_NESTING} levels: flatten it")
    try:
        body = loads_finite(raw)
    except UnstorableValue as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", param=exc.path or None) from None
    except ValueError as exc:  # invalid JSON or UTF-8, and integers past Python's 4,300-digit conversion limit
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep from None
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and _deeper_than(body, MAX_NESTING):
        raise too_deep
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays/objects more than ``limit`` levels (iterative: no recursion to overflow)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _expect(body: dict[str, Any], name: str, types: tuple[type, ...], what: str, *, required: bool = False) -> None:
    """``null`` is "not given", as vLLM and SGLang read it (clients and frameworks send ``"tools": null``)."""
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"'{name}' is required", param=name)
        return
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BadRequest(f"'{name}' must be {what}, got {type(value).__name__}", param=name)


def completion_request(raw: bytes, kind: Kind) -> dict[str, Any]:
    """Parse and check a chat or text completion request; raises ``BadRequest``."""
    body = parse_object(raw)
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    _expect(body, "model", (str,), "a string", required=True)
    _expect(body, "stream", (bool,), "a boolean")
    _expect(body, "return_token_ids", (bool,), "a boolean")
    _expect(body, "tools", (list,), "a list of tool definitions")
    if kind == "chat":
        _expect(body, "messages", (list,), "a list of messages", required=True)
        _expect(body, "logprobs", (bool,), "a boolean")
        messages = body["messages"]
        if not messages:
            raise BadRequest("'messages' must not be empty", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param="messages")
    else:
        _expect(body, "prompt", (str, list), "a string or a list", required=True)
        _expect(body, "logprobs", (int,), "an integer")
    return body
