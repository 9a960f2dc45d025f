"""Route dependencies as ``Annotated`` aliases: the caller's tenant and the collaborators the lifespan built.

The tenant comes from the API key (``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``). The key store
is passed in by the shell (``ingest.gateway.auth.KeyRing`` fits: same key=tenant files and env format as
the gateway); this package only needs ``tenant(key) -> str | None``.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.metrics import QueryApiMetrics
from api.services import QueryService
from api.viewer.tokens import TokenDecoder


class TenantKeys(Protocol):
    def tenant(self, key: str | None) -> str | None:
        """The key's tenant; None for a missing or unknown key."""


_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token.")
_api_key = APIKeyHeader(name="X-Api-Key", auto_error=False, description="API key.")


def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> str:
    """The tenant of the presented key; 401 without a known key."""
    keys: TenantKeys = request.app.state.keys
    tenant = keys.tenant(credentials.credentials if credentials else api_key)
    if tenant is None:
        raise ApiError(401, "unauthorized", "missing or unknown API key",
                       hint="send Authorization: Bearer <key> (or X-Api-Key: <key>) with a key of your tenant",
                       headers={"WWW-Authenticate": "Bearer"})
    return tenant


Tenant = Annotated[str, Depends(authenticate)]
"""The authenticated caller's tenant."""


def _service(request: Request) -> QueryService:
    return request.app.state.service


Service = Annotated[QueryService, Depends(_service)]
"""The app's ``QueryService`` (built by the lifespan)."""


def _token_decoder(request: Request) -> TokenDecoder:
    return request.app.state.token_decoder


Decoder = Annotated[TokenDecoder, Depends(_token_decoder)]
"""The viewer's token decoder (built by the lifespan; loads its tokenizer on first use)."""


def _metrics(request: Request) -> QueryApiMetrics:
    return request.app.state.metrics


Metrics = Annotated[QueryApiMetrics, Depends(_metrics)]
"""The app's Prometheus registry (built with the app: its middleware counts every request)."""
