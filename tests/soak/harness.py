"""The mixed-fault soak: real processes, a seeded fault schedule, then a check from the Delta tables.

Parts, all real and on loopback: an S3-compatible server (moto) holding both
the broker's log (tansu ``s3://`` storage) and, by default, the lake; tansu;
``trajlake gateway`` (with its disk spool) in front of the fake engine of the
gateway tests; one or two ``trajlake ingest`` processes in one consumer group;
load from the official ``openai`` client, one ``Idempotency-Key`` per call.

While the load runs, faults follow one another as ``fault_schedule(seed)``
says: SIGKILL + restart of an ingester, the broker or the gateway, a freeze of
the object store (SIGSTOP, then SIGCONT), the broker down for a while. An
ingester that exits on its own (no broker at start) is restarted, as a process
supervisor would. Then everything is brought back, the gateway's spool and
the ingesters drain, and ``verify`` reads the Delta tables directly
(deltalake, not trajlake's views) and the whole topic:

* every answered call's ``llm.request`` and ``llm.response`` exactly once in
  ``events``, and its row exactly once in ``llm_requests`` / ``llm_responses``;
* no event id twice in any of those tables;
* every message in the log accounted for: stored at its offset, a later copy
  of an event stored at an earlier offset (a spool replay), or quarantined;
  and no row whose offset holds a different event in the log.

>>> report = run_soak(SoakPlan(seed=7, load_s=90), workdir=Path("/tmp/soak"))  # doctest: +SKIP
>>> print(report.render()); assert report.ok
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from devkit.broker import BrokerError, EmbeddedBroker
from devkit.ports import free_port, wait_for_port
from store.lake import Lake
from store.storage import storage_options
from tests.object_store import S3Server
from tests.soak.check import (
    LogRead,
    account_for_log,
    events_markers,
    last_words,
    query,
    read_log,
    stopped_stats,
    stored_keys,
)
from tests.soak.reaper import Reaper

log = logging.getLogger("soak")

KEY, TENANT = "sk-soak", "soak"
FAULT_KINDS = ("ingester_kill", "broker_kill", "gateway_kill", "store_freeze", "broker_down")
BROKER_RESTART_S = 300.0
"""How long a broker restart is retried (its object store too slow to answer, see ``Cluster.restart_broker``)."""
ENGINE_APP_DIR = Path(__file__).resolve().parents[1] / "ingest" / "gateway"
"""Where ``gateway_fake_engine`` lives (the gateway tests' engine, run here as its own process)."""


@dataclass(frozen=True)
class SoakPlan:
    """What one soak run does. Times in seconds; the defaults are the CI run's (``python -m tests.soak`` sets
    the long run's)."""

    seed: int
    load_s: float = 40.0
    """How long calls are made at least (they go on until the last scheduled fault has ended)."""
    calls_per_s: float = 4.0
    ingesters: int = 2
    """Ingester processes in one consumer group (1 or 2)."""
    partitions: int = 4
    lake_on_object_store: bool = True
    """The lake on the same S3 server as the broker's log; False: a local folder."""
    warmup_s: float = 8.0
    """No faults before this (processes start, the group forms)."""
    fault_gap_s: tuple[float, float] = (2.0, 4.0)
    """Quiet time between the end of one fault and the next."""
    freeze_s: tuple[float, float] = (3.0, 6.0)
    broker_down_s: tuple[float, float] = (6.0, 10.0)
    """Longer than the gateway's broker timeout here (2 s), so answered calls go through its spool."""
    ingester_min_age_s: float = 15.0
    """Only an ingester that ran this long is killed (a member killed mid-join can wedge a tansu group)."""
    call_give_up_s: float = 120.0
    """A call not answered after retrying this long counts as unanswered (not as lost)."""
    log_level: str = "INFO"
    """TRAJLAKE_LOG_LEVEL of the gateway and the ingesters (DEBUG shows every commit)."""
    drain_quiet_s: float = 90.0
    """Stop waiting for the lake once neither it nor the group's read position moved for this long (then the
    check says what is missing); the spool and the log read back get twice as long."""
    drain_max_s: float = 300.0
    """Stop waiting for the lake after this long even while it still moves: the run is then "not drained"
    (the check reports what is not in the lake yet, and the rate at which the ingesters were storing)."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Earliest start, seconds after the load began (a fault waits for the previous one to end)."""
    kind: str
    hold_s: float = 0.0
    """How long a freeze or a broker outage lasts."""


def fault_schedule(plan: SoakPlan) -> list[Fault]:
    """The run's faults, one at a time: every kind once (however short ``load_s``), then random kinds while
    the load lasts, all from ``plan.seed``."""
    rng = random.Random(plan.seed)
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    faults: list[Fault] = []
    t = plan.warmup_s
    while kinds or t < plan.load_s - 5:
        kind = kinds.pop(0) if kinds else rng.choice(FAULT_KINDS)
        hold = rng.uniform(*plan.freeze_s) if kind == "store_freeze" else \
            rng.uniform(*plan.broker_down_s) if kind == "broker_down" else 0.0
        faults.append(Fault(round(t, 1), kind, round(hold, 1)))
        t += hold + rng.uniform(*plan.fault_gap_s)
    return faults


# ---------------------------------------------------------------- processes


class Process:
    """One restartable child process with its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, reaper: Reaper) -> None:
        self.name, self.argv, self.env, self.log_path, self.reaper = name, argv, env, log_path, reaper
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.starts = 0
        self.exits: Counter[int] = Counter()
        """Exit codes of the runs that ended (-9: our SIGKILL)."""
        self.failures: list[str] = []
        """For each run that ended with an error code of its own: the code and the last lines it printed."""

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== start {self.starts} at {time.strftime('%H:%M:%S')}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.reaper.adopt()
        self.started_at = time.monotonic()
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.started_at if self.running else 0.0

    def reap(self) -> bool:
        """True (once) when the process has exited since it was started."""
        if self.proc is None or self.proc.poll() is None:
            return False
        code = self.proc.returncode
        self.exits[code] += 1
        if code > 0:
            self.failures.append(f"{self.name} exited {code}: {last_words(self.log_path)}")
        self.proc = None
        return True

    def kill(self, sig: int = signal.SIGKILL, *, timeout_s: float = 60.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reap()


class Cluster:
    """The soak's processes: S3 server, broker, engine, gateway, ingesters."""

    def __init__(self, plan: SoakPlan, workdir: Path, s3: S3Server, reaper: Reaper) -> None:
        self.plan, self.workdir, self.s3, self.reaper = plan, workdir, s3, reaper
        run = uuid.uuid4().hex[:8]
        self.topic, self.group = f"soak-{plan.seed}-{run}", f"soak-{plan.seed}-{run}"
        root = f"s3://{s3.new_bucket()}/lake" if plan.lake_on_object_store else str(workdir / "lake")
        self.lake = Lake(root, storage_options=storage_options(root, s3.env))
        self.broker = EmbeddedBroker(storage_url=f"s3://{s3.new_bucket()}/", env=s3.env,
                                     log_path=workdir / "broker.log")
        self.gateway_port, engine_port = free_port(), free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        py = sys.executable
        self.engine = Process("engine", [py, "-m", "uvicorn", "gateway_fake_engine:create_fake_engine", "--factory",
                                         "--app-dir", str(ENGINE_APP_DIR), "--port", str(engine_port),
                                         "--log-level", "warning"], {}, workdir / "engine.log", reaper)
        self.engine_url = f"http://127.0.0.1:{engine_port}/v1"
        self.frozen = False
        self.gateway: Process | None = None
        self.ingesters: list[Process] = []

    def start(self) -> None:
        self.broker.start()
        self.reaper.adopt()
        self.broker.create_topic(self.topic, partitions=self.plan.partitions)
        self.engine.start()
        wait_for_port("127.0.0.1", int(self.engine_url.split(":")[2].split("/")[0]), timeout_s=60)
        common = {"TRAJLAKE_BOOTSTRAP_SERVERS": self.broker.bootstrap_servers, "TRAJLAKE_TOPIC": self.topic,
                  "TRAJLAKE_LOG_LEVEL": self.plan.log_level, **self.s3.env}
        self.gateway = Process("gateway", [sys.executable, "-m", "trajlake.cli", "gateway", "--port",
                                           str(self.gateway_port)],
                               {**common, "TRAJLAKE_UPSTREAM_URL": self.engine_url,
                                "TRAJLAKE_GATEWAY_KEYS": f"{KEY}={TENANT}",
                                "TRAJLAKE_SPOOL_DIR": str(self.workdir / "spool"),
                                "TRAJLAKE_BROKER_TIMEOUT_S": "2"},
                               self.workdir / "gateway.log", self.reaper)
        self.start_gateway()
        for n in range(self.plan.ingesters):
            self.ingesters.append(Process(
                f"ingester-{n}",
                [sys.executable, "-m", "trajlake.cli", "ingest", "--lake", self.lake.root, "--group", self.group],
                {**common, "TRAJLAKE_LAKE": self.lake.root}, self.workdir / f"ingester-{n}.log", self.reaper))
            self.ingesters[-1].start()

    def start_gateway(self) -> None:
        assert self.gateway is not None
        self.gateway.start()
        deadline = time.monotonic() + 60
        while not _answers(f"{self.gateway_url}/healthz"):
            if not self.gateway.running or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: see {self.gateway.log_path}")
            time.sleep(0.1)

    def supervise(self) -> None:
        """Restart an ingester that exited on its own (e.g. no broker at its start), as systemd would."""
        for ingester in self.ingesters:
            if ingester.reap():
                log.info("soak: %s exited on its own, restarting", ingester.name)
                ingester.start()

    def freeze_store(self) -> None:
        os.kill(self.s3.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw_store(self) -> None:
        if self.frozen:
            os.kill(self.s3.pid, signal.SIGCONT)
            self.frozen = False

    def restart_broker(self, stop: threading.Event, *, down_s: float = 0.0) -> None:
        """Kill the broker, keep it down ``down_s``, start it again. The start is retried while the object store
        does not answer its storage check in time (moto at load average 25 did not): the fault is an outage of
        ``down_s``, not a broker that never comes back, which would leave the rest of the run without one.
        Once ``stop`` is set (the run is being torn down) it neither waits nor starts the broker again."""
        self.broker.kill()
        if stop.wait(down_s):
            return
        deadline = time.monotonic() + BROKER_RESTART_S
        while True:
            try:
                self.broker.start(timeout_s=60)
                break
            except BrokerError as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("soak: broker restart failed, retrying: %s", exc)
                if stop.wait(2.0):
                    return
        self.reaper.adopt()

    def stop(self) -> None:
        self.thaw_store()
        for ingester in self.ingesters:
            ingester.kill()
        for p in (self.gateway, self.engine):
            if p is not None:
                p.kill(signal.SIGTERM, timeout_s=20)
        self.broker.kill()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------- load


class Load:
    """Calls through the gateway at a steady rate with the official openai client; retries until answered."""

    def __init__(self, plan: SoakPlan, base_url: str) -> None:
        import openai

        self.plan = plan
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0, timeout=30)
        self.answered: set[str] = set()
        self.unanswered: set[str] = set()
        self.attempts = 0
        self.failures: Counter[str] = Counter()
        """Failed attempts by cause (retried with the same key)."""
        self.failed_at: list[float] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="soak-call")
        self._issued = 0
        self._abandoned = threading.Event()
        """The run is being torn down (an error, SIGTERM): calls stop retrying."""

    def run(self, duration_s: float, *, faults_done: threading.Event) -> None:
        """Issue calls for ``duration_s`` and until ``faults_done``, paced to ``calls_per_s``; returns when they
        are all settled (so every scheduled fault happens under load, however slow the machine)."""
        start = time.monotonic()
        futures = []
        try:
            while (elapsed := time.monotonic() - start) < duration_s or not faults_done.is_set():
                due = int(elapsed * self.plan.calls_per_s) + 1
                while self._issued < due:
                    futures.append(self._pool.submit(self._call, self._issued))
                    self._issued += 1
                time.sleep(0.02)
            for f in futures:
                f.result()
        except BaseException:
            self._abandoned.set()
            raise
        finally:
            self._pool.shutdown(cancel_futures=True)

    def _call(self, i: int) -> None:
        import openai

        seed = self.plan.seed
        key, rollout = f"soak-{seed}-{i}", f"rollout-{seed}-{i // 4}"
        headers = {"Idempotency-Key": key, "X-Trajlake-Rollout-Id": rollout, "X-Trajlake-Task-Id": f"task-{i // 16}"}
        give_up = time.monotonic() + self.plan.call_give_up_s
        while True:
            with self._lock:
                self.attempts += 1
            try:
                self.client.chat.completions.create(
                    model="fake-model", max_tokens=8, extra_headers=headers,
                    messages=[{"role": "user", "content": f"soak call {i} of {rollout}"}])
            except (openai.APIConnectionError, openai.APIStatusError) as exc:
                with self._lock:
                    self.failures[str(getattr(exc, "status_code", None) or type(exc).__name__)] += 1
                    self.failed_at.append(time.monotonic())
                if self._abandoned.is_set():
                    return
                if time.monotonic() > give_up:
                    log.warning("soak: call %s unanswered: %r", key, exc)
                    with self._lock:
                        self.unanswered.add(key)
                    return
                time.sleep(0.5)
                continue
            with self._lock:
                self.answered.add(key)
            return


