"""Answer a generation request: one JSON body, or SSE chunks streamed from a worker thread.

Shared by the chat and completions routes; the response builders in
``serve.responses`` shape the bodies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator

from fastapi.responses import JSONResponse, StreamingResponse

from serve.engine import ServeEngine, Step
from serve.protocol import ChatRequest, CompletionRequest, ServeError
from serve.responses import ChatCompletion, TextCompletion
from serve.sampling import SamplingParams

log = logging.getLogger(__name__)

_DONE = object()


def sampling_params(engine: ServeEngine, request: ChatRequest | CompletionRequest, prompt_ids: list[int],
                    requested: int | None, top: int, *, param: str) -> SamplingParams:
    """The request's sampling options, its ``max_tokens`` bounded by the cap and the context."""
    return SamplingParams(
        max_tokens=engine.max_tokens(requested, len(prompt_ids), param=param),
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k or 0,
        seed=request.seed,
        top_logprobs=top,
    )


async def respond(engine: ServeEngine, builder: ChatCompletion | TextCompletion, prompt_ids: list[int],
                  params: SamplingParams, request: ChatRequest | CompletionRequest
                  ) -> JSONResponse | StreamingResponse:
    """Generate from ``prompt_ids`` and answer with ``builder``'s body, or its chunks when ``stream``."""
    headers = engine.identity.headers()
    stop = request.stop_strings()
    stop_ids = frozenset(request.stop_token_ids or ())
    if not request.stream:
        steps = await asyncio.to_thread(
            lambda: list(engine.generate(prompt_ids, params, stop=stop, stop_token_ids=stop_ids))
        )
        log.debug("event=serve_completed id=%s prompt_tokens=%d completion_tokens=%d finish=%s",
                  builder.id, len(prompt_ids), len(steps), steps[-1].finish_reason)
        return JSONResponse(builder.response(steps), headers=headers)

    async def events() -> AsyncIterator[str]:
        for chunk in builder.opening():
            yield _sse(chunk)
        try:
            async for step in _steps_in_thread(engine, prompt_ids, params, stop, stop_ids):
                yield _sse(builder.chunk(step))
        except Exception as exc:  # the status line is sent already: report in-band, as vLLM does
            log.exception("event=serve_stream_failed")
            yield _sse(ServeError(500, f"generation failed: {exc}", kind="server_error").body())
        else:
            for chunk in builder.closing():
                yield _sse(chunk)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


async def _steps_in_thread(engine: ServeEngine, prompt_ids: list[int], params: SamplingParams,
                           stop: tuple[str, ...], stop_ids: frozenset[int]) -> AsyncIterator[Step]:
    """Run the generation in a worker thread and hand its steps to the event loop as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            cancel.set()

    def work() -> None:
        steps: Iterator[Step] = engine.generate(prompt_ids, params, stop=stop, stop_token_ids=stop_ids, cancel=cancel)
        try:
            for step in steps:
                put(step)
        except Exception as exc:
            put(exc)
        finally:
            put(_DONE)

    loop.run_in_executor(None, work)
    try:
        while (item := await queue.get()) is not _DONE:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        cancel.set()  # a client that went away stops the generation at the next token


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
