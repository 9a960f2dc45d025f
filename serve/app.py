"""The reference upstream: an OpenAI-compatible server for one Hugging Face causal LM.

It answers like vLLM (>= 0.10.2) does with ``return_token_ids``: prompt and
response token ids and per-token logprobs (raw model distribution), streaming
and not, Hermes tool calls parsed into ``tool_calls``. It tells clients who it
is: ``GET /v1/models`` lists the served name with ``policy_version``,
``tokenizer`` and ``chat_template_hash``, and every response carries them as
``x-policy-version``, ``x-tokenizer`` and ``x-chat-template-hash`` headers.

>>> app = create_serve_app(Path("checkpoints/step-100"), policy_version="step-100")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from serve.engine import ServeEngine, Step
from serve.protocol import ChatRequest, CompletionRequest, ServeError, parse_request
from serve.responses import ChatCompletion, TextCompletion
from serve.sampling import SamplingParams

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (413 above)."""
_DONE = object()


def create_serve_app(
    model_dir: Path, *, served_name: str | None = None, policy_version: str | None = None,
    max_new_tokens_cap: int = 512, seed: int = 0, threads: int = 1,
) -> FastAPI:
    """Load the model in ``model_dir`` (a ``save_pretrained`` folder) and return the app serving it.

    ``served_name`` defaults to the folder's name and ``policy_version`` to the
    served name; ``max_new_tokens_cap`` bounds ``max_tokens``; ``seed`` seeds
    the stream of seeds given to requests that bring none; ``threads`` is the
    torch intra-op thread count of generation (1 suits small models).
    """
    engine = ServeEngine(
        model_dir, served_name=served_name, policy_version=policy_version,
        max_new_tokens_cap=max_new_tokens_cap, seed=seed, threads=threads,
    )
    headers = engine.identity.headers()
    app = FastAPI(title="trajlake serve-model", docs_url=None, redoc_url=None)
    app.state.identity = engine.identity
    _install_error_handlers(app, headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "model": engine.identity.served_name}, headers=headers)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        identity = engine.identity
        entry = {
            "id": identity.served_name, "object": "model", "created": identity.loaded_at, "owned_by": "trajlake",
            "max_model_len": identity.max_model_len, "policy_version": identity.policy_version,
            "tokenizer": identity.tokenizer, "chat_template_hash": identity.chat_template_hash,
        }
        return JSONResponse({"object": "list", "data": [entry]}, headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        chat, body = parse_request(await _read_body(request), ChatRequest)
        engine.check_model(chat.model)
        prompt_ids = engine.chat_prompt(body["messages"], body.get("tools"))
        top = chat.top_logprobs or 0
        params = _sampling(engine, chat, prompt_ids, chat.requested_max_tokens(), top, param="messages")
        builder = ChatCompletion(chat, prompt_ids, engine.strings, engine.identity.served_name)
        return await _respond(engine, builder, prompt_ids, params, chat, headers)

    @app.post("/v1/completions")
    async def completions(request: Request):
        completion, _ = parse_request(await _read_body(request), CompletionRequest)
        engine.check_model(completion.model)
        prompt_ids = engine.text_prompt(completion.single_prompt(), add_special_tokens=completion.add_special_tokens)
        top = completion.logprobs or 0
        params = _sampling(engine, completion, prompt_ids, completion.requested_max_tokens(), top, param="prompt")
        builder = TextCompletion(completion, prompt_ids, engine.strings, engine.identity.served_name)
        return await _respond(engine, builder, prompt_ids, params, completion, headers)

    return app


def _sampling(engine: ServeEngine, request: ChatRequest | CompletionRequest, prompt_ids: list[int],
              requested: int | None, top: int, *, param: str) -> SamplingParams:
    return SamplingParams(
        max_tokens=engine.max_tokens(requested, len(prompt_ids), param=param),
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k or 0,
        seed=request.seed,
        top_logprobs=top,
    )


async def _respond(engine: ServeEngine, builder: ChatCompletion | TextCompletion, prompt_ids: list[int],
                   params: SamplingParams, request: ChatRequest | CompletionRequest, headers: dict[str, str]
                   ) -> JSONResponse | StreamingResponse:
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


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ServeError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise ServeError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
    return bytes(body)


def _install_error_handlers(app: FastAPI, headers: dict[str, str]) -> None:
    """Every error, expected or not, answers in OpenAI's error shape."""

    @app.exception_handler(ServeError)
    async def serve_error(_: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        error = ServeError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("event=serve_request_failed")
        error = ServeError(500, f"internal error: {exc}; see the server log", kind="server_error")
        return JSONResponse(error.body(), status_code=500, headers=headers)
