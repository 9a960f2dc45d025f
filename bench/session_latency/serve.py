"""The two servers of the session latency benchmark, each run as its own process by ``run.py``.

``engine``: a fast fake engine with one canned answer (a Hermes tool call and
its token ids): chat calls get the prompt ids of the conversation, rendered
through the chat template and tokenized on every call as a real engine does;
completion calls echo the token-id prompt. So without sessions the engine
renders, with sessions it does not: the bench measures both processes. ``gateway``: the real gateway
app (``ingest.gateway``) with token sessions on or off, its events encoded
and dropped (no Kafka: the bench measures the planner, not the broker).

    python bench/session_latency/serve.py engine PORT MODEL_DIR
    python bench/session_latency/serve.py gateway PORT MODEL_DIR UPSTREAM_URL SPOOL_DIR on|off
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

KEY = "sk-bench"
ANSWER = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1 + 1"}'}}


def create_engine(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampled = [*tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]
    app = FastAPI()

    def head(kind: str, prompt_ids: list[int]) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": kind, "created": int(time.time()), "model": "bench",
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(sampled),
                          "total_tokens": len(prompt_ids) + len(sampled)}}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        prompt = list(tokenizer.apply_chat_template(body["messages"], tools=body.get("tools"), tokenize=True,
                                                    add_generation_prompt=True, return_dict=False))
        return {**head("chat.completion", prompt), "prompt_token_ids": prompt, "choices": [{
            "index": 0, "finish_reason": "tool_calls", "token_ids": sampled, "logprobs": None,
            "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {**head("text_completion", body["prompt"]), "choices": [{
            "index": 0, "text": ANSWER, "finish_reason": "stop", "prompt_token_ids": body["prompt"],
            "token_ids": sampled, "logprobs": None}]}

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
