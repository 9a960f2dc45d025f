"""``/healthz`` (the process runs), ``/readyz`` (broker and spool), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from ingest.gateway.services import ServicesDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    """200 while events can be kept (Kafka or spool); 503 when the spool is full.

    A down broker alone does not make the gateway unready: calls are still
    served and events spooled; the body says so.
    """
    emitter = services.emitter
    spool = emitter.spool
    body = {
        "status": "spool_full" if emitter.spool_full else ("ok" if emitter.broker_up else "degraded"),
        "broker": "up" if emitter.broker_up else "unreachable",
        "spool": {"events": spool.depth_records, "bytes": spool.depth_bytes, "max_bytes": spool.max_bytes},
        "pending": emitter.pending,
    }
    return JSONResponse(body, status_code=503 if emitter.spool_full else 200)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
