"""Who a call belongs to: rollout identity from headers, path or query, and the call's own id.

Headers (any OpenAI client can set default headers):
``X-Trajlake-Task-Id``, ``X-Trajlake-Rollout-Id``, ``X-Trajlake-Attempt``,
``X-Trajlake-Harness``, ``X-Trajlake-Harness-Version``,
``X-Trajlake-Harness-Config-Hash``, ``X-Trajlake-Span-Id``,
``X-Trajlake-Parent-Span-Id``. Harnesses that can only change the base URL use
``/rollouts/{rollout_id}/v1`` or ``/tasks/{task_id}/rollouts/{rollout_id}/v1``
and put the rest in headers or in the query (``?task_id=&attempt=&harness=&harness_version=``).
Precedence: path, then header, then query.

Unattached calls (no rollout id anywhere) are still proxied and recorded
with task_id ``_unattached`` and rollout_id = the call id; a rollout id with no
task id is recorded under task ``_unattached`` too.

Idempotency: ``Idempotency-Key`` or, failing that, ``X-Client-Request-Id``.
A keyed call gets a call id (and event ids) derived from the tenant, the key
and the request's fingerprint, so a retry of it is recorded once even across
gateway restarts (the ingester dedupes event ids), while another body sent
under a reused key is never mistaken for it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingest.gateway.errors import BadRequest
from schemas.events import INT32_MAX, Harness

UNATTACHED_TASK = "_unattached"
_NAMESPACE = uuid.UUID("7b0c35b6-3f69-4b7e-9c55-2d6f3c1f0a11")
_HEADER = "x-trajlake-"


@dataclass(frozen=True)
class RolloutIdentity:
    task_id: str
    rollout_id: str
    attempt: int
    harness: Harness | None
    span_id: str | None
    parent_span_id: str | None
    attached: bool


@dataclass(frozen=True)
class CallIdentity:
    call_id: str
    idempotency_key: str | None
    fingerprint: str | None = None
    """``request_fingerprint`` of a keyed call (None without a key)."""


def _pick(name: str, path: Mapping[str, str], headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    header = _HEADER + name.replace("_", "-")
    value = path.get(name) or headers.get(header) or query.get(name)
    if value is None:
        return None
    value = value.strip()
    limit = 500 if name in ("task_id", "rollout_id") else 200
    if not value or len(value) > limit:
        raise BadRequest(f"{header} (or {name}) must be 1-{limit} characters", param=name)
    return value


def _attempt(raw: str | None) -> int:
    if raw is None:
        return 0
    if not raw.isdigit() or int(raw) > INT32_MAX:
        raise BadRequest(f"X-Trajlake-Attempt must be a non-negative integer, got {raw[:40]!r}", param="attempt")
    return int(raw)


def _harness(name: str | None, version: str | None, config_hash: str | None) -> Harness | None:
    if name is None and version is None:
        return None
    if not (name and version):
        raise BadRequest(
            "send X-Trajlake-Harness and X-Trajlake-Harness-Version together (harness name and version)",
            param="harness",
        )
    return Harness(name=name, version=version, config_hash=config_hash)


def rollout_identity(
    *, call_id: str, path: Mapping[str, str], headers: Mapping[str, str], query: Mapping[str, str]
) -> RolloutIdentity:
    """Identity of the rollout a call belongs to; raises ``BadRequest`` on malformed values."""

    def pick(name: str) -> str | None:
        return _pick(name, path, headers, query)

    rollout_id = pick("rollout_id")
    return RolloutIdentity(
        task_id=pick("task_id") or UNATTACHED_TASK,
        rollout_id=rollout_id or call_id,
        attempt=_attempt(pick("attempt")),
        harness=_harness(pick("harness"), pick("harness_version"), pick("harness_config_hash")),
        span_id=pick("span_id"),
        parent_span_id=pick("parent_span_id"),
        attached=rollout_id is not None,
    )


def request_fingerprint(kind: str, body: Mapping[str, Any]) -> str:
    """sha256 of the route and the body as canonical JSON: the same request, whatever its key order or spacing."""
    canonical = json.dumps([kind, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def call_identity(*, tenant: str, headers: Mapping[str, str], kind: str, body: Mapping[str, Any]) -> CallIdentity:
    """The call's id: random, or derived from (tenant, key, fingerprint) when an idempotency key is sent."""
    key = headers.get("idempotency-key") or headers.get("x-client-request-id")
    if key is None:
        # uuid4, not ingest.ids.uuid7: uuid7 takes a process-wide lock that the emitter thread
        # also takes for event ids, and that contention showed up as ~10% of the hot path.
        return CallIdentity(call_id=f"call-{uuid.uuid4()}", idempotency_key=None)
    if not key or len(key) > 200:
        raise BadRequest("Idempotency-Key must be 1-200 characters", param="idempotency_key")
    fingerprint = request_fingerprint(kind, body)
    return CallIdentity(call_id=f"call-{stable_id(tenant, key, fingerprint)}", idempotency_key=key,
                        fingerprint=fingerprint)


def stable_id(*parts: str) -> str:
    """A deterministic UUID for ``parts`` (tenant, key, fingerprint, event kind): retries get the same id."""
    return str(uuid.uuid5(_NAMESPACE, "\x00".join(parts)))
