"""A small, real OpenAI-compatible engine for the gateway's tests and bench.

It speaks the vLLM token-id format (``return_token_ids``, logprobs, SSE with
per-chunk ``token_ids``) deterministically: the same request gives the same
answer (id and ``created`` included), so a client can compare answers from
the engine directly with answers through the gateway byte for byte.

"Tokens" are whitespace-separated words; a word's id is its crc32 mod 50,000.
Model names steer failures: ``fake-503`` always answers 503, ``fake-slow``
sleeps 3 s, ``fake-flaky-<n>`` answers 503 to the first n calls per prompt,
``fake-noids`` never returns token ids, ``fake-break`` drops the connection
after three streamed tokens, ``fake-slowstream`` streams a token per 0.2 s,
``fake-linger`` keeps a stream open 0.3 s after its ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

REPLY = "the quick brown fox jumps over the lazy dog again and again until the story ends here"
CREATED = 1_700_000_000


def token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % 50_000


def words_of(messages: list[dict[str, Any]] | None, prompt: Any) -> list[str]:
    if messages is not None:
        return [w for m in messages for w in str(m.get("content") or "").split()] + ["<assistant>"]
    return str(prompt).split()


def answer_words(body: dict[str, Any]) -> tuple[list[str], dict | None]:
    """The words the engine 'samples', and a tool call when tools were offered and asked for."""
    limit = body.get("max_tokens") or 16
    messages = body.get("messages") or []
    last = str(messages[-1].get("content") or "") if messages else ""
    tools = body.get("tools")
    if tools and "weather" in last:
        name = tools[0]["function"]["name"]
        call = {"name": name, "arguments": {"city": "Paris"}}
        return ["<tool_call>", json.dumps(call, separators=(",", ":")), "</tool_call>"], call
    return REPLY.split()[:limit], None


def request_id(body: dict[str, Any]) -> str:
    core = json.dumps([body.get("model"), body.get("messages"), body.get("prompt")], sort_keys=True)
    return hashlib.sha1(core.encode()).hexdigest()[:16]


def _tool_calls(call: dict | None, rid: str) -> list[dict] | None:
    if call is None:
        return None
    arguments = json.dumps(call["arguments"])
    return [{"id": f"call_{rid}", "type": "function", "function": {"name": call["name"], "arguments": arguments}}]


def _chat_logprobs(words: list[str]) -> dict:
    return {"content": [{"token": w, "logprob": -0.1 * (i + 1), "bytes": list(w.encode()), "top_logprobs": []}
                        for i, w in enumerate(words)]}


def _completion_logprobs(words: list[str]) -> dict:
    return {"tokens": words, "token_logprobs": [-0.1 * (i + 1) for i in range(len(words))],
            "top_logprobs": [{} for _ in words], "text_offset": list(range(len(words)))}


def _usage(prompt: list[str], answer: list[str]) -> dict:
    return {"prompt_tokens": len(prompt), "completion_tokens": len(answer), "total_tokens": len(prompt) + len(answer)}


def chat_answer(body: dict[str, Any], *, ids: bool) -> dict:
    prompt = words_of(body["messages"], None)
    words, call = answer_words(body)
    rid = request_id(body)
    tool_calls = _tool_calls(call, rid)
    message = {"role": "assistant", "content": None if call else " ".join(words), "tool_calls": tool_calls or []}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop",
                              "logprobs": _chat_logprobs(words) if body.get("logprobs") else None}
    out: dict[str, Any] = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": CREATED,
                           "model": body["model"], "choices": [choice], "usage": _usage(prompt, words)}
    if ids:
        out["prompt_token_ids"] = [token_id(w) for w in prompt]
        choice["token_ids"] = [token_id(w) for w in words]
    return out


def completion_answer(body: dict[str, Any], *, ids: bool) -> dict:
    prompt = words_of(None, body["prompt"])
    words, _ = answer_words(body)
    choice: dict[str, Any] = {"index": 0, "text": " ".join(words), "finish_reason": "stop",
                              "logprobs": _completion_logprobs(words) if body.get("logprobs") is not None else None}
    if ids:
        choice["prompt_token_ids"] = [token_id(w) for w in prompt]
        choice["token_ids"] = [token_id(w) for w in words]
    return {"id": f"cmpl-{request_id(body)}", "object": "text_completion", "created": CREATED,
            "model": body["model"], "choices": [choice], "usage": _usage(prompt, words)}


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def chat_stream(body: dict[str, Any], *, ids: bool):
    whole = chat_answer(body, ids=True)
    rid, words = whole["id"], answer_words(body)[0]
    base = {"id": rid, "object": "chat.completion.chunk", "created": CREATED, "model": body["model"]}
    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}]}
    if ids:
        first["prompt_token_ids"] = whole["prompt_token_ids"]
    yield _sse(first)
    tool_calls = whole["choices"][0]["message"]["tool_calls"]
    for i, word in enumerate(words):
        delta: dict[str, Any] = {"content": word if i == 0 else " " + word}
        if tool_calls:
            call = tool_calls[0]
            delta = {"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]} if i == 0 \
                else {"tool_calls": [{"index": 0, "function": {"arguments": call["function"]["arguments"] if i == 1 else ""}}]}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None,
                                  "logprobs": _chat_logprobs([word]) if body.get("logprobs") else None}
        if body.get("logprobs"):
            choice["logprobs"]["content"][0]["logprob"] = -0.1 * (i + 1)
        if ids:
            choice["token_ids"] = [token_id(word)]
        yield _sse({**base, "choices": [choice]})
        if body["model"] == "fake-break" and i == 2:
            raise RuntimeError("the engine crashed mid-stream")
        await asyncio.sleep(0.2 if body["model"] == "fake-slowstream" else 0)
    finish = whole["choices"][0]["finish_reason"]
    yield _sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _sse({**base, "choices": [], "usage": whole["usage"]})
    yield b"data: [DONE]\n\n"
    if body["model"] == "fake-linger":
        await asyncio.sleep(0.3)


async def completion_stream(body: dict[str, Any], *, ids: bool):
    whole = completion_answer(body, ids=True)
    words = answer_words(body)[0]
    base = {"id": whole["id"], "object": "text_completion", "created": CREATED, "model": body["model"]}
    for i, word in enumerate(words):
        choice: dict[str, Any] = {"index": 0, "text": word if i == 0 else " " + word, "finish_reason": None,
                                  "logprobs": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [word], "token_logprobs": [-0.1 * (i + 1)], "top_logprobs": [{}],
                                  "text_offset": [i]}
        if ids:
            choice["token_ids"] = [token_id(word)]
            if i == 0:
                choice["prompt_token_ids"] = whole["choices"][0]["prompt_token_ids"]
        yield _sse({**base, "choices": [choice]})
    yield _sse({**base, "choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": None}]})
    yield b"data: [DONE]\n\n"


def create_fake_engine() -> FastAPI:
    app = FastAPI()
    calls: Counter[str] = Counter()
    app.state.calls = calls

    async def failure(body: dict[str, Any]) -> Response | None:
        model = str(body.get("model"))
        calls[model + request_id(body)] += 1
        if model == "fake-503":
            return JSONResponse({"error": {"message": "engine overloaded", "type": "server_error"}}, 503)
        if model == "fake-slow":
            await asyncio.sleep(3)
        if model.startswith("fake-flaky-") and calls[model + request_id(body)] <= int(model.rsplit("-", 1)[1]):
            return JSONResponse({"error": {"message": "warming up", "type": "server_error"}}, 503)
        return None

    def wants_ids(body: dict[str, Any]) -> bool:
        return body.get("return_token_ids") is True and body.get("model") != "fake-noids"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        if (failed := await failure(body)) is not None:
            return failed
        if body.get("stream"):
            return StreamingResponse(chat_stream(body, ids=wants_ids(body)), media_type="text/event-stream")
        return JSONResponse(chat_answer(body, ids=wants_ids(body)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        if (failed := await failure(body)) is not None:
            return failed
        if body.get("stream"):
            return StreamingResponse(completion_stream(body, ids=wants_ids(body)), media_type="text/event-stream")
        return JSONResponse(completion_answer(body, ids=wants_ids(body)))

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": CREATED,
                                            "owned_by": "trajlake"}]}

    return app
