"""``GET /v1/models``: the engine's list, passed through."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ingest.gateway.responses import to_response
from ingest.gateway.services import PATH_PREFIXES, ServicesDep, TenantDep

router = APIRouter()


async def list_models(services: ServicesDep, tenant: TenantDep) -> Response:
    """The upstream engine's models."""
    return to_response(await services.proxy.models())


for _prefix in PATH_PREFIXES:
    router.add_api_route(f"{_prefix}/v1/models", list_models, methods=["GET"])
