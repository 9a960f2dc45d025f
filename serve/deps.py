"""What routes reach through ``Annotated`` dependencies: the engine the lifespan loaded, the request body."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serve.engine import ServeEngine
from serve.protocol import ServeError

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (413 above)."""


# Dependencies are ``async def``: FastAPI runs plain ``def`` ones in a worker thread.
async def get_engine(request: Request) -> ServeEngine:
    return request.app.state.engine


EngineDep = Annotated[ServeEngine, Depends(get_engine)]


async def read_body(request: Request) -> bytes:
    """The raw request body; 413 past ``MAX_BODY_BYTES`` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ServeError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise ServeError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
    return bytes(body)


BodyDep = Annotated[bytes, Depends(read_body)]


def identity_headers(request: Request) -> dict[str, str]:
    """The served model's identity headers (none before the model is loaded)."""
    engine: ServeEngine | None = getattr(request.app.state, "engine", None)
    return engine.identity.headers() if engine is not None else {}
