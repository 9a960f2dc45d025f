"""Service answers -> HTTP responses."""

from __future__ import annotations

from fastapi import Response
from fastapi.responses import StreamingResponse

from ingest.gateway.proxy import Answer, StreamAnswer


def to_response(answer: Answer | StreamAnswer) -> Response:
    if isinstance(answer, StreamAnswer):
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        return StreamingResponse(answer.chunks, media_type="text/event-stream", headers=headers)
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type, headers=answer.headers)
