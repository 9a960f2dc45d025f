"""Tenant sandboxes in worker processes, so a query cannot outrun its time or memory limit.

DuckDB's interrupt and memory limit do not reach inside a long scalar
function (nine nested ``replace`` calls ran 68 s past a 10 s limit and took
the server to 4.5 GB). So every tenant sandbox lives in a worker process:

* the worker's address space is capped (``RLIMIT_AS`` = its size once warm +
  ``WorkerLimits.memory_bytes``): an allocation past it fails, and the query
  with it (or the worker dies; the server answers either way);
* the server waits at most ``timeout_s + grace_s`` for each answer, then kills
  the worker (SIGKILL) and starts a fresh one in the background;
* workers stay warm between queries (one per query slot), so the common query
  pays no process start.

The server process itself never reads tenant rows for SQL: results come back
as Arrow IPC bytes already cut to ``max_result_bytes``.

>>> pool = WorkerPool("./lake", SandboxLimits(), WorkerLimits(), workers=4)  # doctest: +SKIP
>>> with pool.session("acme") as box:  # doctest: +SKIP
...     box.query("SELECT count(*) FROM rollouts", limit=10).table
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from store.sql import QueryError, WriteRefused
from store.tenant_sql import QueryPage, QueryRefused, QueryTimeout, SandboxLimits
from store.tenant_worker import TableRef, serve

log = logging.getLogger(__name__)

_ERRORS: dict[str, type[QueryError]] = {
    "QueryRefused": QueryRefused, "QueryTimeout": QueryTimeout, "WriteRefused": WriteRefused, "QueryError": QueryError,
}
"""The query errors a worker reports by name (anything else is the server's fault)."""


@dataclass(frozen=True)
class WorkerLimits:
    """What a worker process may use beyond the sandbox's own (soft) limits."""

    memory_bytes: int = 2 << 30
    """Address space a worker may add once warm (``RLIMIT_AS``); past it allocations fail."""
    grace_s: float = 0.5
    """How long past the query's time limit the server waits before it kills the worker."""
    start_timeout_s: float = 60.0
    """How long a request waits for a worker to start (only after kills or at server start)."""
    open_timeout_s: float = 60.0
    """How long opening a session may take (re-reading the Delta logs of a large lake; no tenant SQL runs)."""


class WorkersUnavailable(RuntimeError):
    """No worker could serve the request: none started in time, or one failed on the server's side."""


class WorkerDied(QueryError):
    """The worker stopped mid-query (it hit its memory cap or was killed at the deadline)."""


class _Worker:
    """One worker process and the server's end of its pipe."""

    def __init__(self, context: multiprocessing.context.BaseContext, root: str, limits: SandboxLimits,
                 worker_limits: WorkerLimits, snapshot_ttl_s: float) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, root, limits, worker_limits.memory_bytes,
                                                             snapshot_ttl_s), name="trajlake-query-worker", daemon=True)
        self.process.start()
        child.close()

    def ready(self, timeout_s: float) -> bool:
        """Wait for the worker's start message; False when it did not come (the worker is then killed)."""
        try:
            if self.conn.poll(timeout_s) and self.conn.recv() == ("ready",):
                return True
        except (EOFError, OSError):
            pass
        self.kill()
        return False

    def call(self, request: tuple[Any, ...], *, limit_s: float, grace_s: float) -> Any:
        """Send one request; its answer, or ``QueryTimeout`` / ``WorkerDied`` (the worker is then dead).

        The worker interrupts its own query at ``limit_s``; past ``limit_s + grace_s`` it is killed.
        """
        try:
            self.conn.send(request)
            answered = self.conn.poll(limit_s + grace_s)
            reply = self.conn.recv() if answered else None
        except (EOFError, OSError, BrokenPipeError):
            self.kill()
            raise WorkerDied("the query's worker process stopped, most likely because the query needed more "
                             "memory than one query may use",
                             hint="aggregate or filter instead of building huge values (long strings, lists)") from None
        if reply is None:
            self.kill()
            raise QueryTimeout(f"query stopped after {limit_s:g} s (the limit)",
                               hint="filter earlier (WHERE on task_id, rollout_id or ts), aggregate, "
                                    "or select fewer columns")
        status, *rest = reply
        if status == "ok":
            return rest[0]
        kind, message, hint = rest
        if kind in _ERRORS:
            raise _ERRORS[kind](message, hint=hint)
        log.error("query_worker_error request=%s error=%s", request[0], message)
        raise WorkersUnavailable(f"the query worker failed: {message}")

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        """Stop the process now (idempotent; the pool and a request may both get here)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        try:
            self.conn.close()
        except OSError:  # closed by the other caller
            pass


class RemoteSandbox:
    """A tenant sandbox in a worker: ``query``, ``execute`` and ``describe`` like ``TenantSandbox``."""

    def __init__(self, worker: _Worker, tenant: str, relations: frozenset[str], limits: SandboxLimits,
                 worker_limits: WorkerLimits) -> None:
        self._worker = worker
        self.tenant = tenant
        self.relations = relations
        self.limits = limits
        self._times = {"limit_s": limits.timeout_s, "grace_s": worker_limits.grace_s}

    def query(self, sql: str, *, limit: int, offset: int = 0) -> QueryPage:
        """Tenant SQL (checked in the worker); at most ``limit`` rows after ``offset``, at most
        ``max_result_bytes``."""
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must be >= 0")
        data, more = self._worker.call(("query", sql, limit, offset), **self._times)
        return QueryPage(_table(data), offset, more)

    def execute(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        """The server's own parameterised SQL on the tenant's relations."""
        return _table(self._worker.call(("execute", sql, params or []), **self._times))

    def describe(self) -> dict[str, list[tuple[str, str]]]:
        """View name -> [(column, DuckDB type)] of every relation the tenant can query."""
        return self._worker.call(("describe",), **self._times)


class WorkerPool:
    """Worker processes, up to one per query slot: ``warm`` start with the pool, more as requests need them;
    a killed or dead worker is replaced in the background."""

    def __init__(self, root: str, limits: SandboxLimits, worker_limits: WorkerLimits = WorkerLimits(), *,
                 workers: int = 4, warm: int = 2, snapshot_ttl_s: float = 2.0) -> None:
        self.root = root
        self.limits = limits
        self.worker_limits = worker_limits
        self.snapshot_ttl_s = snapshot_ttl_s
        self.max_workers = workers
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded server
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._closed = threading.Event()
        self._all: set[_Worker] = set()
        self._starting = 0
        self._lock = threading.Lock()
        for _ in range(min(warm, workers)):
            self._start_one()

    def _start_one(self) -> None:
        with self._lock:
            self._starting += 1
        threading.Thread(target=self._start, name="query-worker-start", daemon=True).start()

    def _start(self) -> None:
        worker = None
        try:
            if self._closed.is_set():
                return
            worker = _Worker(self._context, self.root, self.limits, self.worker_limits, self.snapshot_ttl_s)
            with self._lock:
                self._all.add(worker)
            if not worker.ready(self.worker_limits.start_timeout_s) and not self._closed.is_set():
                log.error("query_worker_failed_to_start pid=%s", worker.process.pid)
        finally:
            with self._lock:
                self._starting -= 1
                if worker is not None and not worker.alive:
                    self._all.discard(worker)
        if worker is None:
            return
        if self._closed.is_set():
            worker.kill()
        elif worker.alive:
            self._idle.put(worker)

    def _take(self) -> _Worker:
        """An idle worker; starts one more when none is idle and the pool may grow."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            grow = len(self._all) + self._starting < self.max_workers
        if grow:
            self._start_one()
        try:
            return self._idle.get(timeout=self.worker_limits.start_timeout_s)
        except queue.Empty:
            log.error("query_worker_unavailable waited_s=%s", self.worker_limits.start_timeout_s)
            raise WorkersUnavailable("no query worker started in time") from None

    @contextmanager
    def session(self, tenant: str, extra: Mapping[str, TableRef] | None = None) -> Iterator[RemoteSandbox]:
        """A worker holding ``tenant``'s sandbox (plus ``extra`` Delta tables by view name) for the block."""
        worker, relations = self._open(tenant, extra)
        times = {"limit_s": self.limits.timeout_s, "grace_s": self.worker_limits.grace_s}
        try:
            yield RemoteSandbox(worker, tenant, relations, self.limits, self.worker_limits)
        finally:
            if worker.alive:
                try:
                    if worker.call(("close",), **times) == "retire":  # near its memory cap: exits by itself
                        worker.kill()
                except (QueryError, WorkersUnavailable):
                    worker.kill()
            self._give_back(worker)

    def _open(self, tenant: str, extra: Mapping[str, TableRef] | None) -> tuple[_Worker, frozenset[str]]:
        """A worker with ``tenant``'s sandbox open. Opening runs no tenant SQL, so a worker that dies
        doing it was unfit (e.g. left near its cap): one retry on a fresh worker."""
        retries = 1
        while True:
            worker = self._take()
            try:
                return worker, worker.call(("open", tenant, dict(extra or {})),
                                           limit_s=self.worker_limits.open_timeout_s,
                                           grace_s=self.worker_limits.grace_s)
            except WorkerDied:
                self._give_back(worker)
                if not retries:
                    raise
                retries -= 1
                log.warning("query_worker_died_on_open tenant=%s retrying=1", tenant)
            except BaseException:
                self._give_back(worker)
                raise

    def _give_back(self, worker: _Worker) -> None:
        if worker.alive and not self._closed.is_set():
            self._idle.put(worker)
            return
        with self._lock:
            self._all.discard(worker)
        worker.kill()
        self._start_one()

    def close(self) -> None:
        """Stop every worker."""
        self._closed.set()
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until a worker is idle (the server can answer queries) or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while self._idle.qsize() < 1 and time.monotonic() < deadline and not self._closed.is_set():
            time.sleep(0.05)
        return self._idle.qsize() >= 1

    def idle(self) -> int:
        """Workers started and waiting for a request."""
        return self._idle.qsize()

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and metrics)."""
        with self._lock:
            return [w.process.pid for w in self._all if w.process.pid is not None and w.alive]


def _table(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()
