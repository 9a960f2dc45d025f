"""The capture gateway: an OpenAI-compatible proxy that records token-exact LLM calls.

``create_gateway_app(settings)`` builds the FastAPI app; ``trajlake gateway``
runs it under uvicorn. See ``ingest/gateway/README.md`` for the contract.
"""

from ingest.gateway.app import create_gateway_app
from ingest.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_gateway_app"]
