"""``POST /v1/chat/completions`` and ``POST /v1/completions`` (also under the rollout prefixes)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from ingest.gateway.bodies import completion_request, read_limited
from ingest.gateway.errors import GatewayError
from ingest.gateway.identity import call_identity, rollout_identity
from ingest.gateway.responses import to_response
from ingest.gateway.services import PATH_PREFIXES, Services, ServicesDep, TenantDep
from ingest.gateway.tokens import Kind

router = APIRouter()


async def _complete(kind: Kind, request: Request, services: Services, tenant: str) -> Response:
    started = time.perf_counter()
    status = 500
    try:
        raw = await read_limited(
            request.stream(), content_length=request.headers.get("content-length"), limit=services.max_body_bytes
        )
        body = completion_request(raw, kind)
        call = call_identity(tenant=tenant, headers=request.headers, kind=kind, body=body)
        rollout = rollout_identity(
            call_id=call.call_id, path=request.path_params, headers=request.headers, query=request.query_params
        )
        response = to_response(await services.proxy.complete(kind, body, tenant=tenant, rollout=rollout, call=call))
        status = response.status_code
        return response
    except GatewayError as exc:
        status = exc.status
        raise
    finally:
        services.metrics.observe(kind, status, time.perf_counter() - started)


async def chat_completions(request: Request, services: ServicesDep, tenant: TenantDep) -> Response:
    """OpenAI chat completions, proxied and recorded."""
    return await _complete("chat", request, services, tenant)


async def completions(request: Request, services: ServicesDep, tenant: TenantDep) -> Response:
    """OpenAI text completions, proxied and recorded."""
    return await _complete("completions", request, services, tenant)


for _prefix in PATH_PREFIXES:
    router.add_api_route(f"{_prefix}/v1/chat/completions", chat_completions, methods=["POST"])
    router.add_api_route(f"{_prefix}/v1/completions", completions, methods=["POST"])
