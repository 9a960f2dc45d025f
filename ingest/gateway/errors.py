"""Gateway errors, each with its HTTP status and an OpenAI-shaped body.

OpenAI clients parse ``{"error": {"message", "type", "param", "code"}}``, so
every error the gateway itself raises uses that shape; errors from the
upstream are passed through unchanged.
"""

from __future__ import annotations

import json


class GatewayError(Exception):
    """Base: an error answered to the client, handled in one place (the app's handler)."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class IdempotencyConflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"


class UpstreamUnavailable(GatewayError):
    """The engine could not be reached (connection refused/reset) after the configured retries."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class EventsRefused(GatewayError):
    """The spool is full: accepting more events would mean dropping them."""

    status = 503
    type = "server_error"
    code = "spool_full"
