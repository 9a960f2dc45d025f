"""Scheduler: windows run once (restart, two instances), retries with backoff, history in ``runs``."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from schemas.tables import dataset_table
from store.lake import Lake
from store.runs import ClaimLost, RunRecord, RunsTable, RunStatus
from store.scheduler import Job, Scheduler, Window

NOW = datetime(2026, 11, 30, 7, 30, tzinfo=timezone.utc)
NIGHTLY = "0 2 * * *"


def writing_job(lake: Lake, name: str = "nightly", **options) -> Job:
    """A real job: appends one row per window to a Delta table ``datasets/out_<name>``."""

    def run(window: Window) -> dict:
        version = lake.append(dataset_table(f"out_{name}"), pa.table({"window": [window.key]}))
        return {"dataset_version": version, "checkpoint": f"ckpt-{window.key}", "rows": 1}

    return Job(name, options.pop("cron", NIGHTLY), run=run, **options)


def windows_written(lake: Lake, name: str = "nightly") -> list[str]:
    if not lake.exists(dataset_table(f"out_{name}")):
        return []
    return sorted(lake.read(dataset_table(f"out_{name}")).column("window").to_pylist())


def test_latest_window_runs_once_across_a_restart(lake: Lake) -> None:
    first = Scheduler(lake, [writing_job(lake)], clock=lambda: NOW).run_pending()
    assert [(r.window_key, r.status) for r in first] == [("2026-11-30T02:00:00Z", RunStatus.SUCCEEDED)]
    assert first[0].window_start == datetime(2026, 11, 29, 2, tzinfo=timezone.utc)
    assert first[0].dataset_version == 0 and first[0].checkpoint == "ckpt-2026-11-30T02:00:00Z"

    restarted = Scheduler(lake, [writing_job(lake)], clock=lambda: NOW + timedelta(hours=3))
    assert restarted.run_pending() == []
    assert windows_written(lake) == ["2026-11-30T02:00:00Z"]


def test_next_fire_time_opens_a_new_window(lake: Lake) -> None:
    Scheduler(lake, [writing_job(lake)], clock=lambda: NOW).run_pending()
    Scheduler(lake, [writing_job(lake)], clock=lambda: NOW + timedelta(days=1)).run_pending()
    assert windows_written(lake) == ["2026-11-30T02:00:00Z", "2026-12-01T02:00:00Z"]


def test_backfill_runs_each_missed_window_once(lake: Lake) -> None:
    scheduler = Scheduler(lake, [writing_job(lake)], clock=lambda: NOW)
    scheduler.run_pending()
    done = scheduler.run_pending(backfill_from=NOW - timedelta(days=3))
    assert [r.window_key for r in done] == ["2026-11-28T02:00:00Z", "2026-11-29T02:00:00Z"]
    assert {r.trigger for r in done} == {"backfill"}
    assert scheduler.run_pending(backfill_from=NOW - timedelta(days=3)) == []
    assert len(windows_written(lake)) == 3 and len(set(windows_written(lake))) == 3


def test_a_pass_reads_the_runs_of_its_due_windows_only(lake: Lake, monkeypatch) -> None:
    """A 5-minute job leaves ~600 runs rows a day: a pass (every minute) reads the rows of the windows it may run,
    not the job's whole history."""
    scheduler = Scheduler(lake, [writing_job(lake)], clock=lambda: NOW)
    scheduler.run_pending(backfill_from=NOW - timedelta(days=3))
    read: list[int] = []
    history = RunsTable.history

    def counted(self, *args, **kwargs):
        rows = history(self, *args, **kwargs)
        read.append(len(rows))
        return rows

    monkeypatch.setattr(RunsTable, "history", counted)
    assert scheduler.run_pending() == []
    assert read == [2]  # the latest window's claim and final row; 6 rows in all


