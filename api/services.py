"""What the query API does, without HTTP: tenant SQL, rollouts, datasets, lineage.

Every method takes the tenant the caller authenticated as and sees only that
tenant's rows: SQL and listings run in a ``store.tenant_sql`` sandbox (the
tenant's rows only, nothing else reachable) inside a worker process
(``workers``: hard time and memory limits), trajectories are read with the
tenant's filter, and dataset versions and lineage are cut down to what was
built for the tenant alone (``visibility``). Lookups of anything the tenant
may not see fail exactly like lookups of things that do not exist.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.compute as pc

from api.visibility import VisibleVersion, visible_versions
from api.workers import RemoteSandbox, TableRef, WorkerLimits, WorkerPool
from pipelines.lineage.trace import Lineage, LineageNotFound, lineage
from pipelines.datasets.registry import DatasetNotFound
from schemas.tables import ROLLOUTS_VIEW, TYPED_TABLES, dataset_table
from store.lake import Lake
from store.sql import LakeMissing, QueryError, view_name
from store.tenant_sql import QueryPage, SandboxLimits
from store.trajectory import RolloutNotFound, RolloutSummary, Trajectory, load_trajectory

log = logging.getLogger(__name__)

_OWNED_EVENTS = "WITH wanted AS (SELECT unnest(?::VARCHAR[]) AS rollout_id) " + " UNION ALL ".join(
    f"SELECT rollout_id, event_id FROM {name} WHERE rollout_id IN (SELECT rollout_id FROM wanted)"
    for name, _ in TYPED_TABLES.values()
)
"""The tenant's events (in the typed tables lineage reads) of the given rollouts."""


class NotFound(LookupError):
    """Nothing of that id the tenant may see (it may not exist, or belong to someone else)."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class Busy(RuntimeError):
    """Every query slot is taken, or every slot the caller's tenant may hold."""


