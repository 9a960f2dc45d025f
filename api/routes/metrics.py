"""``GET /metrics``: the Prometheus registry (no key: no lake data in it)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import generate_latest

from api.deps import Metrics
from api.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(registry: Metrics) -> Response:
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE)
