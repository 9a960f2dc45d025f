"""An OpenAI-compatible engine that samples non-canonical token splits, for token session tests and bench.

A real engine may sample any valid token sequence, not the one the tokenizer
would produce for the same text: re-rendering a chat history from text then
gives other ids than the ones sampled. This engine makes that happen on every
answer: it "samples" a deterministic reply (a Hermes tool call while the
prompt offers tools and the last turn does not say ``final``, else a short
text) and splits about every third token into its byte-level characters, then
ends the turn with the tokenizer's end-of-turn token. It speaks vLLM's
token-id format on ``/v1/chat/completions`` (prompt rendered with the chat
template) and ``/v1/completions`` (text or token-id prompt), streaming and
not, and keeps every answer's prompt and sampled ids in ``app.state.sampled``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

LOGPROB = -0.5
"""Every sampled token's logprob."""


class SplitSampler:
    """The deterministic, non-canonical "model" of the engine."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def reply(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last_turn = text[text.rfind("<|im_start|>", 0, max(0, len(text) - 25)):]
        step = text.count("<tool_response>")
        if "<tools>" in text and "final" not in last_turn:
            arguments = json.dumps({"expression": f"{step} + {len(prompt_ids) % 97}"})
            return f'Step {step}: let me compute.\n<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
        return f"The answer after {step} steps is {len(prompt_ids) % 1000}, done."

    def sample(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], str]:
        """(sampled ids, finish reason): the reply's tokens, every third split into characters, then end of turn."""
        rng = random.Random(len(prompt_ids))
        ids: list[int] = []
        for piece in self.tokenizer.tokenize(self.reply(prompt_ids)):
            if len(piece) > 1 and rng.random() < 0.35:
                ids.extend(self.tokenizer.convert_tokens_to_ids(list(piece)))
            else:
                ids.append(self.tokenizer.convert_tokens_to_ids(piece))
        ids.append(self.end_id)
        if len(ids) > max_tokens:
            return ids[:max_tokens], "length"
        return ids, "stop"


def create_split_engine(model_dir: Path, *, served_name: str = "split") -> FastAPI:
    """The engine app serving the tokenizer (and chat template) in ``model_dir``."""
    from transformers import AutoTokenizer

    from schemas.tool_parsers import PARSERS

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampler = SplitSampler(tokenizer)
    parser = PARSERS["hermes"]
    app = FastAPI()
    app.state.sampled = []

    def texts(ids: list[int]) -> list[str]:
        """Per-token text deltas (ASCII replies: every prefix decodes cleanly)."""
        out, before = [], ""
        for i in range(1, len(ids) + 1):
            now = tokenizer.decode(ids[:i], skip_special_tokens=True)
            out.append(now[len(before):])
            before = now
        return out

    def run(body: dict[str, Any], prompt_ids: list[int]) -> tuple[list[int], str, list[str]]:
        ids, finish = sampler.sample(prompt_ids, int(body.get("max_completion_tokens") or body.get("max_tokens") or 256))
        app.state.sampled.append({"prompt_token_ids": prompt_ids, "token_ids": ids})
        return ids, finish, texts(ids)

    def usage(prompt_ids: list[int], ids: list[int]) -> dict:
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids)}

    def head(kind: str) -> dict:
        return {"id": f"cmpl-{len(app.state.sampled)}", "object": kind, "created": int(time.time()),
                "model": served_name}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": served_name, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        prompt_ids = list(tokenizer.apply_chat_template(body["messages"], tools=body.get("tools") or None,
                                                        add_generation_prompt=True, tokenize=True, return_dict=False))
        ids, finish, deltas = run(body, prompt_ids)
        parses = bool(body.get("tools")) and body.get("tool_choice") != "none"
        content, calls = parser.parse("".join(deltas)) if parses else ("".join(deltas), [])
        finish = "tool_calls" if calls and finish == "stop" else finish
        lp = [{"token": tokenizer.convert_ids_to_tokens(i), "logprob": LOGPROB, "bytes": None, "top_logprobs": []}
              for i in ids]
        if not body.get("stream"):
            return JSONResponse({**head("chat.completion"), "prompt_token_ids": prompt_ids, "usage": usage(prompt_ids, ids),
                                 "choices": [{"index": 0, "finish_reason": finish, "token_ids": ids,
                                              "logprobs": {"content": lp},
                                              "message": {"role": "assistant", "content": content or None,
                                                          "tool_calls": calls}}]})
        chunks = [{**head("chat.completion.chunk"), "prompt_token_ids": prompt_ids,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
        stream = parser.stream() if parses else None
        for n, (i, delta) in enumerate(zip(ids, deltas, strict=True)):
            choice: dict = {"index": 0, "token_ids": [i], "logprobs": {"content": [lp[n]]}, "finish_reason": None,
                            "delta": {"content": stream.push(delta) if stream else delta}}
            if n == len(ids) - 1:
                rest, calls = stream.finish() if stream else ("", [])
                choice["delta"]["content"] += rest
                if calls:
                    choice["delta"]["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                choice["finish_reason"] = finish
            chunks.append({**head("chat.completion.chunk"), "choices": [choice]})
        return _sse(chunks, body, head("chat.completion.chunk"), usage(prompt_ids, ids))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt = body["prompt"]
        prompt_ids = list(prompt) if isinstance(prompt, list) else tokenizer.encode(prompt, add_special_tokens=False)
        ids, finish, deltas = run(body, prompt_ids)
        tokens = tokenizer.convert_ids_to_tokens(ids)

        def logprobs(span: slice) -> dict:
            return {"tokens": tokens[span], "token_logprobs": [LOGPROB] * len(tokens[span]),
                    "top_logprobs": [{t: LOGPROB} for t in tokens[span]], "text_offset": [0] * len(tokens[span])}

        if not body.get("stream"):
            return JSONResponse({**head("text_completion"), "usage": usage(prompt_ids, ids), "choices": [{
                "index": 0, "text": "".join(deltas), "finish_reason": finish, "prompt_token_ids": prompt_ids,
                "token_ids": ids, "logprobs": logprobs(slice(None))}]})
        chunks = []
        for n, (i, delta) in enumerate(zip(ids, deltas, strict=True)):
            choice = {"index": 0, "text": delta, "token_ids": [i], "logprobs": logprobs(slice(n, n + 1)),
                      "finish_reason": finish if n == len(ids) - 1 else None}
            if n == 0:
                choice["prompt_token_ids"] = prompt_ids
            chunks.append({**head("text_completion"), "choices": [choice]})
        return _sse(chunks, body, head("text_completion"), usage(prompt_ids, ids))

    return app


def _sse(chunks: list[dict], body: dict, head: dict, usage: dict) -> StreamingResponse:
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks = [*chunks, {**head, "choices": [], "usage": usage}]
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]

    async def events():
        for line in lines:
            yield line

    return StreamingResponse(events(), media_type="text/event-stream")