class TenantSlots:
    """At most ``total`` queries at once, at most ``per_tenant`` of them for any one tenant (thread-safe).

    ``per_tenant`` below ``total`` keeps room for other tenants: one tenant's long queries slow only itself.
    """

    def __init__(self, total: int, per_tenant: int) -> None:
        if not 1 <= per_tenant <= total:
            raise ValueError(f"per-tenant query slots ({per_tenant}) must be between 1 and the total ({total})")
        self.total, self.per_tenant = total, per_tenant
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        with self._lock:
            if self._held[tenant] >= self.per_tenant:
                raise Busy(f"your tenant already has {self.per_tenant} queries running (the per-tenant limit)")
            if sum(self._held.values()) >= self.total:
                raise Busy(f"{self.total} queries are already running")
            self._held[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[tenant] -= 1


@dataclasses.dataclass(frozen=True)
class PageLimits:
    """Rows per page: ``default`` when the caller names none, never more than ``cap``."""

    default: int = 100
    cap: int = 1000

    def clamp(self, requested: int | None) -> int:
        return self.default if requested is None else min(requested, self.cap)


class QueryService:
    """The query API's operations over one lake.

    >>> svc = QueryService(Lake("./lake"))  # doctest: +SKIP
    >>> svc.run_sql("acme", "SELECT count(*) FROM rollouts", limit=10).table  # doctest: +SKIP
    """

    def __init__(self, lake: Lake, *, limits: SandboxLimits = SandboxLimits(), pages: PageLimits = PageLimits(),
                 snapshot_ttl_s: float = 2.0, max_concurrent: int = 4, per_tenant: int | None = None,
                 worker_limits: WorkerLimits = WorkerLimits()) -> None:
        self.lake = lake
        self.limits = limits
        self.pages = pages
        self.slots = TenantSlots(max_concurrent, per_tenant or max(1, max_concurrent // 2))
        self.workers = WorkerPool(lake.root, limits, worker_limits, workers=max_concurrent,
                                  snapshot_ttl_s=snapshot_ttl_s)

    def close(self) -> None:
        """Stop the worker processes."""
        self.workers.close()

    @contextmanager
    def sandbox(self, tenant: str, *, datasets: bool = False) -> Iterator[RemoteSandbox]:
        """A query slot and the tenant's sandbox (with its visible datasets as ``datasets__NAME`` views)."""
        with self.slots.hold(tenant):
            extra = self._dataset_views(tenant) if datasets else None
            with self.workers.session(tenant, extra) as box:
                yield box

    def _dataset_views(self, tenant: str) -> dict[str, TableRef]:
        """Each dataset built for ``tenant`` alone, at its newest version whose rows are still readable."""
        views = {}
        for name, versions in visible_versions(self.lake, tenant).items():
            readable = [v for v in versions if v.read_version is not None]
            if readable:
                views[view_name(dataset_table(name))] = (dataset_table(name), readable[-1].read_version)
        return views

    def run_sql(self, tenant: str, sql: str, *, limit: int | None = None, offset: int = 0) -> QueryPage:
        """One page of a tenant's SELECT (``QueryRefused``, ``QueryTimeout``, ``QueryError``, ``Busy``)."""
        started = time.perf_counter()
        try:
            with self.sandbox(tenant, datasets=True) as box:
                page = box.query(sql, limit=self.pages.clamp(limit), offset=offset)
        except QueryError as e:
            log.info("sql_failed tenant=%s chars=%d error=%s reason=%r", tenant, len(sql), type(e).__name__,
                     e.message[:200])
            raise
        log.info("sql tenant=%s chars=%d rows=%d more=%s elapsed_ms=%.0f", tenant, len(sql), page.table.num_rows,
                 page.more, (time.perf_counter() - started) * 1000)
        return page

    def views(self, tenant: str) -> dict[str, list[tuple[str, str]]]:
        """View name -> [(column, type)] the tenant can query."""
        with self.sandbox(tenant, datasets=True) as box:
            return box.describe()

    def list_rollouts(self, tenant: str, *, task_id: str | None = None, harness: str | None = None,
                      status: str | None = None, limit: int | None = None,
                      offset: int = 0) -> tuple[list[RolloutSummary], bool]:
        """The tenant's rollouts, newest first; ``harness`` is ``NAME`` or ``NAME@VERSION``. Returns (page, more)."""
        where, params = ["true"], []
        if task_id is not None:
            where.append("task_id = ?")
            params.append(task_id)
        if harness is not None:
            name, _, version = harness.partition("@")
            where.append("harness_name = ?")
            params.append(name)
            if version:
                where.append("harness_version = ?")
                params.append(version)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        limit = self.pages.clamp(limit)
        sql = (f"SELECT * EXCLUDE (metadata, rewards, first_event_at, last_event_at) FROM {ROLLOUTS_VIEW} "
               f"WHERE {' AND '.join(where)} ORDER BY first_event_at DESC, rollout_id LIMIT ? OFFSET ?")
        with self.sandbox(tenant) as box:
            rows = box.execute(sql, [*params, limit + 1, offset]).to_pylist()
        return [RolloutSummary(**row) for row in rows[:limit]], len(rows) > limit

    def trajectory(self, tenant: str, rollout_id: str) -> Trajectory:
        """One of the tenant's rollouts with every step in order."""
        with self.slots.hold(tenant):
            try:
                return load_trajectory(self.lake, rollout_id, tenant=tenant)
            except (RolloutNotFound, LakeMissing):
                raise NotFound(f"no rollout {rollout_id!r}", hint="GET /v1/rollouts lists your rollouts") from None

    def datasets(self, tenant: str) -> dict[str, list[VisibleVersion]]:
        """Dataset name -> versions built for the tenant alone."""
        return visible_versions(self.lake, tenant)

    def dataset(self, tenant: str, name: str,
                version: int | None = None) -> tuple[VisibleVersion, list[VisibleVersion]]:
        """(the asked version, or the newest; every visible version) of one dataset."""
        versions = visible_versions(self.lake, tenant).get(name, [])
        chosen = [v for v in versions if version is None or v.version == version]
        if not chosen:
            what = f"dataset {name!r}" + ("" if version is None else f" version {version}")
            raise NotFound(f"no {what}", hint="GET /v1/datasets lists the datasets built from your rollouts only")
        return chosen[-1], versions

    def lineage(self, tenant: str, ref: str) -> Lineage:
        """``pipelines.lineage.trace`` cut down to the tenant: its events, rollouts and its own dataset versions."""
        hint = "pass a dataset NAME@VERSION, checkpoint id, rollout id or event id of yours"
        try:
            found = lineage(self.lake, ref, tenant=tenant)
        except (LineageNotFound, DatasetNotFound, ValueError):
            raise NotFound(f"nothing of yours has the id {ref!r}", hint=hint) from None
        mine = {(v.dataset, v.version) for vs in visible_versions(self.lake, tenant).values() for v in vs}
        datasets = [u for u in found.datasets if (u.dataset, u.version) in mine]
        if found.kind in ("dataset", "checkpoint") and not datasets:
            raise NotFound(f"nothing of yours has the id {ref!r}", hint=hint)
        with self.sandbox(tenant) as box:
            owned = box.execute(_OWNED_EVENTS, [list(found.rollouts)])
        events = found.events
        if events is not None:
            events = events.filter(pc.is_in(events["event_id"], owned["event_id"]))
        no_events = events is None or events.num_rows == 0
        if (found.kind == "event" and no_events) or (found.kind == "rollout" and no_events and not datasets):
            raise NotFound(f"nothing of yours has the id {ref!r}", hint=hint)
        owned_rollouts = set(owned["rollout_id"].to_pylist())
        return dataclasses.replace(
            found,
            datasets=datasets,
            checkpoints=[c for c in found.checkpoints if (c.dataset, c.version) in mine],
            rollouts=[r for r in found.rollouts if r in owned_rollouts or datasets],
            events=events,
        )