# ---------------------------------------------------------------- the run


@dataclass
class Report:
    plan: SoakPlan
    workdir: Path
    wall_s: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    unanswered: int = 0
    attempts: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    failed_during: Counter[str] = field(default_factory=Counter)
    """Failed attempts by the fault in progress (or ended < 5 s before); "none": a call failed on a quiet system."""
    fault_windows: list[tuple[str, float, float]] = field(default_factory=list)
    lost: dict[str, list[str]] = field(default_factory=dict)
    """Answered calls missing somewhere: idempotency key -> what is missing."""
    duplicated: dict[str, int] = field(default_factory=dict)
    """Table -> event ids stored more than once (and call ids with more than one row)."""
    log_accounting: Counter[str] = field(default_factory=Counter)
    """Every message in the topic, by what became of it."""
    quarantined: int = 0
    not_in_log: int = 0
    """Answered calls whose events never reached the topic (lost before the ingester: gateway, spool, broker)."""
    ingester_exits: Counter[int] = field(default_factory=Counter)
    ingester_failures: list[str] = field(default_factory=list)
    """Why ingesters exited on their own (code and last words), so a failed run in CI says it without its logs."""
    ingester_stats: Counter[str] = field(default_factory=Counter)
    """Totals of the ``ingester stopped`` lines (clean exits only: a SIGKILLed run prints none)."""
    drained: bool = True
    """The ingesters stored the whole log before the drain's bounds; False: calls not in the lake are "not
    drained yet" (the lake was still behind the log), not proven lost."""
    drain_progress: list[tuple[float, int]] = field(default_factory=list)
    """(seconds into the drain, offsets the ``events`` markers cover): how fast the lake caught up."""
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase (start, load, spool, log read back, ingest drain, check, stop)."""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad = self.log_accounting["unaccounted"] + self.log_accounting["moved"] + self.log_accounting["behind"]
        refused = self.ingester_exits[3]  # the ingester found the log behind its markers (went backwards)
        return not self.lost and not any(self.duplicated.values()) and bad == 0 and not refused and not self.notes

    def render(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        missing = Counter(what for whats in self.lost.values() for what in whats)
        verdict = "lost" if self.drained else "NOT DRAINED, not in the lake yet"
        lines = [
            f"soak seed={self.plan.seed} ingesters={self.plan.ingesters} "
            f"lake={'s3' if self.plan.lake_on_object_store else 'local'} wall={self.wall_s:.0f}s "
            f"load={self.plan.load_s:.0f}s at {self.plan.calls_per_s:g} calls/s",
            f"faults: {sum(self.faults.values())} ({faults})",
            f"calls: {self.answered} answered, {self.unanswered} unanswered, {self.attempts} attempts (failed: {dict(self.failures)}, during: {dict(self.failed_during)})",
            f"{verdict}: {len(self.lost)} answered calls" + (f" (missing {dict(missing)})" if missing else ""),
            f"duplicated: {sum(self.duplicated.values())} {dict(self.duplicated)}",
            f"log: {dict(self.log_accounting)}; quarantined rows {self.quarantined}; "
            f"answered calls not in the log {self.not_in_log}",
            f"ingester exits by code: {dict(self.ingester_exits)}; clean-exit stats: {dict(self.ingester_stats)}",
            *[f"  {f}" for f in self.ingester_failures[:4]],
            f"phases (s): {', '.join(f'{k} {v:.0f}' for k, v in self.phases.items())}; drain: {self._drain_rate()}",
            *[f"NOTE: {n}" for n in self.notes],
            f"logs: {self.workdir}",
        ]
        if self.lost:
            lines.insert(4, f"  first lost: {sorted(self.lost.items())[:5]}")
        return "\n".join(lines)

    def _drain_rate(self) -> str:
        if len(self.drain_progress) < 2:
            return "-"
        (t0, n0), (t1, n1) = self.drain_progress[0], self.drain_progress[-1]
        return (f"the events markers went from {n0} to {n1} offsets in {t1 - t0:.0f} s "
                f"({(n1 - n0) / max(t1 - t0, 1):.1f}/s)")


def run_soak(plan: SoakPlan, *, workdir: Path, s3: S3Server | None = None,
             schedule: list[Fault] | None = None) -> Report:
    """Run the soak end to end and check the lake.

    Its own S3 server unless ``s3`` is given (that one gets frozen, and outlives the run: the lake and the
    log stay there to look at); ``schedule`` replaces the seed's faults (to replay one situation). Every
    process it starts dies with it, however it ends (``Reaper``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    own = s3 is None
    with Reaper(spare=frozenset() if own else frozenset({s3.pid})) as reaper:
        if s3 is None:
            s3 = S3Server().start()
            reaper.adopt()
        return _run(plan, workdir, s3, own, reaper, schedule)


def _run(plan: SoakPlan, workdir: Path, s3: S3Server, own: bool, reaper: Reaper,
         schedule: list[Fault] | None) -> Report:
    cluster = Cluster(plan, workdir, s3, reaper)
    report = Report(plan, workdir)
    started = phase = time.monotonic()
    try:
        cluster.start()
        phase = _phase(report, "start", phase)
        load = Load(plan, cluster.gateway_url)
        stop, faults_done = threading.Event(), threading.Event()
        faults = threading.Thread(target=_run_faults, name="soak-faults", daemon=True, args=(
            cluster, schedule if schedule is not None else fault_schedule(plan), report, stop, faults_done))
        faults.start()
        try:
            load.run(plan.load_s, faults_done=faults_done)
        finally:
            stop.set()
            faults.join()
        phase = _phase(report, "load", phase)
        report.answered, report.unanswered, report.attempts = len(load.answered), len(load.unanswered), load.attempts
        report.failures = load.failures
        for t in load.failed_at:
            kinds = [k for k, began, ended in report.fault_windows if began <= t <= ended + 5]
            report.failed_during[kinds[0] if kinds else "none"] += 1
        log_read = _drain(cluster, load.answered, plan, report)
        phase = time.monotonic()
        for ingester in cluster.ingesters:
            ingester.kill(signal.SIGTERM)
        partitions = range(plan.partitions)
        verify(cluster.lake, log_read, load.answered, report,
               markers=events_markers(cluster.lake, cluster.group, cluster.topic, partitions))
        phase = _phase(report, "check", phase)
    finally:
        cluster.stop()
        if own:
            s3.stop()
        _phase(report, "stop", phase)
        report.wall_s = time.monotonic() - started
    for ingester in cluster.ingesters:
        report.ingester_exits.update(ingester.exits)
        report.ingester_failures.extend(ingester.failures)
        report.ingester_stats.update(stopped_stats(ingester.log_path))
    return report


def _run_faults(cluster: Cluster, schedule: list[Fault], report: Report, stop: threading.Event,
                done: threading.Event) -> None:
    """Inject ``schedule``'s faults in order (each at its time or after the previous one ended); ``done`` once
    the last has ended. Restarts ingesters that exit on their own until ``stop``."""
    try:
        rng = random.Random(cluster.plan.seed + 1)
        t0 = time.monotonic()
        pending = list(schedule)
        while not stop.is_set():
            if not pending:
                done.set()
            cluster.supervise()
            if pending and time.monotonic() - t0 >= pending[0].at_s:
                fault = pending.pop(0)
                began = time.monotonic()
                if _inject(cluster, fault, rng, stop):
                    report.faults[fault.kind] += 1
                    report.fault_windows.append((fault.kind, began, time.monotonic()))
                else:
                    pending.insert(0, fault)  # no ingester old enough yet: try again shortly
            stop.wait(0.25)
    except Exception as exc:
        report.notes.append(f"the fault thread failed: {exc!r}")
        raise
    finally:
        cluster.thaw_store()
        done.set()  # also when a fault failed: the load must not wait for it


def _inject(cluster: Cluster, fault: Fault, rng: random.Random, stop: threading.Event) -> bool:
    """Inject one fault and wait until it ended; a hold or an outage ends early once ``stop`` is set (a torn
    down run must not wait out a 60-s broker outage before it stops its processes)."""
    log.info("soak: fault %s hold=%.1fs", fault.kind, fault.hold_s)
    if fault.kind == "ingester_kill":
        ripe = [i for i in cluster.ingesters if i.age_s >= cluster.plan.ingester_min_age_s]
        if not ripe:
            return False
        victim = rng.choice(ripe)
        victim.kill()
        victim.start()
    elif fault.kind == "broker_kill":
        cluster.restart_broker(stop)
    elif fault.kind == "broker_down":
        cluster.restart_broker(stop, down_s=fault.hold_s)
    elif fault.kind == "gateway_kill":
        assert cluster.gateway is not None
        cluster.gateway.kill()
        cluster.start_gateway()
    elif fault.kind == "store_freeze":
        cluster.freeze_store()
        stop.wait(fault.hold_s)
        cluster.thaw_store()
    else:
        raise ValueError(f"unknown fault kind {fault.kind!r}")
    return True


def _drain(cluster: Cluster, answered: set[str], plan: SoakPlan, report: Report) -> LogRead:
    """Wait until the gateway's spool is empty, read the log back, then wait until the ingesters stored it all.

    Returns the log (every message of the topic). Done when the ``events`` markers reach the log's last
    offsets and the typed tables hold every answered call. Gives up once neither the lake nor the group's
    read position moved for ``drain_quiet_s`` (a replay below the markers stores nothing but moves), or after
    ``drain_max_s`` while it still moves: then the run is not drained (``report.drained`` False), which says
    the lake is behind the log, not that anything is lost.
    """
    phase = time.monotonic()
    deadline = phase + 2 * plan.drain_quiet_s
    while True:
        cluster.supervise()
        try:
            ready = httpx.get(f"{cluster.gateway_url}/readyz", timeout=5).json()
            if ready["spool"]["events"] == 0 and ready["pending"] == 0:
                break
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            report.notes.append(f"the gateway's spool did not drain within {2 * plan.drain_quiet_s:.0f} s")
            break
        time.sleep(0.5)
    phase = _phase(report, "spool", phase)
    log_read = read_log(cluster.broker.bootstrap_servers, cluster.topic, expect=answered,
                        give_up_s=plan.drain_max_s)
    phase = _phase(report, "log read back", phase)
    if not answered <= log_read.complete:
        report.drained = False
        report.notes.append(f"the log read back stopped after {plan.drain_max_s:.0f} s with "
                            f"{len(log_read.messages)} messages, some answered calls not seen yet")
    ends: dict[int, int] = {}
    for p, o, _ in log_read.messages:
        ends[p] = max(ends.get(p, -1), o)
    last, last_change, started = None, time.monotonic(), time.monotonic()
    with _GroupPosition(cluster.broker.bootstrap_servers, cluster.topic, cluster.group) as position:
        while True:
            cluster.supervise()
            found = len(answered & stored_keys(cluster.lake))
            markers = events_markers(cluster.lake, cluster.group, cluster.topic, ends)
            report.drain_progress.append((time.monotonic() - started, sum((m or -1) + 1 for m in markers.values())))
            if found == len(answered) and all((markers.get(p) or -1) >= o for p, o in ends.items()):
                break
            now = (found, tuple(sorted(markers.items())), position.read())
            if now != last:
                last, last_change = now, time.monotonic()
            if time.monotonic() - last_change > plan.drain_quiet_s:
                report.notes.append(f"the lake stopped moving for {plan.drain_quiet_s:.0f} s before holding the "
                                    "whole log")
                break
            if time.monotonic() - started > plan.drain_max_s:
                report.drained = False
                report.notes.append(f"the lake still moved after {plan.drain_max_s:.0f} s of drain: not drained")
                break
            time.sleep(1)
    _phase(report, "ingest drain", phase)
    return log_read


def _phase(report: Report, name: str, since: float) -> float:
    now = time.monotonic()
    report.phases[name] = now - since
    return now


class _GroupPosition:
    """The ingest group's committed offsets (monitoring only: they show a replay moving)."""

    def __init__(self, bootstrap_servers: str, topic: str, group: str) -> None:
        from kafka import KafkaConsumer

        self.topic = topic
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=group, enable_auto_commit=False)

    def read(self) -> tuple:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        try:
            parts = sorted(self.consumer.partitions_for_topic(self.topic) or [])
            return tuple(self.consumer.committed(TopicPartition(self.topic, p)) for p in parts)
        except KafkaError:
            return ()

    def __enter__(self) -> "_GroupPosition":
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close(autocommit=False)


