"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools protocol with a bound on request heads.

httptools (llhttp) sets no limit on the request line and headers, so uvicorn
parsed a 20 MB header and handed it to the app. Here the bytes of a request's
head are counted as they arrive; a head that has not ended within
``MAX_HEADER_BYTES`` is answered 431 without feeding the rest to the parser;
the connection's input is then read and dropped for up to ``LINGER_S`` before
it is closed (a lingering close: closing with unread input would reset the
connection and the client could lose the 431 before reading it). Common
requests pay one comparison per read.
(h11 has such a limit, but uvicorn's httptools protocol measured ~2x the
gateway's req/s; see ``bench/gateway``.)
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024
"""Largest accepted request head: request line + all headers (OpenAI clients send ~1 KiB)."""
LINGER_S = 2.0
"""How long input is drained after a 431 before the connection is closed."""


def _too_large_response() -> bytes:
    error = {"message": f"request line and headers exceed the gateway's {MAX_HEADER_BYTES}-byte limit: send "
                        "smaller headers", "type": "invalid_request_error", "param": None,
             "code": "request_header_fields_too_large"}
    body = json.dumps({"error": error}).encode()
    head = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    return head + body


class GatewayHttpProtocol(HttpToolsProtocol):
    """Pass as ``http=`` to uvicorn. Heads over ``MAX_HEADER_BYTES`` get 431 and the connection is closed.

    Bytes are counted per read while a head is open (from the end of the previous request to
    ``on_headers_complete``); a read that crosses the limit is fed only up to it, so the parser never
    sees more than ``MAX_HEADER_BYTES`` of an unfinished head.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._in_head = True
        self._head_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # draining after a 431
        if not self._in_head:
            super().data_received(data)
            return
        room = MAX_HEADER_BYTES - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        super().data_received(data[:room])
        if self._in_head and not self.transport.is_closing():  # the head did not end within the limit
            self._refuse()
            return
        if not self.transport.is_closing():
            self.data_received(data[room:])

    def _refuse(self) -> None:
        self._refused = True
        self.transport.write(_too_large_response())
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0
