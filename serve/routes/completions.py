"""``POST /v1/completions``: a text prompt (or token ids) continued as is."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve.deps import BodyDep, EngineDep
from serve.protocol import CompletionRequest, parse_request
from serve.respond import respond, sampling_params
from serve.responses import TextCompletion

router = APIRouter()


@router.post("/v1/completions")
async def completions(engine: EngineDep, raw: BodyDep) -> Response:
    completion, _ = parse_request(raw, CompletionRequest)
    engine.check_model(completion.model)
    prompt_ids = engine.text_prompt(completion.single_prompt(), add_special_tokens=completion.add_special_tokens)
    top = completion.logprobs or 0
    params = sampling_params(engine, completion, prompt_ids, completion.requested_max_tokens(), top, param="prompt")
    builder = TextCompletion(completion, prompt_ids, engine.strings, engine.identity.served_name)
    return await respond(engine, builder, prompt_ids, params, completion)