def test_two_concurrent_commits_claiming_one_run_let_exactly_one_win(lake: Lake) -> None:
    runs = RunsTable(lake)
    snapshot_a, snapshot_b = runs.snapshot(), runs.snapshot()
    row = _running("a", claim=1)
    runs.claim(row, snapshot_a)
    with pytest.raises(ClaimLost):
        runs.claim(row.evolve(owner="b"), snapshot_b)
    with pytest.raises(ClaimLost):  # a fresh snapshot sees the claim and stays away
        runs.claim(row.evolve(owner="b"), runs.snapshot())
    assert [r.owner for r in runs.history()] == ["a"]


def test_two_scheduler_instances_run_each_window_once(lake: Lake) -> None:
    start = threading.Barrier(2)

    def instance(owner: str) -> None:
        scheduler = Scheduler(lake, [writing_job(lake)], owner=owner, clock=lambda: NOW)
        start.wait()
        scheduler.run_pending(backfill_from=NOW - timedelta(days=6))

    threads = [threading.Thread(target=instance, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(windows_written(lake)) == 6 and len(set(windows_written(lake))) == 6
    finals = [r for r in RunsTable(lake).current().values()]
    assert len(finals) == 6 and {r.status for r in finals} == {RunStatus.SUCCEEDED}


def test_failed_job_retries_with_backoff_and_records_each_error(lake: Lake) -> None:
    calls: list[str] = []
    delays: list[float] = []

    def flaky(window: Window) -> dict:
        calls.append(window.key)
        if len(calls) < 3:
            raise ConnectionError(f"upstream down (call {len(calls)})")
        return {"checkpoint": "ck-1"}

    job = Job("train", NIGHTLY, run=flaky, max_attempts=3, backoff=timedelta(seconds=5))
    [final] = Scheduler(lake, [job], clock=lambda: NOW, sleep=delays.append).run_pending()
    assert final.status is RunStatus.SUCCEEDED and final.attempt == 3 and final.checkpoint == "ck-1"
    assert delays == [5.0, 10.0]
    failed = [r for r in RunsTable(lake).history() if r.status is RunStatus.FAILED]
    assert [(r.attempt, r.error) for r in failed] == [
        (1, "ConnectionError: upstream down (call 1)"),
        (2, "ConnectionError: upstream down (call 2)"),
    ]
    assert failed[0].retry_at == NOW + timedelta(seconds=5)


def test_job_that_keeps_failing_gives_up_and_is_not_rerun(lake: Lake) -> None:
    calls = []

    def broken(window: Window) -> dict:
        calls.append(1)
        raise ValueError("dataset empty")

    job = Job("build", NIGHTLY, run=broken, max_attempts=2, backoff=timedelta(seconds=1))
    [final] = Scheduler(lake, [job], clock=lambda: NOW, sleep=lambda s: None).run_pending()
    assert final.status is RunStatus.GAVE_UP and final.error == "ValueError: dataset empty" and final.attempt == 2
    assert Scheduler(lake, [job], clock=lambda: NOW, sleep=lambda s: None).run_pending() == []
    assert len(calls) == 2


def test_run_of_a_dead_scheduler_is_taken_over_after_its_lease(lake: Lake) -> None:
    runs = RunsTable(lake)
    dead = _running("dead", claim=1, lease_until=NOW - timedelta(minutes=1))
    runs.claim(dead, runs.snapshot())
    live = Scheduler(lake, [writing_job(lake)], owner="live", clock=lambda: NOW)
    [final] = live.run_pending()
    assert (final.owner, final.attempt, final.claim, final.status) == ("live", 2, 2, RunStatus.SUCCEEDED)
    with pytest.raises(ClaimLost):  # the dead owner can no longer write to the run
        runs.record(dead.evolve(status=RunStatus.SUCCEEDED))


def test_run_whose_last_attempt_lost_its_lease_gives_up(lake: Lake) -> None:
    calls: list[str] = []
    job = Job("nightly", NIGHTLY, run=lambda w: calls.append(w.key) or {}, max_attempts=1)
    runs = RunsTable(lake)
    runs.claim(_running("dead", claim=1, lease_until=NOW - timedelta(seconds=1)), runs.snapshot())
    assert Scheduler(lake, [job], clock=lambda: NOW).run_pending() == []
    [final] = runs.current().values()
    assert final.status is RunStatus.GAVE_UP and "lost its lease" in final.error and calls == []


def test_run_held_under_a_live_lease_is_left_alone(lake: Lake) -> None:
    runs = RunsTable(lake)
    runs.claim(_running("other", claim=1, lease_until=NOW + timedelta(minutes=5)), runs.snapshot())
    assert Scheduler(lake, [writing_job(lake)], clock=lambda: NOW).run_pending() == []
    assert windows_written(lake) == []


def test_heartbeat_renews_the_lease_of_a_long_job(lake: Lake) -> None:
    seen_leases: list[RunRecord] = []
    runs = RunsTable(lake)

    def long_job(window: Window) -> dict:
        for _ in range(200):  # at most ~10 s, then the assertion below fails
            seen_leases[:] = [r for r in runs.history() if r.status is RunStatus.RUNNING]
            if len(seen_leases) >= 2:
                break
            threading.Event().wait(0.05)
        return {}

    job = Job("long", NIGHTLY, run=long_job)
    [final] = Scheduler(lake, [job], lease=timedelta(seconds=0.3)).run_pending()
    assert final.status is RunStatus.SUCCEEDED
    assert len(seen_leases) >= 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "every night"}, "not a cron expression"),
        ({"cron": "61 2 * * *"}, "not a cron expression"),
        ({"name": "a:b"}, "without ':'"),
        ({"name": ""}, "non-empty"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"window": timedelta(0)}, "window must be positive"),
    ],
)
def test_job_rejects_bad_definitions(options: dict, message: str) -> None:
    values = {"name": "nightly", "cron": NIGHTLY, "run": lambda w: {}} | options
    with pytest.raises(ValueError, match=message):
        Job(**values)


