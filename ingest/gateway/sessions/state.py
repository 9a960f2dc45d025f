"""Per-rollout session state: the last call's messages (as digests), prompt ids and sampled ids.

Bounded by bytes (least recently used evicted first) and by idle time (TTL).
Ids are kept as 4-byte ``array('i')``; messages as 20-byte digests, so a
session costs about 4 bytes per token of the rollout's last prompt and answer.
A session lives in one gateway process: a restarted gateway, or a replica that
did not see the previous call, has none and the call takes the plain route.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

SessionKey = tuple[str, str, int, str | None]
"""(tenant, rollout_id, attempt, span_id): a sub-agent with its own span keeps its own session."""

_OVERHEAD_BYTES = 700
"""Fixed cost of one session (objects, dict slot), measured with tracemalloc (bench/sessions)."""


@dataclass(frozen=True, slots=True)
class Session:
    """What the next call of a rollout must extend."""

    messages: tuple[bytes, ...]
    """Digests of the previous call's messages, then of the assistant message the gateway returned."""
    context: bytes
    """Digest of what else shapes the rendering (model, tools)."""
    prompt_ids: array
    sampled_ids: array
    call_id: str = ""
    """The call these ids belong to: the next call's prefix reference names it."""

    @property
    def nbytes(self) -> int:
        return (_OVERHEAD_BYTES + 4 * (len(self.prompt_ids) + len(self.sampled_ids))
                + 60 * len(self.messages) + len(self.call_id))


class SessionStore:
    """LRU + TTL map of sessions, bounded by ``max_bytes``; thread-safe."""

    def __init__(self, *, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError("token session limits must be positive (session_max_bytes, session_ttl_s)")
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._items: OrderedDict[SessionKey, tuple[Session, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.evicted = 0
        """Sessions dropped for room (LRU) or idleness (TTL)."""

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: SessionKey) -> Session | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._items.get(key)
            if entry is None:
                return None
            self._items[key] = (entry[0], now)
            self._items.move_to_end(key)
            return entry[0]

    def put(self, key: SessionKey, session: Session) -> None:
        now = self._clock()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[0].nbytes
            if session.nbytes > self.max_bytes:
                return  # larger than the whole budget: this rollout runs without a session
            self._items[key] = (session, now)
            self.bytes += session.nbytes
            self._expire(now)
            while self.bytes > self.max_bytes:
                self._drop_oldest()

    def _expire(self, now: float) -> None:
        while self._items:
            _, (_, used) = next(iter(self._items.items()))
            if now - used <= self.ttl_s:
                return
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, (session, _) = self._items.popitem(last=False)
        self.bytes -= session.nbytes
        self.evicted += 1
