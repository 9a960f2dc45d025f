"""The app factory: assembles middleware, error handlers, routers and the viewer's static files;
the lifespan owns the service (and its query workers) and the viewer's token decoder.

Routes reach them through ``deps`` (``Tenant``, ``Service``, ``Decoder``, ``Metrics``); a new resource
is a module under ``routes/`` appended to ``ROUTERS``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.config import QueryApiConfig
from api.deps import TenantKeys
from api.errors import install_error_handlers
from api.limits import BodyLimit, HeaderLimit
from api.metrics import MetricsMiddleware, QueryApiMetrics
from api.routes import datasets, health, lineage, metrics, rollouts, sql, viewer
from api.services import PageLimits, QueryService
from api.viewer import STATIC_DIR
from api.viewer.tokens import TokenDecoder
from api.workers import WorkerLimits
from store.lake import Lake
from store.tenant_sql import SandboxLimits

log = logging.getLogger(__name__)

ROUTERS = (health.router, sql.router, rollouts.router, datasets.router, lineage.router, viewer.router,
           metrics.router)


def build_service(settings: QueryApiConfig) -> QueryService:
    """The service the routes call, from the settings."""
    limits = SandboxLimits(timeout_s=settings.query_timeout_s, max_sql_chars=settings.max_sql_chars,
                           memory_limit=settings.query_memory_limit, threads=settings.query_threads,
                           max_result_bytes=settings.max_result_bytes)
    return QueryService(
        Lake(settings.lake), limits=limits,
        pages=PageLimits(default=settings.default_page_rows, cap=settings.max_page_rows),
        snapshot_ttl_s=settings.snapshot_ttl_s, max_concurrent=settings.max_concurrent_queries,
        per_tenant=settings.max_queries_per_tenant,
        worker_limits=WorkerLimits(memory_bytes=settings.query_worker_memory_mb << 20),
    )


def create_query_app(settings: QueryApiConfig, *, keys: TenantKeys) -> FastAPI:
    """The query API. ``keys`` maps API keys to tenants (``ingest.gateway.auth.KeyRing`` fits).

    >>> app = create_query_app(settings, keys=KeyRing({"sk-a": "acme"}))  # doctest: +SKIP
    """
    if settings.default_page_rows > settings.max_page_rows:
        raise ValueError(f"default_page_rows ({settings.default_page_rows}) is above max_page_rows "
                         f"({settings.max_page_rows}): lower the default or raise the cap")
    per_tenant = settings.max_queries_per_tenant
    if per_tenant is not None and per_tenant > settings.max_concurrent_queries:
        raise ValueError(f"max_queries_per_tenant ({per_tenant}) is above max_concurrent_queries "
                         f"({settings.max_concurrent_queries}): one tenant could take every slot")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = build_service(settings)
        app.state.keys = keys
        folder = settings.viewer_tokenizer  # optional: without it the token view shows ids
        app.state.token_decoder = TokenDecoder(Path(folder) if folder else None)
        # serve once a query can run: /healthz answers only then
        workers = app.state.service.workers
        if not await asyncio.to_thread(workers.wait_ready, workers.worker_limits.start_timeout_s):
            log.error("query_api no query worker started; queries answer 503 until one does")
        log.info("query_api up lake=%s timeout_s=%s max_page_rows=%d", settings.lake, settings.query_timeout_s,
                 settings.max_page_rows)
        try:
            yield
        finally:
            app.state.service.close()
        log.info("query_api stopped")

    app = FastAPI(title="trajlake query API", lifespan=lifespan, docs_url=None, redoc_url=None,  # both load a CDN
                  description="Read-only SQL over your rows of the lake, rollouts, datasets and lineage.")
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HeaderLimit, max_bytes=settings.max_header_bytes)
    app.state.metrics = QueryApiMetrics()
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # last: outermost, it times everything
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/viewer/static", StaticFiles(directory=STATIC_DIR), name="viewer-static")
    return app
