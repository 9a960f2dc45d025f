"""A cron scheduler that runs each job once per window, across restarts and instances.

A ``Job`` fires on a cron expression (UTC). Each fire time ``t`` closes the
window ``[t - window, t)`` (by default the window since the previous fire
time), keyed by ``t``. ``Scheduler.run_pending`` runs, for every job, the
window of its latest fire time (or, on request, every window since a
backfill date) unless the ``runs`` table shows it done or held.

Exactly once: taking a run is a Delta commit carrying the app transaction
``run:<job>:<window>``; delta-rs refuses the second of two concurrent commits
with the same app transaction id, so two scheduler instances never both take
a window (see ``store.runs``). A taken run holds a lease that a heartbeat
thread renews while the job runs; if its scheduler dies, another instance (or
the restarted one) takes the run over once the lease has expired, counting
the lost attempt. A job that raises is retried with exponential backoff
(``backoff``, doubled per attempt) up to ``max_attempts``; every attempt, its
error and the final results are rows in ``runs``.

Jobs must be idempotent for their window (a takeover after a lost lease can
repeat work the dead scheduler had begun), which is why they receive the
window rather than "now".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from croniter import CroniterBadDateError, croniter

from store.claims import Heartbeat
from store.lake import Lake
from store.runs import FINAL_STATUSES, ClaimLost, RunRecord, RunsTable, RunStatus, claim_app_id

log = logging.getLogger(__name__)

MAX_BACKFILL_WINDOWS = 10_000
CLAIM_RACES = 5
"""How often to re-read the table after losing a claim race before giving the window up this pass."""


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Window:
    """The time range a run covers: ``[start, end)``, keyed by its end."""

    start: datetime
    end: datetime

    @property
    def key(self) -> str:
        return self.end.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Job:
    """A named callable that runs once per cron window.

    ``run(window)`` returns results to record (``dataset_version`` and
    ``checkpoint`` get their own columns, the rest is kept as JSON) and
    raises to fail the attempt.

    >>> job = Job("nightly", "0 2 * * *", run=lambda w: {"rows": 0})
    >>> job.window_ending(datetime(2026, 1, 2, 2, tzinfo=timezone.utc)).key
    '2026-01-02T02:00:00Z'
    """

    name: str
    cron: str
    run: Callable[[Window], Mapping[str, Any] | None]
    window: timedelta | None = None
    """Window length; None: from the previous fire time to this one."""
    max_attempts: int = 3
    backoff: timedelta = timedelta(seconds=30)
    """Delay before the first retry; doubles with each further attempt."""

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name or not self.name.isprintable():
            raise ValueError(f"job name {self.name!r}: use a non-empty printable name without ':'")
        if not croniter.is_valid(self.cron):
            raise ValueError(f"job {self.name}: {self.cron!r} is not a cron expression (e.g. '0 2 * * *' = 02:00 UTC daily)")
        try:  # croniter accepts dates that never come (Feb 30), then fails at every next-fire computation
            croniter(self.cron, datetime(2000, 1, 1, tzinfo=timezone.utc)).get_next(datetime)
        except CroniterBadDateError:
            raise ValueError(f"job {self.name}: {self.cron!r} never fires (no such date); pick a day every month or "
                             f"year has") from None
        if self.max_attempts < 1:
            raise ValueError(f"job {self.name}: max_attempts must be >= 1, got {self.max_attempts}")
        if self.window is not None and self.window <= timedelta(0):
            raise ValueError(f"job {self.name}: window must be positive, got {self.window}")

    def window_ending(self, end: datetime) -> Window:
        start = end - self.window if self.window else croniter(self.cron, end).get_prev(datetime)
        return Window(start=start, end=end)

    def latest_fire(self, now: datetime) -> datetime:
        """The newest fire time at or before ``now``."""
        candidate = croniter(self.cron, now).get_prev(datetime)
        following = croniter(self.cron, candidate).get_next(datetime)
        return following if following <= now else candidate

    def due_windows(self, now: datetime, *, backfill_from: datetime | None = None) -> list[Window]:
        """The latest window, or every window ending in ``[backfill_from, now]``."""
        if backfill_from is None:
            return [self.window_ending(self.latest_fire(now))]
        ends: list[datetime] = []
        fires = croniter(self.cron, backfill_from - timedelta(seconds=1))
        while (end := fires.get_next(datetime)) <= now:
            ends.append(end)
            if len(ends) > MAX_BACKFILL_WINDOWS:
                raise ValueError(
                    f"job {self.name}: more than {MAX_BACKFILL_WINDOWS} windows since {backfill_from:%Y-%m-%d %H:%M}; "
                    "backfill a shorter range"
                )
        return [self.window_ending(end) for end in ends]


class Scheduler:
    """Runs due windows of ``jobs`` exactly once, recording history in ``runs``."""

    def __init__(
        self,
        lake: Lake,
        jobs: list[Job],
        *,
        owner: str | None = None,
        lease: timedelta = timedelta(minutes=10),
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        names = [job.name for job in jobs]
        if not jobs:
            raise ValueError("a scheduler needs at least one job")
        if len(set(names)) != len(names):
            raise ValueError(f"job names must be unique, got {names}")
        self.runs = RunsTable(lake)
        self.jobs = jobs
        self.owner = owner or f"scheduler-{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.clock = clock
        self.sleep = sleep

    def run_pending(
        self, *, backfill_from: datetime | None = None, stop: threading.Event | None = None,
    ) -> list[RunRecord]:
        """One pass: run every due window this instance manages to take; their final rows.

        Once ``stop`` is set, no further window starts and a run waiting for its retry stops waiting (give the
        scheduler ``sleep=stop.wait``): its ``failed`` row (with ``retry_at``) is returned and a later pass or
        another instance retries it.
        """
        now = self.clock()
        trigger = "backfill" if backfill_from else "schedule"
        finished = []
        for job in self.jobs:
            windows = job.due_windows(now, backfill_from=backfill_from)
            runs = self.runs.current(job=job.name, window_keys={w.key for w in windows})  # not the job's whole history
            done = {key for (_, key), r in runs.items() if r.status in FINAL_STATUSES}
            for window in windows:
                if stop is not None and stop.is_set():
                    return finished
                if window.key in done:
                    continue
                record = self.run_window(job, window, trigger=trigger, stop=stop)
                if record is not None:
                    finished.append(record)
        return finished

    def run_window(
        self, job: Job, window: Window, *, trigger: str = "schedule", stop: threading.Event | None = None,
    ) -> RunRecord | None:
        """Take and run one window; None when it is done, held elsewhere, or was lost."""
        try:
            running = self._take(job, window, trigger)
            return self._attempts(job, window, running, stop) if running else None
        except ClaimLost as exc:
            log.warning("run.claim_lost job=%s window=%s owner=%s reason=%r", job.name, window.key, self.owner, str(exc))
            return None

    def serve(self, stop: threading.Event, *, poll: timedelta = timedelta(seconds=60)) -> None:
        """Run pending windows until ``stop`` is set, waking at fire times and every ``poll``."""
        while not stop.is_set():
            try:
                self.run_pending(stop=stop)
            except Exception:  # the lake or the store is unreachable: log, wait, try again
                log.exception("scheduler.pass_failed owner=%s", self.owner)
            now = self.clock()
            next_fire = min(croniter(job.cron, now).get_next(datetime) for job in self.jobs)
            wait = min(next_fire - now, poll).total_seconds()
            log.debug("scheduler.sleep owner=%s seconds=%.1f", self.owner, wait)
            stop.wait(max(wait, 0.0))

    def _take(self, job: Job, window: Window, trigger: str) -> RunRecord | None:
        for _ in range(CLAIM_RACES):
            snapshot = self.runs.snapshot()
            current = self.runs.latest(snapshot, job.name, window.key)
            now = self.clock()
            if current is not None and (current.status in FINAL_STATUSES or _held(current, now)):
                return None
            attempt = 1 if current is None else current.attempt + 1
            claim = (snapshot.transaction_version(claim_app_id(job.name, window.key)) or 0) + 1
            row = RunRecord(
                job=job.name, window_key=window.key, window_start=window.start, window_end=window.end,
                trigger=trigger, claim=claim, attempt=attempt, status=RunStatus.RUNNING, owner=self.owner,
                started_at=now, recorded_at=now, lease_until=now + self.lease,
            )
            if attempt > job.max_attempts:
                row = row.evolve(status=RunStatus.GAVE_UP, ended_at=now, lease_until=None,
                                 error=f"attempt {current.attempt} lost its lease (its scheduler stopped); no attempts left")
            try:
                self.runs.claim(row, snapshot)
            except ClaimLost:
                continue
            log.info("run.taken job=%s window=%s attempt=%d claim=%d owner=%s", job.name, window.key, attempt, claim, self.owner)
            return row if row.status is RunStatus.RUNNING else None
        return None

    def _attempts(self, job: Job, window: Window, running: RunRecord, stop: threading.Event | None) -> RunRecord:
        while True:
            with _Heartbeat(self, running) as heartbeat:
                try:
                    results, error = dict(job.run(window) or {}), None
                except Exception as exc:  # a job's failure is recorded, never fatal to the scheduler
                    results, error = {}, f"{type(exc).__name__}: {exc}"
            running = heartbeat.latest
            now = self.clock()
            if error is None:
                return self._finish(running.evolve(
                    status=RunStatus.SUCCEEDED, ended_at=now, recorded_at=now, lease_until=None,
                    dataset_version=_int_or_none(results.get("dataset_version")),
                    checkpoint=_str_or_none(results.get("checkpoint")), results=results,
                ))
            log.warning("run.failed job=%s window=%s attempt=%d error=%r", job.name, window.key, running.attempt, error)
            if running.attempt >= job.max_attempts:
                return self._finish(running.evolve(
                    status=RunStatus.GAVE_UP, ended_at=now, recorded_at=now, lease_until=None, error=error,
                ))
            delay = job.backoff * (2 ** (running.attempt - 1))
            failed = running.evolve(status=RunStatus.FAILED, ended_at=now, recorded_at=now, error=error,
                                    retry_at=now + delay, lease_until=now + delay + self.lease)
            self.runs.record(failed)
            self.sleep(delay.total_seconds())  # give the scheduler sleep=stop.wait to wake it on stop
            if stop is not None and stop.is_set():
                return failed
            now = self.clock()
            running = failed.evolve(status=RunStatus.RUNNING, attempt=failed.attempt + 1, started_at=now,
                                    recorded_at=now, ended_at=None, error=None, retry_at=None,
                                    lease_until=now + self.lease)
            self.runs.record(running)

    def _finish(self, record: RunRecord) -> RunRecord:
        self.runs.record(record)
        log.info("run.%s job=%s window=%s attempt=%d", record.status, record.job, record.window_key, record.attempt)
        return record


class _Heartbeat(Heartbeat):
    """Renews a running row's lease every third of the lease while the job runs."""

    def __init__(self, scheduler: Scheduler, running: RunRecord) -> None:
        super().__init__(self._renew, every_s=scheduler.lease.total_seconds() / 3, name=f"run:{running.job}")
        self.scheduler = scheduler
        self.latest = running

    def _renew(self) -> None:
        now = self.scheduler.clock()
        renewed = self.latest.evolve(recorded_at=now, lease_until=now + self.scheduler.lease)
        self.scheduler.runs.record(renewed)
        self.latest = renewed


def _held(record: RunRecord, now: datetime) -> bool:
    return record.lease_until is not None and record.lease_until > now


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
