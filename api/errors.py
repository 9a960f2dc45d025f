"""Errors of the query API: one JSON shape, one place that maps domain errors to HTTP.

Every error body is OpenAI-shaped, with a hint on what to do next:
``{"error": {"message", "type", "param", "code", "hint"}}``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.services import Busy, NotFound
from api.workers import WorkersUnavailable
from store.sql import QueryError, WriteRefused
from store.tenant_sql import QueryRefused, QueryTimeout


ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
"""OpenAI's error ``type`` by status; other 4xx are ``invalid_request_error``, 5xx ``server_error``."""


def error_body(status: int, code: str, message: str, *, hint: str = "") -> dict[str, dict[str, object]]:
    """The JSON body of every error answer."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code, "hint": hint}}


class ApiError(Exception):
    """An HTTP error with a stable ``code`` and a hint on what to do next."""

    def __init__(self, status: int, code: str, message: str, *, hint: str = "",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.hint = status, code, message, hint
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.code, self.message, hint=self.hint),
                            status_code=self.status, headers=self.headers)


class BodyTooLarge(HTTPException):
    """A request body past the limit (an HTTPException, so FastAPI's body parsing passes it through)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body is over {max_bytes:,} bytes")
        self.error = ApiError(413, "body_too_large", self.detail, hint="send a shorter query")


def _query_error(exc: QueryError) -> ApiError:
    if isinstance(exc, QueryTimeout):
        return ApiError(400, "query_timeout", exc.message, hint=exc.hint)
    if isinstance(exc, (QueryRefused, WriteRefused)):
        return ApiError(400, "query_refused", exc.message, hint=exc.hint)
    return ApiError(400, "query_error", exc.message, hint=exc.hint)


def _http_error(request: Request, exc: HTTPException) -> ApiError:
    """Starlette's and FastAPI's own errors (no route, wrong method, a body that does not parse) in our shape."""
    if exc.status_code == 404:
        return ApiError(404, "not_found", f"no route {request.method} {request.url.path}",
                        hint="see /openapi.json for the routes")
    if exc.status_code == 405:
        return ApiError(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}",
                        hint="see /openapi.json for the methods of each route", headers=dict(exc.headers or {}))
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body: the cause says why
        return ApiError(400, "invalid_json", f"the request body could not be parsed: {_unparsable(exc.__cause__)}",
                        hint='send a flat JSON object in UTF-8, e.g. {"sql": "SELECT 1"}')
    return ApiError(exc.status_code, "http_error", str(exc.detail), headers=dict(exc.headers or {}))


def _unparsable(cause: BaseException) -> str:
    """Why FastAPI could not parse a JSON body (a malformed one is a 422 before this: these are the rest)."""
    if isinstance(cause, RecursionError):
        return "JSON nested about 1,000 levels or deeper (Python's JSON parser stops there)"
    if isinstance(cause, UnicodeDecodeError):
        return f"it is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start})"
    return f"{type(cause).__name__}: {cause}"


def install_error_handlers(app: FastAPI) -> None:
    """Map ``ApiError``, query errors and not-found lookups to JSON responses."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return ApiError(422, "invalid_request", "; ".join(problems[:10]) or "invalid request",
                        hint="see /openapi.json for the request shapes").response()

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return exc.error.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _http_error(request, exc).response()

    @app.exception_handler(QueryError)
    async def query_error(request: Request, exc: QueryError) -> JSONResponse:
        return _query_error(exc).response()

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return ApiError(404, "not_found", str(exc), hint=exc.hint).response()

    @app.exception_handler(WorkersUnavailable)
    async def unavailable(request: Request, exc: WorkersUnavailable) -> JSONResponse:
        return ApiError(503, "unavailable", str(exc), hint="retry in a few seconds; if it persists, see the server log",
                        headers={"Retry-After": "5"}).response()

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return ApiError(429, "busy", str(exc), hint="retry in a few seconds", headers={"Retry-After": "2"}).response()

