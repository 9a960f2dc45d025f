"""Per-tenant retention: forget rollouts older than the tenant's retention days.

Retention works on whole rollouts, not rows: a rollout expires when its
newest event in ``events`` is older than the cutoff, so a trajectory is never
cut in half (its start deleted, its late reward kept). Expired rollouts go
through ``store.forget`` (Delta deletes in every table, vacuum, audit row of
kind ``retention``).

A policy maps tenant -> days; the key ``*`` is the default for tenants not
named; a tenant with no entry and no default is kept forever.

>>> RetentionPolicy.parse({"acme": 30, "*": 365}).days_for("other")
365
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.compute as pc

from schemas.tables import EVENTS_TABLE
from store.forget import ForgetReport, ForgetRequest, forget
from store.lake import Lake

DEFAULT_KEY = "*"
MAX_DAYS = 36_500


@dataclass(frozen=True)
class RetentionPolicy:
    """Days to keep each tenant's rollouts."""

    days: Mapping[str, int]

    @classmethod
    def parse(cls, values: object) -> RetentionPolicy:
        """Validate a mapping tenant -> whole days (1..36500)."""
        if not isinstance(values, Mapping):
            raise ValueError(f"retention policy must map tenant -> days, e.g. {{\"acme\": 30, \"*\": 365}}; got {type(values).__name__}")
        days: dict[str, int] = {}
        for tenant, value in values.items():
            if not isinstance(tenant, str) or not tenant:
                raise ValueError(f"retention policy: tenant names must be non-empty strings, got {tenant!r}")
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DAYS:
                raise ValueError(f"retention policy: days for {tenant!r} must be a whole number 1..{MAX_DAYS}, got {value!r}")
            days[tenant] = value
        return cls(days)

    @classmethod
    def from_file(cls, path: Path) -> RetentionPolicy:
        """Read a policy file: JSON (``{"acme": 30}``) or TOML (``acme = 30`` or a ``[retention]`` table)."""
        text = path.read_text()
        try:
            values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"retention policy {path}: not valid {path.suffix.lstrip('.') or 'JSON'} ({exc})") from exc
        if isinstance(values, dict) and isinstance(values.get("retention"), dict):
            values = values["retention"]
        return cls.parse(values)

    def days_for(self, tenant: str) -> int | None:
        return self.days.get(tenant, self.days.get(DEFAULT_KEY))


def expired_rollouts(lake: Lake, policy: RetentionPolicy, *, now: datetime) -> dict[str, list[str]]:
    """Tenant -> rollouts whose newest event is older than the tenant's cutoff."""
    if not lake.exists(EVENTS_TABLE):
        return {}
    events = lake.read(EVENTS_TABLE, columns=["tenant", "rollout_id", "ts"])
    newest = events.group_by(["tenant", "rollout_id"]).aggregate([("ts", "max")])
    expired: dict[str, list[str]] = {}
    for tenant in sorted(pc.unique(newest["tenant"]).to_pylist()):
        days = policy.days_for(tenant)
        if days is None:
            continue
        cutoff = now - timedelta(days=days)
        mine = newest.filter(pc.and_(pc.equal(newest["tenant"], tenant), pc.less(newest["ts_max"], cutoff)))
        if mine.num_rows:
            expired[tenant] = sorted(mine["rollout_id"].to_pylist())
    return expired


def apply_retention(
    lake: Lake,
    policy: RetentionPolicy,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> list[ForgetReport]:
    """Forget every expired rollout, one audited forget per tenant."""
    now = clock()
    return [
        forget(lake, ForgetRequest(tenant=tenant, rollouts=tuple(rollouts), kind="retention",
                                   reason=f"retention {policy.days_for(tenant)} days"), clock=clock)
        for tenant, rollouts in expired_rollouts(lake, policy, now=now).items()
    ]
