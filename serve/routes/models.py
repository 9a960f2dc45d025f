"""``GET /v1/models``: the served model, with the policy version and tokenizer it answers with."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve.deps import EngineDep

router = APIRouter()


@router.get("/v1/models")
async def models(engine: EngineDep) -> JSONResponse:
    identity = engine.identity
    entry = {
        "id": identity.served_name, "object": "model", "created": identity.loaded_at, "owned_by": "trajlake",
        "max_model_len": identity.max_model_len, "policy_version": identity.policy_version,
        "tokenizer": identity.tokenizer, "chat_template_hash": identity.chat_template_hash,
    }
    return JSONResponse({"object": "list", "data": [entry]}, headers=identity.headers())
