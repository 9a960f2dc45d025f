"""Replays of keyed calls: a retried request gets the answer that was recorded, not a new sample.

Per (tenant, key): a request whose body differs from the first one's (its
fingerprint, ``identity.request_fingerprint``) gets 422, whatever state the
first is in: a key names one request, and answering another question with its
answer would be wrong. With the same body: while the first request runs, a
duplicate gets 409; once it succeeded, a duplicate within ``ttl_s`` gets the
stored answer again (header ``Idempotent-Replayed: true``) without calling the
engine or recording anything; a failed first attempt is forgotten so that the
retry runs (with any body). The
cache is in-process (bounded LRU); across restarts the deterministic event ids
still make the ingester store a keyed call once. Used from the event loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from ingest.gateway.errors import IdempotencyConflict, IdempotencyKeyReused

MAX_STORED_BYTES = 4 * 1024 * 1024
"""Answers larger than this are not kept for replay (a retry then re-runs, recorded once)."""


@dataclass(frozen=True)
class StoredReply:
    status: int
    body: bytes
    content_type: str


_IN_FLIGHT = object()


class IdempotencyCache:
    def __init__(self, *, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[tuple[str, str], tuple[float, str, object]] = OrderedDict()

    def begin(self, tenant: str, key: str, fingerprint: str) -> StoredReply | None:
        """The stored answer of a finished call, or None after marking this one in flight.

        Raises ``IdempotencyKeyReused`` (422) when the key's first request had another fingerprint,
        ``IdempotencyConflict`` (409) while the first request still runs.
        """
        now = time.monotonic()
        entry = self._entries.get((tenant, key))
        if entry is not None and now - entry[0] < self.ttl_s:
            if entry[1] != fingerprint:
                raise IdempotencyKeyReused(
                    f"Idempotency-Key {key[:60]!r} was already used with a different request body; "
                    "send a new key with a new request (a retry must repeat the first body exactly)",
                    param="idempotency_key",
                )
            if entry[2] is _IN_FLIGHT:
                raise IdempotencyConflict(
                    f"a request with Idempotency-Key {key[:60]!r} is still running; retry when it has finished",
                    param="idempotency_key",
                )
            self._entries.move_to_end((tenant, key))
            return entry[2]  # type: ignore[return-value]
        self._entries[(tenant, key)] = (now, fingerprint, _IN_FLIGHT)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return None

    def finish(self, tenant: str, key: str, fingerprint: str, reply: StoredReply | None) -> None:
        """Store a successful answer for replay, or forget the key (None) so a retry runs."""
        if reply is None or len(reply.body) > MAX_STORED_BYTES:
            self._entries.pop((tenant, key), None)
        else:
            self._entries[(tenant, key)] = (time.monotonic(), fingerprint, reply)
