"""OTLP/HTTP trace export bodies (``opentelemetry-proto``) <-> plain ``Span`` records.

Both encodings of the OTLP/HTTP spec: ``application/x-protobuf`` and
``application/json`` (whose trace and span ids are hex strings, not the
base64 that protobuf's JSON mapping expects), optionally
``Content-Encoding: gzip``. The answer is an ``ExportTraceServiceResponse`` in
the request's encoding; rejected spans are reported in its ``partial_success``.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from schemas.versions import loads_finite

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


class OtlpBodyError(ValueError):
    """The body is not an OTLP trace export request; says what to fix."""


class UnsupportedEncoding(OtlpBodyError):
    """A content type or content encoding that OTLP/HTTP does not define."""


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """One span with its attributes as Python values (arrays as lists, kvlists as dicts)."""

    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits."""
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    error: str | None = None
    """The status message (or ``"error"``) when the span's status is ERROR, else None."""


def media_type(content_type: str | None) -> str:
    """``application/x-protobuf`` or ``application/json``; raises ``UnsupportedEncoding`` otherwise."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in (PROTOBUF, JSON):
        return kind
    raise UnsupportedEncoding(
        f"Content-Type {content_type!r} is not OTLP/HTTP: send {PROTOBUF} or {JSON}"
    )


def read_export_request(
    raw: bytes, *, content_type: str | None, content_encoding: str | None, max_bytes: int
) -> list[Span]:
    """Every span of an ``ExportTraceServiceRequest`` body; raises ``OtlpBodyError``.

    ``max_bytes`` bounds the body after decompression too.
    """
    kind = media_type(content_type)
    body = _decompress(raw, content_encoding, max_bytes=max_bytes)
    request = ExportTraceServiceRequest()
    try:
        if kind == PROTOBUF:
            request.ParseFromString(body)
        else:
            json_format.ParseDict(_hex_ids_to_base64(loads_finite(body)), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, RecursionError) as exc:
        raise OtlpBodyError(f"body is not an OTLP ExportTraceServiceRequest ({kind}): {exc}") from None
    return [
        _span(span, resource)
        for resource_spans in request.resource_spans
        for resource in [_attributes(resource_spans.resource.attributes)]
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def export_response(kind: str, *, rejected: int, message: str) -> bytes:
    """The ``ExportTraceServiceResponse`` body in ``kind``'s encoding (partial success when ``rejected``)."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if kind == PROTOBUF:
        return response.SerializeToString()
    return json.dumps(json_format.MessageToDict(response)).encode()


def _decompress(raw: bytes, encoding: str | None, *, max_bytes: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return raw
    if encoding != "gzip":
        raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported: send gzip or none")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpBodyError(f"body is not valid gzip: {exc}") from None
    if len(body) > max_bytes:
        raise OtlpBodyError(f"decompressed body exceeds the gateway's {max_bytes}-byte limit: send smaller batches")
    return body


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping reads bytes as base64."""
    if isinstance(node, dict):
        return {
            k: _b64(v, k) if k in _ID_KEYS and isinstance(v, str) else _hex_ids_to_base64(v) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def _b64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        raise OtlpBodyError(f"{key} {value[:40]!r} is not hex (OTLP/JSON writes ids as hex strings)") from None


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return binascii.hexlify(v.bytes_value).decode()
    return getattr(v, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _span(span: Any, resource: dict[str, Any]) -> Span:
    error = None
    if span.status.code == Status.STATUS_CODE_ERROR:
        error = span.status.message or "error"
    return Span(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex() or None,
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        resource=resource,
        events=tuple(SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events),
        error=error,
    )
