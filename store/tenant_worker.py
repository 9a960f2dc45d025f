"""The worker process side of the query API's sandboxes (the server side is ``api.workers``).

A worker warms up (DuckDB's threads and allocator exist), caps its own
address space (``RLIMIT_AS``: its size then + ``memory_bytes``), and answers
requests on its pipe until the pipe closes: ``("open", tenant, extra)``,
``("query", sql, limit, offset)``, ``("execute", sql, params)``,
``("describe",)``, ``("close",)``. Each answer is ``("ok", value)`` or
``("error", kind, message, hint)``; tables travel as Arrow IPC bytes. It
imports only ``store`` so that it starts fast.

A query that hit the cap can leave the worker's address space near it
(DuckDB's buffers, allocator arenas); the next tenant's ``open`` would then
fail on a small allocation. So at ``close`` a worker with less than
``RETIRE_HEADROOM`` of its budget left answers ``("ok", "retire")`` and exits.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from schemas.tables import EVENTS_TABLE
from store.arenas import limit_arenas
from store.lake import Lake
from store.sql import QueryError
from store.tenant_sql import (
    SandboxLimits,
    SnapshotCache,
    TenantSandbox,
    delta_dataset,
    empty_snapshot,
    open_tenant_sandbox,
)

TableRef = tuple[str, int | None]
"""(Delta table name, version) of a relation a session exposes besides the tenant tables."""

RETIRE_HEADROOM = 0.25
"""Fraction of ``memory_bytes`` a worker must still have free at ``close`` to serve another session."""

REPORTED_ERRORS = frozenset({"QueryRefused", "QueryTimeout", "WriteRefused", "QueryError"})
"""Query errors reported by their class name; any other ``QueryError`` as ``QueryError``."""


def serve(conn: Connection, root: str, limits: SandboxLimits, memory_bytes: int, snapshot_ttl_s: float) -> None:
    """The worker's loop: warm up, cap the address space, then answer requests until the pipe closes."""
    limit_arenas()  # each thread arena reserves 64 MB of address space: two keep the cap about real memory
    with open_tenant_sandbox(empty_snapshot(), "warm-up", limits=limits) as box:
        # DuckDB's threads and allocator exist before the cap
        box.query(f"SELECT count(*) FROM {EVENTS_TABLE}", limit=1)
    session = _Session(Lake(root), limits, snapshot_ttl_s)
    cap = _cap_address_space(memory_bytes)
    conn.send(("ready",))
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = session.handle(op, args)
            if op == "close" and cap - _address_space() < RETIRE_HEADROOM * memory_bytes:
                conn.send(("ok", "retire"))
                return
            conn.send(("ok", answer))
        except QueryError as e:
            kind = type(e).__name__ if type(e).__name__ in REPORTED_ERRORS else "QueryError"
            conn.send(("error", kind, e.message, e.hint))
        except MemoryError:
            conn.send(("error", "QueryError", "the query needed more memory than one query may use",
                       "aggregate or filter instead of building huge values (long strings, lists)"))
        except Exception as e:  # noqa: BLE001 - reported to the server, which logs it
            conn.send(("error", "internal", f"{type(e).__name__}: {e}", ""))


class _Session:
    """The worker's state: the lake snapshot, opened dataset versions, and the sandbox of the current request."""

    def __init__(self, lake: Lake, limits: SandboxLimits, snapshot_ttl_s: float) -> None:
        self.lake, self.limits = lake, limits
        self.snapshots = SnapshotCache(lake, ttl_s=snapshot_ttl_s)
        self.datasets: dict[TableRef, Any] = {}
        self.box: TenantSandbox | None = None
        try:
            self.snapshots.get()  # the first read of the Delta logs is the slow one: pay it before the first query
        except Exception:  # noqa: BLE001 - the first query reports what is wrong with the lake
            pass

    def handle(self, op: str, args: list[Any]) -> Any:
        if op == "open":
            return self.open(*args)
        if op == "close":
            if self.box is not None:
                self.box.close()
            self.box = None
            return None
        if self.box is None:
            raise ValueError(f"{op!r} before 'open'")
        if op == "query":
            sql, limit, offset = args
            page = self.box.query(sql, limit=limit, offset=offset)
            return _ipc(page.table), page.more
        if op == "execute":
            return _ipc(self.box.execute(*args))
        if op == "describe":
            return self.box.describe()
        raise ValueError(f"unknown request {op!r}")

    def open(self, tenant: str, extra: dict[str, TableRef]) -> frozenset[str]:
        if len(self.datasets) > 64:
            self.datasets.clear()
        for ref in extra.values():
            if ref not in self.datasets:
                self.datasets[ref] = delta_dataset(self.lake, ref[0], version=ref[1])
        self.box = open_tenant_sandbox(self.snapshots.get(), tenant, limits=self.limits,
                                       extra={view: self.datasets[ref] for view, ref in extra.items()})
        return self.box.relations


def _address_space() -> int:
    """This process's virtual size in bytes (what ``RLIMIT_AS`` limits)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _cap_address_space(extra_bytes: int) -> int:
    """Cap the address space at its size now + ``extra_bytes``; the cap."""
    import resource

    cap = _address_space() + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
