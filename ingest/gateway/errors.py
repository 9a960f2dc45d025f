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


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class IdempotencyConflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"


class IdempotencyKeyReused(GatewayError):
    """The key was already used with a different request body (as payment APIs answer it)."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class UpstreamFailure(GatewayError):
    """The engine gave no usable answer; ``retries`` counts the attempts after the first."""

    def __init__(self, message: str, *, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries


class UpstreamUnavailable(UpstreamFailure):
    """The engine could not be reached (connection refused/reset) after the configured retries."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamFailure):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def for_http_status(status: int, *, method: str, path: str) -> GatewayError:
    """The error for a request no route took (unknown URL, wrong method): OpenAI-shaped like the rest."""
    shown = f"{method} {path[:200]}"
    if status == 404:
        return NotFound(f"Invalid URL ({shown}): the gateway serves the OpenAI API under /v1 "
                        "(chat/completions, completions, models) and POST /v1/events")
    if status == 405:
        return MethodNotAllowed(f"Method not allowed ({shown}): the Allow header lists the methods this URL takes")
    error = GatewayError(f"request refused with HTTP {status} ({shown})")
    error.status = status
    return error


class EventsRefused(GatewayError):
    """The spool is full: accepting more events would mean dropping them."""

    status = 503
    type = "server_error"
    code = "spool_full"