def test_scheduler_rejects_duplicate_job_names_and_no_jobs(lake: Lake) -> None:
    with pytest.raises(ValueError, match="unique"):
        Scheduler(lake, [writing_job(lake), writing_job(lake)])
    with pytest.raises(ValueError, match="at least one job"):
        Scheduler(lake, [])


def test_due_windows_at_exact_fire_time_and_fixed_length() -> None:
    job = Job("hourly", "0 * * * *", run=lambda w: {}, window=timedelta(hours=3))
    [window] = job.due_windows(datetime(2026, 1, 1, 5, tzinfo=timezone.utc))
    assert (window.start.hour, window.end.hour, window.key) == (2, 5, "2026-01-01T05:00:00Z")


def test_backfill_over_too_many_windows_is_refused() -> None:
    job = Job("minutely", "* * * * *", run=lambda w: {})
    with pytest.raises(ValueError, match="shorter range"):
        job.due_windows(NOW, backfill_from=NOW - timedelta(days=30))


def test_results_that_are_not_json_are_kept_as_text(lake: Lake) -> None:
    job = Job("odd", NIGHTLY, run=lambda w: {"when": datetime(2026, 1, 1), "dataset_version": "7"})
    [final] = Scheduler(lake, [job], clock=lambda: NOW).run_pending()
    stored = RunsTable(lake).current()[("odd", final.window_key)]
    assert stored.dataset_version == 7 and stored.results["when"] == "2026-01-01 00:00:00"


def _running(owner: str, *, claim: int, lease_until: datetime | None = None) -> RunRecord:
    window = Job("nightly", NIGHTLY, run=lambda w: {}).window_ending(datetime(2026, 11, 30, 2, tzinfo=timezone.utc))
    return RunRecord(
        job="nightly", window_key=window.key, window_start=window.start, window_end=window.end,
        trigger="schedule", claim=claim, attempt=1, status=RunStatus.RUNNING, owner=owner,
        started_at=NOW, recorded_at=NOW, lease_until=lease_until or NOW + timedelta(minutes=10),
    )


# --- the composed jobs and the CLI (real pipelines build, real DeepSpeed-on-CPU training) ---

NIGHT = datetime(2026, 1, 2, 3, tzinfo=timezone.utc)
"""The nightly run of 2026-01-02 02:00 builds from the rollouts of 2026-01-01 (2 h lag), lake_builder's day."""


