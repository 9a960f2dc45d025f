"""The query API: read-only SQL over a tenant's rows, rollouts, datasets and lineage (FastAPI).

Routes (all but ``/healthz``, ``/metrics`` and the viewer's pages need ``Authorization: Bearer KEY`` or
``X-Api-Key: KEY``; the key's tenant decides what is visible):

* ``POST /v1/sql`` ``{sql, limit, offset}`` -> ``{columns, rows, row_count, truncated, limit, offset,
  next_offset}``: one SELECT over the tenant's views (``store.tenant_sql``); pages by limit/offset
  (stable when the query has ORDER BY), ``limit`` capped by ``max_page_rows`` and a page cut short past
  ``max_result_bytes`` (``truncated`` and ``next_offset`` say where to go on).
* ``GET /v1/sql/views``: the views and columns the tenant can query.
* ``GET /v1/rollouts?task_id=&harness=&status=&limit=&offset=``, ``GET /v1/rollouts/{id}``.
* ``GET /v1/datasets``, ``GET /v1/datasets/{name}?version=``: versions built for the tenant alone
  (``visibility``).
* ``GET /v1/lineage/{id}?limit=&offset=``: ``pipelines.lineage.trace`` cut down to the tenant.
* ``/viewer`` pages (static shells, no data) and the JSON they read under ``/v1/viewer`` (``api.viewer``).
* ``GET /metrics``: Prometheus metrics (no lake data).

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code", "hint"}}``: 400 query_refused /
query_error / query_timeout / invalid_json, 401 unauthorized, 404 not_found (also for anything of another
tenant, and unknown routes), 405 method_not_allowed, 413 body_too_large, 422 invalid_request, 429 busy (all
slots, or the tenant's share), 431 headers_too_large, 503 unavailable (no query worker).

Tenant SQL runs in worker processes with hard time and memory limits (``workers``); ``/docs`` and
``/redoc`` are off (they load assets from a CDN), ``/openapi.json`` is served.

``app`` assembles (the lifespan owns the service and the token decoder), ``routes/`` holds one router per
resource, ``deps`` the dependencies, ``models`` the bodies, ``errors`` the error shape and its handlers,
``limits`` and ``metrics`` the ASGI middleware; ``services``, ``visibility``, ``workers`` and ``viewer/``
do the work without FastAPI.

>>> from api import create_query_app  # doctest: +SKIP
>>> app = create_query_app(settings, keys=key_ring)  # doctest: +SKIP
"""

from __future__ import annotations

from schemas.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {"api.app": ("create_query_app",), "api.deps": ("TenantKeys",),
                                                "api.config": ("QueryApiConfig",), "api.services": ("QueryService",)})
