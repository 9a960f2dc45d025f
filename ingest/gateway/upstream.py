"""The engine behind the gateway: one shared keep-alive connection pool with retries.

Retried (up to ``retries`` times, short exponential backoff): connection
failures and 502/503/504 answers, all of which mean the engine did not
generate anything. Timeouts are not retried (the engine may be generating; a
retry would double the cost) and become 504.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ingest.gateway.errors import UpstreamTimeout, UpstreamUnavailable
from ingest.gateway.http1 import Http1Pool, Reply

_RETRY_STATUSES = frozenset({502, 503, 504})
_BACKOFF_S = 0.05


@dataclass(frozen=True)
class UpstreamReply:
    status: int
    body: bytes
    headers: dict[str, str]
    retries: int

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")


def make_pool(base_url: str, *, api_key: str | None, timeout_s: float, connect_timeout_s: float) -> Http1Pool:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return Http1Pool(base_url, headers=headers, connect_timeout_s=connect_timeout_s, read_timeout_s=timeout_s)


class Upstream:
    """Sends requests to the engine; raises ``UpstreamUnavailable`` / ``UpstreamTimeout``."""

    def __init__(self, pool: Http1Pool, *, retries: int) -> None:
        self.pool = pool
        self.retries = retries

    async def request(self, method: str, path: str, *, body: bytes | None = None) -> UpstreamReply:
        """A whole (non-streaming) exchange."""
        reply, retries = await self._send(method, path, body)
        try:
            content = await reply.read()
        except TimeoutError:
            raise self.timed_out(retries=retries) from None
        except ConnectionError as exc:
            raise UpstreamUnavailable(f"the upstream engine broke the connection: {exc}", retries=retries) from None
        finally:
            await reply.aclose()
        return UpstreamReply(reply.status, content, reply.headers, retries)

    async def open_stream(self, path: str, *, body: bytes) -> tuple[Reply, int]:
        """Open a streaming POST; the caller iterates ``iter_bytes()`` and must ``aclose()`` the reply."""
        return await self._send("POST", path, body)

    def timed_out(self, *, retries: int) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"the upstream engine did not answer within {self.pool.read_timeout_s} s; "
            "raise TRAJLAKE_UPSTREAM_TIMEOUT_S or ask for fewer tokens",
            retries=retries,
        )

    async def _send(self, method: str, path: str, body: bytes | None) -> tuple[Reply, int]:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                reply = await self.pool.send(method, path, body=body)
            except ConnectionError as exc:
                if last:
                    raise UpstreamUnavailable(
                        f"the upstream engine at {self.pool.base_url} is unreachable after "
                        f"{attempt + 1} attempt(s): {exc}; check it runs and TRAJLAKE_UPSTREAM_URL",
                        retries=attempt,
                    ) from None
            except TimeoutError:
                raise self.timed_out(retries=attempt) from None
            else:
                if reply.status not in _RETRY_STATUSES or last:
                    return reply, attempt
                await reply.aclose()
            await asyncio.sleep(_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable: the loop returns or raises on its last attempt")