@pytest.fixture
def rollouts_lake(lake: Lake, tmp_path, monkeypatch) -> Lake:
    from tests.store.lake_builder import sample_rollout, write_events

    monkeypatch.setenv("TRAJLAKE_HOME", str(tmp_path / "home"))  # the tiny base model is built here
    write_events(lake, sample_rollout("r1") + sample_rollout("r2"))
    return lake


def nightly_settings(lake: Lake, tmp_path, **overrides):
    from trajlake.commands.scheduler import SchedulerSettings

    return SchedulerSettings(lake=lake.root, train_out=str(tmp_path / "ck"), compact_cron="", retention_cron="",
                             scheduler_backoff_s=0, **overrides)


def test_nightly_job_builds_and_trains_its_window_once(rollouts_lake: Lake, tmp_path) -> None:
    from typer.testing import CliRunner

    from trainer.records import list_checkpoints
    from trajlake.cli import build_app
    from trajlake.commands.scheduler import build_jobs

    lake = rollouts_lake
    jobs = build_jobs(lake, nightly_settings(lake, tmp_path))
    [final] = Scheduler(lake, jobs, clock=lambda: NIGHT).run_pending()
    assert (final.job, final.status, final.dataset_version) == ("nightly", RunStatus.SUCCEEDED, 0)
    assert final.checkpoint == list_checkpoints(lake, dataset="nightly")[0].checkpoint_id
    assert Scheduler(lake, jobs, clock=lambda: NIGHT + timedelta(hours=5)).run_pending() == []
    assert len(list_checkpoints(lake)) == 1

    shown = CliRunner().invoke(build_app(), ["runs", "--json", "--lake", lake.root])
    assert shown.exit_code == 0, shown.output
    [row] = [json.loads(line) for line in shown.output.splitlines()]
    assert (row["status"], row["checkpoint"], row["window_key"]) == ("succeeded", final.checkpoint, "2026-01-02T02:00:00Z")


def test_nightly_retry_reuses_the_dataset_version_built_for_its_window(rollouts_lake: Lake, tmp_path) -> None:
    from pipelines import list_versions
    from trajlake.commands.scheduler import build_jobs

    lake = rollouts_lake
    settings = nightly_settings(lake, tmp_path, train_model=str(tmp_path / "no-such-model"), scheduler_max_attempts=2)
    [final] = Scheduler(lake, build_jobs(lake, settings), clock=lambda: NIGHT, sleep=lambda s: None).run_pending()
    assert final.status is RunStatus.GAVE_UP and "no-such-model" in final.error
    assert list_versions(lake, "nightly")["version"].to_pylist() == [0]


def test_nightly_window_without_rollouts_succeeds_as_skipped(rollouts_lake: Lake, tmp_path) -> None:
    from trajlake.commands.scheduler import build_jobs

    jobs = build_jobs(rollouts_lake, nightly_settings(rollouts_lake, tmp_path))
    [final] = Scheduler(rollouts_lake, jobs, clock=lambda: NIGHT + timedelta(days=3)).run_pending()
    assert final.status is RunStatus.SUCCEEDED and "no rollout is left" in final.results["skipped"]


def test_compaction_runs_every_few_minutes_and_vacuums_daily(lake: Lake, tmp_path) -> None:
    from trajlake.commands.scheduler import SchedulerSettings, build_jobs

    defaults = SchedulerSettings(lake=lake.root, train_out=str(tmp_path / "ck"), scheduler_cron="")
    assert {(j.name, j.cron) for j in build_jobs(lake, defaults)} == {("compact", "*/5 * * * *"),
                                                                     ("vacuum", "0 4 * * *")}
    assert build_jobs(lake, defaults.model_copy(update={"compact_cron": ""})) == []  # off, with its vacuum


