"""The engine behind the gateway: one shared keep-alive ``httpx.AsyncClient`` with retries.

Retried (up to ``retries`` times, short exponential backoff): connection
failures, connect timeouts and 502/503/504 answers, all of which mean the
engine did not generate anything. Read timeouts are not retried (the engine
may be generating; a retry would double the cost) and become 504.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from ingest.gateway.errors import UpstreamTimeout, UpstreamUnavailable

_RETRY_STATUSES = frozenset({502, 503, 504})
_BACKOFF_S = 0.05


@dataclass(frozen=True)
class UpstreamReply:
    status: int
    body: bytes
    content_type: str
    retries: int


def make_client(
    base_url: str, *, api_key: str | None, timeout_s: float, connect_timeout_s: float
) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
    )


class Upstream:
    """Sends requests to the engine; raises ``UpstreamUnavailable`` / ``UpstreamTimeout``."""

    def __init__(self, client: httpx.AsyncClient, *, retries: int) -> None:
        self.client = client
        self.retries = retries

    async def request(self, method: str, path: str, *, body: bytes | None = None) -> UpstreamReply:
        """A whole (non-streaming) exchange."""
        response, retries = await self._send(method, path, body, stream=False)
        return UpstreamReply(
            status=response.status_code,
            body=response.content,
            content_type=response.headers.get("content-type", "application/json"),
            retries=retries,
        )

    async def open_stream(self, path: str, *, body: bytes) -> tuple[httpx.Response, int]:
        """Open a streaming POST; the caller iterates and must ``aclose()`` the response."""
        return await self._send("POST", path, body, stream=True)

    async def _send(self, method: str, path: str, body: bytes | None, *, stream: bool) -> tuple[httpx.Response, int]:
        headers = {"content-type": "application/json"} if body is not None else None
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            request = self.client.build_request(method, path, content=body, headers=headers)
            try:
                response = await self.client.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                if last:
                    raise UpstreamUnavailable(
                        f"the upstream engine at {self.client.base_url} is unreachable after "
                        f"{attempt + 1} attempt(s): {exc!r}; check it runs and TRAJLAKE_UPSTREAM_URL"
                    ) from None
            except httpx.TimeoutException:
                raise UpstreamTimeout(
                    f"the upstream engine did not answer within {self.client.timeout.read} s; "
                    "raise TRAJLAKE_UPSTREAM_TIMEOUT_S or ask for fewer tokens"
                ) from None
            else:
                if response.status_code not in _RETRY_STATUSES or last:
                    return response, attempt
                await response.aclose()
            await asyncio.sleep(_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable: the loop returns or raises on its last attempt")
