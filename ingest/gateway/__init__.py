"""The capture gateway: an OpenAI-compatible proxy that records token-exact LLM calls.

``create_gateway_app(settings)`` builds the FastAPI app; ``trajlake gateway``
runs it under uvicorn. See ``ingest/gateway/README.md`` for the contract.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GatewayConfig", "create_gateway_app"]


def __getattr__(name: str) -> Any:
    """Load on first use: ``ingest.gateway.config`` (the shell's settings) stays cheap to import, without FastAPI."""
    if name == "create_gateway_app":
        from ingest.gateway.app import create_gateway_app

        return create_gateway_app
    if name == "GatewayConfig":
        from ingest.gateway.config import GatewayConfig

        return GatewayConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
