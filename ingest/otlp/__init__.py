"""OTLP trace intake: OpenTelemetry GenAI spans -> trajlake events.

``wire`` reads an OTLP/HTTP export request (protobuf or JSON, gzip or not)
into plain ``Span`` records; ``genai`` turns each span that follows the GenAI
semantic conventions (or OpenLLMetry's or OpenInference's attributes) into
``llm.request``/``llm.response``/``tool.call``/``tool.result`` events. The
gateway's ``POST /v1/traces`` route ties them to its keys, tenancy and emitter.
"""

from ingest.otlp.genai import SpanOutcome, span_events
from ingest.otlp.wire import OtlpBodyError, Span, read_export_request, export_response

__all__ = ["OtlpBodyError", "Span", "SpanOutcome", "export_response", "read_export_request", "span_events"]
