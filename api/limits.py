"""Request size limits: the body (pure ASGI middleware) and the headers (uvicorn's h11 protocol).

A declared ``Content-Length`` over the limit is refused before the body is
read; a chunked body is counted as it streams and refused once past it.
Headers are bounded by the HTTP parser itself, before the app sees them.
"""

from __future__ import annotations

import json
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.errors import ApiError, BodyTooLarge, error_body


class BodyLimit:
    """Answer 413 to any request whose body exceeds ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await BodyTooLarge(self.max_bytes).error.response()(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class HeaderLimit:
    """Answer 431 to a request whose request line and headers exceed ``max_bytes``.

    h11 (``header_limited_h11``) refuses headers that arrive over several
    reads before buffering more than the limit; a request that arrives whole
    in one read is parsed, then refused here.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b"")) + sum(
                len(name) + len(value) + 4 for name, value in scope.get("headers") or [])
            if size > self.max_bytes:
                await headers_too_large(self.max_bytes).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def headers_too_large(max_bytes: int) -> ApiError:
    return ApiError(431, "headers_too_large", f"request line and headers are over {max_bytes:,} bytes",
                    hint="send shorter headers (the API key, content type and length are all it needs)")


def header_limited_h11(max_header_bytes: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol answering 431 (JSON, like every error) to a request line + headers over
    ``max_header_bytes``; pass it as ``uvicorn.run(app, http=..., h11_max_incomplete_event_size=max_header_bytes)``.

    h11 stops buffering past that size and reports 431; uvicorn would answer a plain 400.
    """

    class HeaderLimitedH11(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.error_status = 400
            next_event = self.conn.next_event

            def checked_next_event() -> Any:
                try:
                    return next_event()
                except h11.RemoteProtocolError as exc:
                    self.error_status = exc.error_status_hint
                    raise

            self.conn.next_event = checked_next_event  # type: ignore[method-assign]

        def send_400_response(self, msg: str) -> None:
            if self.error_status != 431:
                super().send_400_response(msg)
                return
            error = headers_too_large(max_header_bytes)
            body = json.dumps(error_body(error.status, error.code, error.message, hint=error.hint)).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]
            for event in (h11.Response(status_code=431, headers=headers, reason=b"Request Header Fields Too Large"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return HeaderLimitedH11
