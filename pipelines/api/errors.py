"""Errors of the query API: one JSON shape, one place that maps domain errors to HTTP.

Every error body is ``{"error": {"code", "message", "hint"}}``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from pipelines.api.services import Busy, NotFound
from store.sql import QueryError, WriteRefused
from store.tenant_sql import QueryRefused, QueryTimeout


class ApiError(Exception):
    """An HTTP error with a stable ``code`` and a hint on what to do next."""

    def __init__(self, status: int, code: str, message: str, *, hint: str = "",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.hint = status, code, message, hint
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"code": self.code, "message": self.message, "hint": self.hint}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


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


def install_error_handlers(app: FastAPI) -> None:
    """Map ``ApiError``, query errors and not-found lookups to JSON responses."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return ApiError(422, "invalid_request", "; ".join(problems[:10]) or "invalid request",
                        hint="see /docs for the request shapes").response()

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return exc.error.response()

    @app.exception_handler(QueryError)
    async def query_error(request: Request, exc: QueryError) -> JSONResponse:
        return _query_error(exc).response()

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return ApiError(404, "not_found", str(exc), hint=exc.hint).response()

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return ApiError(429, "busy", str(exc), hint="retry in a few seconds", headers={"Retry-After": "2"}).response()

