"""Route dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.auth import Tenant
from api.services import QueryService


def _service(request: Request) -> QueryService:
    return request.app.state.service


Service = Annotated[QueryService, Depends(_service)]
"""The app's ``QueryService`` (built by the lifespan)."""

__all__ = ["Service", "Tenant"]
