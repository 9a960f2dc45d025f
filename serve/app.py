"""The reference upstream's app factory: assembles the routers; the lifespan loads the model.

It answers like vLLM (>= 0.10.2) does with ``return_token_ids``: prompt and
response token ids and per-token logprobs (raw model distribution), streaming
and not, Hermes tool calls parsed into ``tool_calls``. It tells clients who it
is: ``GET /v1/models`` lists the served name with ``policy_version``,
``tokenizer`` and ``chat_template_hash``, and every response carries them as
``x-policy-version``, ``x-tokenizer`` and ``x-chat-template-hash`` headers.

>>> app = create_serve_app(Path("checkpoints/step-100"), policy_version="step-100")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from serve.deps import identity_headers
from serve.engine import ServeEngine
from serve.protocol import ServeError
from serve.routes import chat, completions, health, models

log = logging.getLogger(__name__)


def create_serve_app(
    model_dir: Path, *, served_name: str | None = None, policy_version: str | None = None,
    max_new_tokens_cap: int = 512, seed: int = 0, threads: int = 1,
) -> FastAPI:
    """The app serving the model in ``model_dir`` (a ``save_pretrained`` folder); its lifespan loads it.

    ``served_name`` defaults to the folder's name and ``policy_version`` to the
    served name; ``max_new_tokens_cap`` bounds ``max_tokens``; ``seed`` seeds
    the stream of seeds given to requests that bring none; ``threads`` is the
    torch intra-op thread count of generation (1 suits small models). Entering
    the lifespan raises ``OSError`` or ``ValueError`` for a folder that holds
    no loadable model.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Loaded on the event loop on purpose: nothing is served before it is done, and a stop
        # signal during a long load interrupts it at once (a worker thread would be waited for).
        app.state.engine = ServeEngine(
            model_dir, served_name=served_name, policy_version=policy_version,
            max_new_tokens_cap=max_new_tokens_cap, seed=seed, threads=threads,
        )
        try:
            yield
        finally:
            del app.state.engine

    app = FastAPI(title="trajlake serve-model", lifespan=lifespan, docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    for module in (health, models, chat, completions):
        app.include_router(module.router)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every error, expected or not, answers in OpenAI's error shape."""

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=identity_headers(request))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = ServeError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=identity_headers(request))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("event=serve_request_failed")
        error = ServeError(500, f"internal error: {exc}; see the server log", kind="server_error")
        return JSONResponse(error.body(), status_code=500, headers=identity_headers(request))
