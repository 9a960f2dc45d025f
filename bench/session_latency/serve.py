"""The two servers of the session latency benchmark, each run as its own process by ``run.py``.

``engine``: a minimal engine that costs ~nothing: canned answers (one Hermes
tool call and its token ids) as prebuilt bytes, a bare ASGI app (no
framework). Chat calls get the prompt ids of their conversation, rendered
once per conversation length (the bench's rollouts all send the same turns);
token-id completion calls echo their prompt (one answer kept per prompt). So
both arms meet an engine that neither renders nor tokenizes and the bench
measures the gateway. ``gateway``: the real gateway app (``ingest.gateway``)
with token sessions on or off, its events encoded and dropped (no Kafka: the
bench measures the planner, not the broker).

    python bench/session_latency/serve.py engine PORT MODEL_DIR
    python bench/session_latency/serve.py gateway PORT MODEL_DIR UPSTREAM_URL SPOOL_DIR on|off
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

KEY = "sk-bench"
ANSWER = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1 + 1"}'}}
COMPACT = (",", ":")
"""Answers are compact JSON, as vLLM (starlette's JSONResponse) and SGLang (orjson) write them."""
MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]}).encode()

Asgi = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def create_engine(model_dir: Path) -> Asgi:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampled = [*tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]
    chat_answers: dict[int, bytes] = {}
    completion_answers: dict[tuple[int, ...], bytes] = {}

    def head(kind: str, prompt_ids: list[int]) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": kind, "created": int(time.time()), "model": "bench",
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(sampled),
                          "total_tokens": len(prompt_ids) + len(sampled)}}

    def chat(body: dict[str, Any]) -> bytes:
        found = chat_answers.get(len(body["messages"]))
        if found is None:
            prompt = list(tokenizer.apply_chat_template(body["messages"], tools=body.get("tools"), tokenize=True,
                                                        add_generation_prompt=True, return_dict=False))
            found = chat_answers[len(body["messages"])] = json.dumps({
                **head("chat.completion", prompt), "prompt_token_ids": prompt, "choices": [{
                    "index": 0, "finish_reason": "tool_calls", "token_ids": sampled, "logprobs": None,
                    "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}]},
                separators=COMPACT).encode()
        return found

    def completion(body: dict[str, Any]) -> bytes:
        prompt = tuple(body["prompt"])
        found = completion_answers.get(prompt)
        if found is None:
            found = completion_answers[prompt] = json.dumps({
                **head("text_completion", body["prompt"]), "choices": [{
                    "index": 0, "text": ANSWER, "finish_reason": "stop", "prompt_token_ids": body["prompt"],
                    "token_ids": sampled, "logprobs": None}]}, separators=COMPACT).encode()
        return found

    routes = {"/v1/chat/completions": chat, "/v1/completions": completion}

    async def app(scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        route = routes.get(scope["path"])
        status, body = (200, MODELS) if scope["path"] == "/v1/models" else (200, route(json.loads(raw))) if route \
            else (404, b'{"error": {"message": "not found"}}')
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return app


class DropSink:
    """Takes the gateway's encoded events and keeps nothing."""

    def send(self, records: Any) -> None:
        pass

    def close(self) -> None:
        pass


def create_gateway(model_dir: Path, upstream: str, spool_dir: Path, sessions: bool) -> Any:
    from ingest.gateway import create_gateway_app
    from ingest.gateway.emitter import Emitter
    from ingest.spool import Spool
    from trajlake.commands.gateway import GatewaySettings

    settings = GatewaySettings(upstream_url=upstream, gateway_keys=f"{KEY}=bench", spool_dir=spool_dir,
                               bootstrap_servers="127.0.0.1:1", tokenizer=str(model_dir), token_sessions=sessions)
    return create_gateway_app(settings, emitter=Emitter(DropSink(), Spool(spool_dir, max_bytes=1 << 30)))


def main(argv: list[str]) -> None:
    import uvicorn

    role, port, model_dir = argv[0], int(argv[1]), Path(argv[2])
    if role == "engine":
        uvicorn.run(create_engine(model_dir), host="127.0.0.1", port=port, access_log=False, log_level="warning")
        return
    from ingest.gateway.server import GatewayHttpProtocol

    app = create_gateway(model_dir, argv[3], Path(argv[4]), argv[5] == "on")
    uvicorn.run(app, host="127.0.0.1", port=port, access_log=False, log_level="warning", http=GatewayHttpProtocol)


if __name__ == "__main__":
    main(sys.argv[1:])
