"""``POST /v1/chat/completions``: messages (and tools) through the chat template, tool calls parsed."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve.deps import BodyDep, EngineDep
from serve.protocol import ChatRequest, parse_request
from serve.respond import respond, sampling_params
from serve.responses import ChatCompletion

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(engine: EngineDep, raw: BodyDep) -> Response:
    chat, body = parse_request(raw, ChatRequest)
    engine.check_model(chat.model)
    prompt_ids = engine.chat_prompt(body["messages"], body.get("tools"))
    top = chat.top_logprobs or 0
    params = sampling_params(engine, chat, prompt_ids, chat.requested_max_tokens(), top, param="messages")
    builder = ChatCompletion(chat, prompt_ids, engine.strings, engine.identity.served_name)
    return await respond(engine, builder, prompt_ids, params, chat)
