"""How ``fixtures/recorded_<library>.json`` were made (not run by the tests).

Runs the official ``openai`` client, instrumented by one real instrumentation
library, against the gateway tests' fake engine (served over loopback HTTP)
for a short exchange: a user asks for the weather with a ``get_weather`` tool
offered, the engine answers with a tool call, the script answers the tool and
asks again, the engine answers with text. Both chat calls run inside one
plain application span ``weather-agent`` (no GenAI attributes), so the
recorded calls carry a parent span id. The spans are captured with the SDK's
``InMemorySpanExporter`` and written as an OTLP/JSON
``ExportTraceServiceRequest`` (the OTLP proto encoder + ``json_format``, with
trace and span ids as hex, as OTLP/HTTP JSON wants them). Message content
capture is on for each library.

Recorded with openai 3.51.0, opentelemetry-sdk 1.45.2, and:

- ``openllmetry``: opentelemetry-instrumentation-openai 0.62.4
  (opentelemetry-semantic-conventions-ai 0.5.1), ``TRACELOOP_TRACE_CONTENT=true``;
- ``openinference``: openinference-instrumentation-openai 0.1.66
  (openinference-instrumentation 0.1.72), content is captured by default;

both with opentelemetry-instrumentation 0.66b2, installed next to the project
(``pip install --no-deps --target DIR ...`` and ``PYTHONPATH=DIR``), one
library per run, from the repository root::

    PYTHONPATH=DIR python tests/ingest/otlp/record_fixtures.py openllmetry
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
LIBRARIES = ("openllmetry", "openinference")
CONTENT_ENV = {
    "openllmetry": {"TRACELOOP_TRACE_CONTENT": "true"},
    "openinference": {},
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def instrument(library: str, provider) -> None:
    if library == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    else:
        from openinference.instrumentation.openai import OpenAIInstrumentor
    OpenAIInstrumentor().instrument(tracer_provider=provider)


def exchange(base_url: str, tracer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="sk-recording")
    messages = [{"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "what is the weather in Paris?"}]
    with tracer.start_as_current_span("weather-agent"):
        first = client.chat.completions.create(model="fake-weather", messages=messages, tools=TOOLS,
                                               max_tokens=8, temperature=0.0)
        call = first.choices[0].message.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
        client.chat.completions.create(model="fake-weather", messages=messages, tools=TOOLS, max_tokens=8,
                                       temperature=0.0)


def hex_ids(node):
    """OTLP/HTTP JSON carries trace and span ids as hex; protobuf's JSON mapping gives base64."""
    if isinstance(node, dict):
        return {k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and v else hex_ids(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [hex_ids(v) for v in node]
    return node


def main(library: str) -> None:
    os.environ.update(CONTENT_ENV[library])
    sys.path.insert(0, str(HERE.parent / "gateway"))
    from gateway_fake_engine import create_fake_engine
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from trajlake.background import serve_in_thread

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"weather-agent-{library}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(library, provider)
    with serve_in_thread(create_fake_engine()) as url:
        exchange(f"{url}/v1", provider.get_tracer("weather-agent"))
    body = hex_ids(json_format.MessageToDict(encode_spans(exporter.get_finished_spans())))
    out = HERE / "fixtures" / f"recorded_{library}.json"
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {len(exporter.get_finished_spans())} spans to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in LIBRARIES:
        sys.exit(f"usage: record_fixtures.py {{{','.join(LIBRARIES)}}}")
    main(sys.argv[1])
