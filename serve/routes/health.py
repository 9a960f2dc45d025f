"""``GET /health``: the process serves a loaded model."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve.deps import EngineDep

router = APIRouter()


@router.get("/health")
async def health(engine: EngineDep) -> JSONResponse:
    return JSONResponse({"status": "ok", "model": engine.identity.served_name}, headers=engine.identity.headers())