def test_scheduler_cli_runs_a_window_once(lake: Lake) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import build_app

    write_deltalake(lake.uri("events_like"), pa.table({"task_id": ["t"], "rollout_id": ["r"]}))
    runner = CliRunner()
    first = runner.invoke(build_app(), ["scheduler", "--once", "--job", "compact", "--lake", lake.root])
    assert first.exit_code == 0, first.output
    assert "compact" in first.output and "succeeded" in first.output
    again = runner.invoke(build_app(), ["scheduler", "--once", "--job", "compact", "--lake", lake.root])
    assert again.exit_code == 0 and "no runs" in again.output


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"TRAJLAKE_SCHEDULER_CRON": "every night"}, [], "not a cron expression"),
        ({}, ["--job", "nope"], "no job to run"),
        ({"TRAJLAKE_RETENTION_DAYS": "[1]"}, [], "JSON object"),
    ],
)
def test_scheduler_cli_reports_bad_configuration(lake: Lake, env: dict, args: list, message: str) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import build_app

    result = CliRunner().invoke(build_app(), ["scheduler", "--once", "--lake", lake.root, *args], env=env)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output  # bad settings


def test_serve_runs_due_windows_until_stopped(lake: Lake) -> None:
    stop = threading.Event()
    ran: list[str] = []

    def job(window: Window) -> dict:
        ran.append(window.key)
        stop.set()
        return {}

    scheduler = Scheduler(lake, [Job("minutely", "* * * * *", run=job)])
    thread = threading.Thread(target=scheduler.serve, args=(stop,), kwargs={"poll": timedelta(seconds=0.05)})
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(ran) == 1


def test_serve_survives_a_pass_that_fails(lake: Lake) -> None:
    stop = threading.Event()

    class UnreachableOnce(Scheduler):
        passes = 0

        def run_pending(self, **options) -> list[RunRecord]:
            self.passes += 1
            if self.passes == 1:
                raise OSError("object store unreachable")
            finished = super().run_pending(**options)
            stop.set()  # after the pass: a pass that sees stop set starts no window
            return finished

    scheduler = UnreachableOnce(lake, [writing_job(lake, cron="* * * * *")])
    thread = threading.Thread(target=scheduler.serve, args=(stop,), kwargs={"poll": timedelta(seconds=0.01)})
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and scheduler.passes == 2 and len(windows_written(lake)) == 1


def test_two_scheduler_processes_take_each_backfilled_window_once(lake: Lake) -> None:
    import subprocess
    import sys

    write_deltalake(lake.uri("events_like"), pa.table({"task_id": ["t"], "rollout_id": ["r"]}))
    since = (datetime.now(timezone.utc) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%S")
    command = [sys.executable, "-m", "trajlake.cli", "scheduler", "--once", "--job", "compact",
               "--backfill", since, "--lake", lake.root]
    env = {**os.environ, "TRAJLAKE_COMPACT_CRON": "0 4 * * *"}  # daily: three windows in three days
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    history = RunsTable(lake).history()
    # one claim per window across both processes; a slow run adds "running" rows (lease renewals) under that claim
    claims = {(r.window_key, r.claim, r.owner) for r in history if r.status is RunStatus.RUNNING}
    assert len(claims) == len({key for key, _, _ in claims}) == 3, claims
    assert {r.status for r in RunsTable(lake).current().values()} == {RunStatus.SUCCEEDED}


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 4 30 2 *"])
def test_a_cron_that_never_fires_is_refused_when_the_job_is_made(cron):
    """croniter parses Feb 30/31, then fails at every next-fire computation (every pass, and the daemon's wait)."""
    with pytest.raises(ValueError, match="never fires"):
        Job("vacuum", cron, run=lambda w: None)
    Job("leap", "0 0 29 2 *", run=lambda w: None)  # rare, but it comes


def test_a_backfill_range_without_a_window_of_a_job_runs_the_other_jobs(lake: Lake) -> None:
    """--backfill-from 1 h ago: the 5-minute job has 12 windows there, the nightly job none."""
    jobs = [writing_job(lake), writing_job(lake, "often", cron="*/5 * * * *")]
    scheduler = Scheduler(lake, jobs, clock=lambda: NOW)
    scheduler.run_pending()
    done = scheduler.run_pending(backfill_from=NOW - timedelta(hours=1))
    assert len(windows_written(lake, "often")) == 13 and windows_written(lake) == ["2026-11-30T02:00:00Z"]
    assert {r.job for r in done} == {"often"}
