"""OTLP/HTTP bodies: protobuf and JSON read alike; gzip; refusals that say what to fix."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ingest.otlp.wire import JSON, PROTOBUF, OtlpBodyError, UnsupportedEncoding, read_export_request

FIXTURES = Path(__file__).parent / "fixtures"
LIMIT = 1 << 20


def as_protobuf(json_body: bytes) -> bytes:
    """The same request in the binary encoding (what the SDK's exporter sends)."""
    def b64(node):
        if isinstance(node, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k.endswith("Id") else b64(v)
                    for k, v in node.items()}
        return [b64(v) for v in node] if isinstance(node, list) else node

    request = ExportTraceServiceRequest()
    json_format.ParseDict(b64(json.loads(json_body)), request)
    return request.SerializeToString()


@pytest.mark.parametrize("fixture", ["semconv_genai.json", "openllmetry.json", "openinference.json"])
def test_protobuf_json_and_gzip_read_the_same_spans(fixture):
    body = (FIXTURES / fixture).read_bytes()
    from_json = read_export_request(body, content_type="application/json; charset=utf-8", content_encoding=None,
                                    max_bytes=LIMIT)
    from_proto = read_export_request(as_protobuf(body), content_type=PROTOBUF, content_encoding="identity",
                                     max_bytes=LIMIT)
    from_gzip = read_export_request(gzip.compress(body), content_type=JSON, content_encoding="gzip", max_bytes=LIMIT)
    assert from_json == from_proto == from_gzip and len(from_json) >= 4
    first = from_json[0]
    assert len(first.trace_id) == 32 and len(first.span_id) == 16 and first.resource["service.name"]


def test_refusals():
    with pytest.raises(UnsupportedEncoding, match="application/x-protobuf"):
        read_export_request(b"", content_type="text/plain", content_encoding=None, max_bytes=LIMIT)
    with pytest.raises(UnsupportedEncoding, match="gzip"):
        read_export_request(b"", content_type=JSON, content_encoding="br", max_bytes=LIMIT)
    with pytest.raises(OtlpBodyError, match="not hex"):
        read_export_request(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
                            content_type=JSON, content_encoding=None, max_bytes=LIMIT)
    with pytest.raises(OtlpBodyError, match="byte limit"):  # a small gzip that inflates past the limit
        read_export_request(gzip.compress(b" " * (LIMIT + 10)), content_type=JSON, content_encoding="gzip",
                            max_bytes=LIMIT)
    with pytest.raises(OtlpBodyError, match="ExportTraceServiceRequest"):
        read_export_request(b"[1, 2]", content_type=JSON, content_encoding=None, max_bytes=LIMIT)
    for literal in (b"NaN", b"-Infinity", b"1e999"):  # not JSON: the body is refused, naming the place
        with pytest.raises(OtlpBodyError, match=r"resourceSpans\.0\.x: NaN and Infinity are not JSON"):
            read_export_request(b'{"resourceSpans": [{"x": %s}]}' % literal, content_type=JSON,
                                content_encoding=None, max_bytes=LIMIT)
