"""The collaborators routes reach through ``Annotated`` dependencies; built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ingest.gateway.auth import KeyRing, bearer_token
from ingest.gateway.emitter import Emitter
from ingest.gateway.errors import Unauthorized
from ingest.gateway.metrics import GatewayMetrics
from ingest.gateway.proxy import ProxyService

PATH_PREFIXES = ("", "/rollouts/{rollout_id}", "/tasks/{task_id}/rollouts/{rollout_id}")
"""Every OpenAI route is also served under these prefixes (rollout identity in the base URL)."""


@dataclass(frozen=True)
class Services:
    proxy: ProxyService
    emitter: Emitter
    metrics: GatewayMetrics
    keys: KeyRing
    max_body_bytes: int


# Dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a
# worker thread, which cost four thread hops per request (measured: the gateway's top cost).
async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


async def require_tenant(request: Request, services: ServicesDep) -> str:
    """The tenant of the presented API key; 401 when it is missing or unknown."""
    key = bearer_token(request.headers.get("authorization"), request.headers.get("x-api-key"))
    tenant = services.keys.tenant(key)
    if tenant is None:
        problem = "no API key" if key is None else "an unknown API key"
        services.metrics.refused(request.url.path, Unauthorized.status)
        raise Unauthorized(f"{problem} was presented: send 'Authorization: Bearer <key>' with a gateway key")
    return tenant


TenantDep = Annotated[str, Depends(require_tenant)]
