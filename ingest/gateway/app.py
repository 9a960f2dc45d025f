"""The app factory: assembles services and routers; the lifespan owns the upstream connection pool and the emitter."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException

from ingest.gateway.auth import KeyRing
from ingest.gateway.capture import Recorder
from ingest.gateway.config import GatewayConfig
from ingest.gateway.emitter import Emitter, KafkaSink
from ingest.gateway.errors import GatewayError, for_http_status
from ingest.gateway.idempotency import IdempotencyCache
from ingest.gateway.metrics import GatewayMetrics
from ingest.gateway.proxy import ProxyService
from ingest.gateway.retokenize import Retokenizer
from ingest.gateway.routes import completions, events, health, models, otlp
from ingest.gateway.services import Services
from ingest.gateway.sessions.state import SessionStore
from ingest.gateway.sessions.stitch import Stitcher
from ingest.gateway.upstream import Upstream, make_pool
from ingest.redaction import Redactor, load_redactor
from ingest.spool import Spool

log = logging.getLogger(__name__)


def build_emitter(settings: GatewayConfig, *, redactor: Redactor | None = None) -> Emitter:
    """Kafka sink + on-disk spool, as configured."""
    sink = KafkaSink(settings.bootstrap_servers, settings.topic, timeout_s=settings.broker_timeout_s,
                     compression=settings.kafka_compression)
    return Emitter(sink, Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes), redactor=redactor,
                   compact_logprobs=settings.compact_logprobs)


def _token_sessions(settings: GatewayConfig, retokenizer: Retokenizer | None) -> Stitcher | None:
    """The token session planner when ``token_sessions`` is on (loads the tokenizer now, not on a call)."""
    if not settings.token_sessions:
        return None
    if retokenizer is None:
        raise ValueError("token sessions need the served model's tokenizer: pass --tokenizer PATH "
                         "(or TRAJLAKE_TOKENIZER), or turn token sessions off")
    if not settings.request_token_ids:
        raise ValueError("token sessions need the engine's token ids: set request_token_ids (the default) "
                         "or turn token sessions off")
    tokenizer = retokenizer.tokenizer
    if not isinstance(getattr(tokenizer, "chat_template", None), str) or not tokenizer.eos_token:
        raise ValueError(f"the tokenizer at {settings.tokenizer} has no chat template or no end-of-turn token; "
                         "token sessions need both: point --tokenizer at the served model's folder")
    store = SessionStore(max_bytes=settings.session_max_bytes, ttl_s=settings.session_ttl_s)
    return Stitcher(tokenizer, store, parser=settings.session_parser)


_frozen_lock = threading.Lock()
_frozen_gateways = 0
"""Gateways running in this process with their startup frozen: the freeze is the process's, so the last one to stop
hands the objects back."""


def _freeze_startup() -> None:
    """Keep what startup built out of the collector's full passes, which otherwise walk it all on the request path
    (a tokenizer brings transformers and torch, ~300k objects: ~0.25 s a pass). Garbage is collected first, so
    none of it is kept with them."""
    global _frozen_gateways
    with _frozen_lock:
        gc.collect()
        gc.freeze()
        _frozen_gateways += 1


def _thaw_startup() -> None:
    global _frozen_gateways
    with _frozen_lock:
        _frozen_gateways -= 1
        if _frozen_gateways == 0:
            gc.unfreeze()


def create_gateway_app(settings: GatewayConfig, *, emitter: Emitter | None = None) -> FastAPI:
    """The gateway app. ``emitter`` replaces the Kafka+spool emitter (tests); the app starts and closes it,
    and applies the configured redaction rules to it.

    Raises ``KeyConfigError`` when no API keys are configured (and anonymous use is off),
    ``ValueError`` for an upstream URL that is not http(s) (``RedactionConfigError``, a
    ``ValueError``, for an unusable rules file), ``SpoolLocked`` when another process uses
    the spool folder.
    """
    keys = KeyRing.load(
        env_value=settings.gateway_keys, file=settings.gateway_keys_file, allow_anonymous=settings.allow_anonymous
    )
    pool = make_pool(
        settings.upstream_url, api_key=settings.upstream_api_key,
        timeout_s=settings.upstream_timeout_s, connect_timeout_s=settings.upstream_connect_timeout_s,
    )
    retokenizer = Retokenizer(settings.tokenizer) if settings.tokenizer else None
    history = SessionStore(max_bytes=settings.history_max_bytes, ttl_s=settings.session_ttl_s) \
        if settings.prefix_references else None
    redactor = load_redactor(settings.redaction_rules)
    recorder = Recorder(policy_version=settings.policy_version, retokenizer=retokenizer,
                        prefix_references=settings.prefix_references, history=history, redactor=redactor)
    sessions = _token_sessions(settings, retokenizer)
    if emitter is None:
        emitter = build_emitter(settings, redactor=redactor)  # last: it opens (and locks) the spool
    else:
        emitter.redactor = redactor
    metrics = GatewayMetrics(emitter)
    if sessions is not None:
        metrics.watch_sessions(sessions.store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        proxy = ProxyService(
            upstream=Upstream(pool, retries=settings.upstream_retries), emitter=emitter, recorder=recorder,
            metrics=metrics,
            idempotency=IdempotencyCache(max_entries=settings.idempotency_entries, ttl_s=settings.idempotency_ttl_s),
            request_token_ids=settings.request_token_ids, sessions=sessions,
        )
        app.state.services = Services(
            proxy=proxy, emitter=emitter, metrics=metrics, keys=keys, max_body_bytes=settings.max_body_bytes
        )
        emitter.start()
        _freeze_startup()
        log.info("gateway up upstream=%s topic=%s spool=%s redaction_rules=%d", settings.upstream_url, settings.topic,
                 settings.spool_dir, len(redactor.rules) if redactor else 0)
        try:
            yield
        finally:
            _thaw_startup()
            await pool.aclose()
            emitter.close()
            log.info("gateway stopped produced=%d spooled=%d dropped=%d", emitter.produced, emitter.spooled, emitter.dropped)

    app = FastAPI(title="trajlake gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> Response:
        return Response(exc.body(), status_code=exc.status, media_type="application/json")

    @app.exception_handler(HTTPException)
    async def routing_error(request: Request, exc: HTTPException) -> Response:
        error = for_http_status(exc.status_code, method=request.method, path=request.url.path)
        return Response(error.body(), status_code=error.status, media_type="application/json", headers=exc.headers)

    for module in (completions, models, events, otlp, health):
        app.include_router(module.router)
    return app