def verify(lake: Lake, log: LogRead, answered: set[str], report: Report,
           markers: dict[int, int | None] | None = None) -> None:
    """Fill ``report`` with what the lake holds for the answered calls and for each message of the log.

    ``markers`` (the ``events`` table's, per partition) tell messages the ingesters have not reached yet
    (the run is then not drained) from messages they passed without storing (lost).

    Calls are found by their ``Idempotency-Key`` (the request's payload), their responses by the request's
    call id; the check does not depend on how the gateway derives ids.
    """
    events = query(lake, "events", "SELECT event_id, type, payload, kafka_partition, kafka_offset FROM events")
    requests = query(lake, "llm_requests", "SELECT event_id, call_id, idempotency_key FROM llm_requests")
    responses = query(lake, "llm_responses", "SELECT event_id, call_id FROM llm_responses")
    report.quarantined = query(lake, "quarantine", "SELECT count(*) AS n FROM quarantine")["n"][0]

    for name, table in (("events", events), ("llm_requests", requests), ("llm_responses", responses)):
        report.duplicated[name] = sum(n - 1 for n in Counter(table["event_id"]).values() if n > 1)
    payloads = [(t, json.loads(p)) for t, p in zip(events["type"], events["payload"])]
    calls_of: dict[str, set[str]] = {key: {call} for key, call in log.call_of.items()}
    for key, call in [(p.get("idempotency_key"), p.get("call_id")) for t, p in payloads if t == "llm.request"] + \
            list(zip(requests["idempotency_key"], requests["call_id"])):
        calls_of.setdefault(key, set()).add(call)
    request_events = Counter(p.get("idempotency_key") for t, p in payloads if t == "llm.request")
    response_events = Counter(p.get("call_id") for t, p in payloads if t == "llm.response")
    request_rows, response_rows = Counter(requests["idempotency_key"]), Counter(responses["call_id"])
    for key in sorted(answered):
        calls = calls_of.get(key, set())
        counts = {"events llm.request": request_events[key],
                  "events llm.response": sum(response_events[c] for c in calls),
                  "llm_requests": request_rows[key],
                  "llm_responses": sum(response_rows[c] for c in calls)}
        if missing := [place for place, n in counts.items() if n == 0]:
            report.lost[key] = missing
        for place, n in counts.items():
            if n > 1:
                report.duplicated[f"{place} per call"] = report.duplicated.get(f"{place} per call", 0) + n - 1
    stored = {(p, o): e for e, p, o in zip(events["event_id"], events["kafka_partition"], events["kafka_offset"])}
    quarantined = {(p, o) for p, o in zip(*query(lake, "quarantine", "SELECT kafka_partition, kafka_offset "
                                                  "FROM quarantine").values())}
    report.log_accounting = account_for_log(log.messages, stored, quarantined, markers)
    if report.log_accounting["behind"]:
        report.drained = False
    report.not_in_log = len(answered - log.complete)
