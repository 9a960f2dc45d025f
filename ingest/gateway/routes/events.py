"""``POST /v1/events``: batch ingestion of harness events, one result per event."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from ingest.gateway.batch import ingest_batch
from ingest.gateway.bodies import read_limited
from ingest.gateway.services import ServicesDep, TenantDep

router = APIRouter()


@router.post("/v1/events")
async def post_events(request: Request, services: ServicesDep, tenant: TenantDep) -> dict:
    """Validate and record a batch of events; answers once the accepted ones are durable."""
    raw = await read_limited(
        request.stream(), content_length=request.headers.get("content-length"), limit=services.max_body_bytes
    )
    result = await ingest_batch(raw, tenant=tenant, emitter=services.emitter)
    services.metrics.batch_events.labels("accepted").inc(result.accepted)
    services.metrics.batch_events.labels("rejected").inc(result.rejected)
    return asdict(result)
