"""Per-rollout session state: the last call's messages (as digests), prompt ids and sampled ids.

Bounded by bytes (least recently used evicted first) and by idle time (TTL).
Ids are kept as ``array('H')`` (2 bytes each) when they fit, as with
vocabularies up to 65,536 (Llama 2, Mistral, the tiny model), else as
``array('i')`` (4 bytes); messages as 20-byte digests joined in one ``bytes``.
A session costs about 2 or 4 bytes per token of the rollout's last prompt and
answer, plus 20 per message (bench/sessions measures it per 10k rollouts).
A session lives in one gateway process: a restarted gateway, or a replica that
did not see the previous call, has none and the call takes the plain route.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SessionKey = tuple[str, str, int, str | None]
"""(tenant, rollout_id, attempt, span_id): a sub-agent with its own span keeps its own session."""

DIGEST_BYTES = 20
"""One message's structural digest (SHA-1)."""
_OVERHEAD_BYTES = 600
"""Fixed cost of one session (objects, dict slot), measured with tracemalloc (bench/sessions)."""


def pack_ids(ids: Sequence[int]) -> array:
    """Token ids as ``array('H')`` when every one fits in 2 bytes, else as ``array('i')``.

    >>> pack_ids([1, 2]).typecode, pack_ids([1, 151_643]).typecode
    ('H', 'i')
    """
    try:
        return array("H", ids)
    except OverflowError:
        return array("i", ids)


@dataclass(frozen=True, slots=True)
class Session:
    """What the next call of a rollout must extend."""

    messages: bytes
    """Digests of the previous call's messages, then of the assistant message the gateway returned, joined
    (``DIGEST_BYTES`` each)."""
    context: bytes
    """Digest of what else shapes the rendering (model, tools)."""
    prompt_ids: array
    sampled_ids: array
    call_id: str = ""
    """The call these ids belong to: the next call's prefix reference names it."""
    raw: bytes = b""
    """Digest of the previous call's messages as the client sent them: the next call compares its history with it
    before digesting message by message."""
    kinds: frozenset = frozenset()
    """The kinds of the previous call's messages (an object shared between sessions)."""

    @property
    def count(self) -> int:
        """Messages digested: the previous call's and its answer."""
        return len(self.messages) // DIGEST_BYTES

    @property
    def nbytes(self) -> int:
        return (_OVERHEAD_BYTES + self.prompt_ids.itemsize * len(self.prompt_ids)
                + self.sampled_ids.itemsize * len(self.sampled_ids) + len(self.messages) + len(self.call_id))


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
