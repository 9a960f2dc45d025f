"""``POST /v1/traces``: OTLP/HTTP trace export, GenAI spans recorded as events (``ingest.otlp``).

Point any OpenTelemetry OTLP/HTTP exporter here (protobuf or JSON, gzip or
not) with a gateway key in its headers; the key's tenant owns the events. The
answer is an ``ExportTraceServiceResponse``, sent once the events are durable;
spans that could not be recorded are counted in its ``partial_success`` with
their reasons (as ``POST /v1/events`` answers a rejected event), logged, and
sent on for the ingester to quarantine with their reasons (``ingest.rejected``).
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request, Response
from prometheus_client import Counter

from ingest.gateway.batch import emit_durably
from ingest.gateway.bodies import read_limited
from ingest.gateway.errors import BadRequest, EventsRefused, GatewayError
from ingest.gateway.identity import UNATTACHED_TASK
from ingest.gateway.services import Services, ServicesDep, TenantDep
from ingest.otlp import OtlpBodyError, read_export_request, span_events
from ingest.otlp.wire import UnsupportedEncoding, export_response, media_type

log = logging.getLogger(__name__)
router = APIRouter()
_REASONS_SHOWN = 5


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


def _spans_counter(request: Request, services: Services) -> Counter:
    """``trajlake_gateway_otlp_spans_total{result}``, registered once per app on the gateway's registry."""
    counter = getattr(request.app.state, "otlp_spans", None)
    if counter is None:
        counter = Counter("trajlake_gateway_otlp_spans", "OTLP spans received, by result (accepted, rejected, "
                          "ignored: not a GenAI span)", ["result"], registry=services.metrics.registry)
        request.app.state.otlp_spans = counter
    return counter


@router.post("/v1/traces")
async def post_traces(request: Request, services: ServicesDep, tenant: TenantDep) -> Response:
    """Record the GenAI spans of one OTLP export."""
    started, status = time.perf_counter(), 500
    try:
        kind = media_type(request.headers.get("content-type"))
        raw = await read_limited(
            request.stream(), content_length=request.headers.get("content-length"), limit=services.max_body_bytes
        )
        spans = read_export_request(raw, content_type=kind, content_encoding=request.headers.get("content-encoding"),
                                    max_bytes=services.max_body_bytes)
        if services.emitter.spool_full:
            raise EventsRefused("the gateway's event spool is full (broker unreachable for long): retry later")
        outcomes = span_events(spans, tenant=tenant, default_task=UNATTACHED_TASK)
        quarantine = [o.quarantine for o in outcomes if o.quarantine is not None]
        await emit_durably([e for o in outcomes for e in o.events] + quarantine, emitter=services.emitter)
        rejected = [f"span {o.span.span_id} ({o.span.name}): {o.rejected}" for o in outcomes if o.rejected]
        counter = _spans_counter(request, services)
        for result, n in (("accepted", sum(bool(o.events) for o in outcomes)), ("rejected", len(rejected)),
                          ("ignored", sum(o.ignored for o in outcomes))):
            counter.labels(result).inc(n)
        for reason in rejected:
            log.warning("otlp span rejected tenant=%s %s", tenant, reason)
        message = "; ".join(rejected[:_REASONS_SHOWN]) + (f" (and {len(rejected) - _REASONS_SHOWN} more)"
                                                          if len(rejected) > _REASONS_SHOWN else "")
        status = 200
        return Response(export_response(kind, rejected=len(rejected), message=message), media_type=kind)
    except UnsupportedEncoding as exc:
        status = 415
        raise UnsupportedMediaType(str(exc)) from None
    except OtlpBodyError as exc:
        status = 400
        raise BadRequest(str(exc)) from None
    except GatewayError as exc:
        status = exc.status
        raise
    finally:
        services.metrics.observe("otlp", status, time.perf_counter() - started)
