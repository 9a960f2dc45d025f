"""Ingest throughput: broker -> committed Delta rows, against a raw consume + Parquet baseline.

One run, one embedded broker (tansu), two workloads, each on its own
4-partition topic:

* ``full_prompt``: the workload generator's events (every event type; LLM
  requests carry the full prompt's token ids), ~4.2 KB and ~490 ids on average;
* ``large``: the generator's ``llm.request`` events only, with a long context
  and a small vocabulary: ~3,000 token ids and ~17 KB each.

Two sides read the same messages of a workload, each in a fresh process per
round (``measure``: with the allocator settings ``trajlake ingest`` applies,
timed after its imports, so no state carries over between rounds and its CPU
seconds and peak RSS are its own, not the broker's):

* **baseline**: the ingester's own consumer (confluent-kafka, same settings),
  no validation, no dedupe; each batch of raw messages (value, key, partition,
  offset) is written as one plain Parquet file with pyarrow.
* **ingester**: ``ingest.ingester.run_ingester`` into a fresh lake (validation,
  dedupe, events + typed tables + quarantine, one Delta commit per table per
  batch with transaction markers), timed until its last batch is committed.

Each round runs both, the baseline first in odd rounds and the ingester first
in even ones, so drift on a shared machine hits both sides. Two ratios per
round, medians over rounds with their range and IQR (``bench.results``):
**CPU seconds per committed event, baseline / ingester** (the figure: its
rounds spread less than the events/s ratios', whose wall times on 2 shared
cores are mostly the other tenants'; bench/ingest/README.md has the reruns),
and events/s, ingester / baseline. Goal (issue): >= 0.70
(for CPU: the ingester at <= 1.43x the baseline's CPU per event). Also
printed: the ingester's CPU seconds by stage (``IngestStats.cpu_s``, median
over rounds) and each side's peak RSS (VmHWM), with the load per round.

    .venv/bin/python -m bench ingest              # ~13 min on 2 shared cores at load 15-25 (40,703 + ~10,800 events, 5 rounds)
    .venv/bin/python bench/ingest/run.py --tasks 30 --rounds 3 --workloads full_prompt

``--soak-minutes N`` instead runs the ingester alone for N minutes against a
producer process sending fresh workload events at ``--soak-rate`` events/s, with
the allocator settings ``trajlake ingest`` applies (``ingest.allocators``; the
process restarts itself with them; ``--soak-allocators default`` for the
libraries' own), and reports its RSS every 10 s (with Arrow's pool, glibc
malloc's bytes in use and kept free, Python's allocated blocks, the thread count:
delta-rs's tokio pool grows with the file operations in flight, and resident MB
by kind of mapping), RSS at each minute and the slopes (MB per minute, least
squares, after the first minute, after minute 2 and over the second half) in
``bench/ingest/soak.json``, with the data files in the lake (``live_files_samples``: each commit adds
one per table that got rows, and every open snapshot holds the list of live files).
RSS and threads are also taken after each committed batch (``between_batches_*``: the same point of every
cycle) with their slope and swing, and the checkpoint files each table's log holds at the end (count, bytes per
hour); ``--soak-cadence`` picks when the tables reopen their snapshots (``store.commit.CADENCES``).
``--soak-compact-every-s S`` also runs ``trajlake compact`` on those tables (vacuum after 0 h, so that the
files on disk are the live ones) in its own process every S seconds, as an operator's schedule would.
As the deployed service runs, the scheduler's compaction job (``trajlake scheduler --job compact``, incremental,
no vacuum) runs beside the ingester in its own process at ``--soak-compact-cron`` (the service's default, every
5 minutes; '' for none), and its runs are recorded (``scheduled_compactions``). Once a minute the anonymous
mappings with >= 1 MB resident (``anon_mappings_at_minutes``: which mapping grows) and glibc's arenas
(``glibc_heaps_at_minutes``: held, free, free in sub-page fragments) and the threads by name
(``threads_by_name_at_minutes``) are taken too; ``--soak-tracemalloc FRAMES``
traces Python's heap and lists the allocation sites that grew after minute 2 (a diagnostic: at 5 frames and
200 events/s on this machine the ingester fell behind and committed one batch).

Writes bench/ingest/results.json (format: ``bench.results``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn
from xml.etree import ElementTree

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.results import Ratio, Recorder, peak_rss_mb  # noqa: E402
from devkit.broker import EmbeddedBroker  # noqa: E402
from ingest import allocators  # noqa: E402
from devkit.workload import WorkloadConfig, generate_events  # noqa: E402
from ingest.consumer import AssignmentFlag, Record, open_consumer  # noqa: E402
from ingest.ingester import IngesterConfig, IngestStats, run_ingester  # noqa: E402
import store.commit  # noqa: E402
from schemas.tables import EVENTS_TABLE, QUARANTINE_TABLE, TYPED_TABLES  # noqa: E402
from trajlake.commands.scheduler import SchedulerSettings  # noqa: E402

PARTITIONS = (0, 1, 2, 3)
GOAL = 0.70
SOAK_SAMPLE_S = 10.0
INGESTED_TABLES = (EVENTS_TABLE, *(name for name, _ in TYPED_TABLES.values()), QUARANTINE_TABLE)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    config: Callable[[int, int], WorkloadConfig]
    """(tasks, seed) -> the generator's configuration."""
    keep: Callable[[dict], bool] = lambda event: True


WORKLOADS = {
    w.name: w for w in (
        Workload("full_prompt", "workload events, ~490 token ids / ~4.2 KB each on average",
                 lambda tasks, seed: WorkloadConfig(tasks=tasks, rollouts_per_task=8, seed=seed)),
        Workload("large", "llm.request events only, ~3,000 token ids / ~17 KB each",
                 lambda tasks, seed: WorkloadConfig(tasks=tasks, rollouts_per_task=8, seed=seed,
                                                    max_context_tokens=7_000, vocab_size=5_000),
                 keep=lambda event: event["type"] == "llm.request"),
    )
}


@dataclass(frozen=True)
class Run:
    side: str
    seconds: float
    cpu_seconds: float
    """CPU time of this process (all its threads) during the run: robust to a busy shared machine."""
    messages: int
    bytes: int
    peak_rss_mb: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.messages / self.seconds


class RssSampler:
    """Samples this process's resident set (VmRSS, MB) every ``every_s`` seconds in a thread; also what
    Arrow's memory pool holds (``arrow``) and glibc malloc's bytes in use and free in its arenas (``malloc``),
    to tell Arrow buffers, live objects and memory an allocator keeps from each other; ``by_region``: also resident
    MB by kind of mapping (``resident_by_region_mb``, a read of /proc/self/smaps: for the soak's slow samples)."""

    def __init__(self, every_s: float, *, by_region: bool = False, lake: Path | None = None) -> None:
        self.every_s, self.samples, self.arrow, self.malloc, self.python_blocks = every_s, [], [], [], []
        self.by_region, self.lake = by_region, lake
        self.files: list[int] = []
        self.threads: list[int] = []
        self.regions: list[dict[str, float]] = []
        self.mappings: list[dict[str, list[float]]] = []
        """Once a minute (``by_region``): every anonymous mapping with >= 1 MB resident, by start address."""
        self.glibc_heaps: list[list[dict[str, float]]] = []
        """Once a minute (``by_region``): glibc's arenas (``glibc_heaps_mb``)."""
        self.threads_by_name: list[dict[str, int]] = []
        """Once a minute (``by_region``): threads by name (``threads_by_name``: which pool the count is)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self.started, rss_mb()))
            self.arrow.append(pa.total_allocated_bytes() / 2**20)
            self.malloc.append(glibc_malloc_mb())
            self.python_blocks.append(sys.getallocatedblocks())
            self.threads.append(threading_native_count())
            if self.by_region:
                self.regions.append(resident_by_region_mb() | {"python_arenas": python_arenas_mb(),
                                                               "glibc_mmapped": glibc_mmapped_mb()})
            if self.lake is not None:
                self.files.append(data_files(self.lake))
            if self.by_region and time.monotonic() - self.started >= 60 * len(self.mappings):
                self.mappings.append(anon_mappings_mb())
                self.glibc_heaps.append(glibc_heaps_mb())
                self.threads_by_name.append(threads_by_name())
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> float:
        return max(mb for _, mb in self.samples)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def data_files(lake: Path) -> int:
    """Parquet data files of the ingested tables of a local lake (outside ``_delta_log``), committed or being written."""
    return sum(1 for table in INGESTED_TABLES for path in (lake / table).rglob("*.parquet")
               if "_delta_log" not in path.parts)


def threading_native_count() -> int:
    """Threads of this process, native ones included (delta-rs's tokio pool, librdkafka's)."""
    return len(list(Path("/proc/self/task").iterdir()))


def threads_by_name() -> dict[str, int]:
    """Threads of this process by name (``/proc/self/task/*/comm``), most first: delta-rs's tokio runtime
    (``tokio-rt-worker``: its workers and its blocking pool, one thread per local file operation in flight),
    librdkafka's (``rdk:``), jemalloc's background threads, Python's (``python``, the commit pool among them)."""
    names: dict[str, int] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items(), key=lambda item: -item[1]))


GLIBC_HEAP_MB = 64
"""A glibc thread arena's heap: a 64 MiB-aligned mapping of at most 64 MiB (its unused tail is ``---p``)."""


def resident_by_region_mb() -> dict[str, float]:
    """Resident MB by kind of mapping (``/proc/self/smaps``): ``files`` (libraries, mapped files), ``main_heap``
    (glibc's brk heap), ``glibc_arenas`` (its thread arenas' heaps), ``stacks`` (thread stacks: a mapping right
    after a guard page; the main stack too) and ``other_anon`` (the rest: jemalloc's and mimalloc's extents,
    Python's arenas, glibc's large mmapped blocks)."""
    maps: list[tuple[int, int, str, str]] = []
    rss: list[int] = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            maps.append((start, end, head[1], head[5] if len(head) > 5 else ""))
            rss.append(0)
        elif head[0] == "Rss:":
            rss[-1] = int(head[1])
    out = dict.fromkeys(("files", "main_heap", "glibc_arenas", "stacks", "other_anon"), 0.0)
    arena = GLIBC_HEAP_MB << 20
    for i, (start, end, perms, path) in enumerate(maps):
        before = maps[i - 1] if i else None
        after = maps[i + 1] if i + 1 < len(maps) else None
        if path == "[heap]":
            kind = "main_heap"
        elif path == "[stack]":
            kind = "stacks"
        elif path and not path.startswith("["):
            kind = "files"
        elif path or perms.startswith("---"):
            continue
        elif before and before[2].startswith("---") and not before[3] and before[1] == start \
                and before[1] - before[0] <= 64 << 10:
            kind = "stacks"
        elif start % arena == 0 and (end - start == arena or (
                after and after[2].startswith("---") and after[0] == end and after[1] - start == arena)):
            kind = "glibc_arenas"
        else:
            kind = "other_anon"
        out[kind] += rss[i] / 1024
    return {k: round(v, 1) for k, v in out.items()}


def anon_mappings_mb(least_mb: float = 1.0) -> dict[str, list[float]]:
    """Anonymous mappings of this process with at least ``least_mb`` resident (``/proc/self/smaps``): start address ->
    [size MB, resident MB]. Diffed over minutes, they say which mappings grow (glibc's heaps, jemalloc's extents,
    Python's arenas, the dedupe ring)."""
    out: dict[str, list[float]] = {}
    start = size = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            low, high = (int(x, 16) for x in head[0].split("-"))
            anonymous = len(head) < 6 or head[5] in ("[heap]", "[stack]") or not head[5].startswith(("/", "["))
            start, size = (head[0].split("-")[0], (high - low) / 2**20) if anonymous else (None, None)
        elif head[0] == "Rss:" and start is not None and int(head[1]) / 1024 >= least_mb:
            out[start] = [round(size, 1), round(int(head[1]) / 1024, 1)]
    return out


def glibc_heaps_mb() -> list[dict[str, float]]:
    """Per glibc arena (``malloc_info``): MB it holds from the system, MB free in it, and of that what sits in free
    chunks under 8 KB (sub-page fragments around live blocks: ``malloc_trim`` cannot hand those pages back)."""
    libc = ctypes.CDLL(None)
    libc.fdopen.restype, libc.fdopen.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_char_p)
    libc.malloc_info.argtypes, libc.fclose.argtypes = (ctypes.c_int, ctypes.c_void_p), (ctypes.c_void_p,)
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        out.seek(0)
        root = ElementTree.fromstring(out.read())
    heaps = []
    for heap in root.iter("heap"):
        chunks = [(int(size.get("from")), int(size.get("total"))) for size in heap.find("sizes")]
        free = sum(int(total.get("size")) for total in heap.findall("total") if total.get("type") in ("fast", "rest"))
        system = next(int(x.get("size")) for x in heap.findall("system") if x.get("type") == "current")
        heaps.append({"system": round(system / 2**20, 1), "free": round(free / 2**20, 1),
                      "free_under_8k": round(sum(total for low, total in chunks if low < 8192) / 2**20, 1)})
    return heaps


class HeapSnapshots:
    """``tracemalloc`` over a soak (``frames`` > 0; off at 0): a snapshot of Python's traced heap each minute, and the
    allocation sites whose traced bytes grew most from minute 2 to the end. Tracing costs CPU and memory of its own:
    a run with it says where Python's heap grows, not what RSS does."""

    def __init__(self, frames: int, sampler: RssSampler) -> None:
        self.frames, self.sampler = frames, sampler
        self.snapshots: list[tracemalloc.Snapshot] = []
        self.traced_mb: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HeapSnapshots:
        if self.frames:
            tracemalloc.start(self.frames)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, 60 * (len(self.snapshots) + 1) - (time.monotonic() - self.sampler.started))):
            self._take()

    def _take(self) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        self.snapshots.append(snapshot)
        self.traced_mb.append(round(tracemalloc.get_traced_memory()[0] / 2**20, 1))

    def __exit__(self, *exc: object) -> None:
        if self.frames:
            self._stop.set()
            self._thread.join()
            self._take()
            tracemalloc.stop()

    def growth(self, top: int = 25) -> list[dict]:
        """The ``top`` allocation sites by traced bytes grown from minute 2 (the second snapshot) to the end."""
        if len(self.snapshots) < 3:
            return []
        stats = sorted(self.snapshots[-1].compare_to(self.snapshots[1], "traceback"), key=lambda st: -st.size_diff)
        return [{"kb": round(stat.size_diff / 1024, 1), "blocks": stat.count_diff,
                 "kb_at_end": round(stat.size / 1024, 1), "where": [f"{_source(frame.filename)}:{frame.lineno}" for frame in stat.traceback]}
                for stat in stats[:top]]


def _source(filename: str) -> str:
    """A traced file named without this machine's folders: relative to the repository, a package or the stdlib."""
    for root in (str(REPO) + "/", "site-packages/", f"python{sys.version_info[0]}.{sys.version_info[1]}/"):
        if root in filename:
            return filename.split(root, 1)[1]
    return filename


def scheduler_beside(lake: str, cron: str) -> subprocess.Popen:
    """``trajlake scheduler --job compact`` in its own process, as the deployed service runs it beside the ingester
    (``TRAJLAKE_COMPACT_CRON`` = ``cron``; it also runs the window due at its start). SIGTERM stops it."""
    env = {**os.environ, "TRAJLAKE_COMPACT_CRON": cron, "TRAJLAKE_SCHEDULER_POLL_S": "10"}
    return subprocess.Popen([sys.executable, "-c", "from trajlake.cli import main; main()", "scheduler", "--job",
                             "compact", "--lake", lake], env=env, stdout=subprocess.DEVNULL)


def scheduled_compactions(lake: str) -> list[dict]:
    """The scheduler's compaction runs recorded in the lake's ``runs`` table: window, status, seconds, files removed."""
    from store.lake import Lake
    from store.runs import RunsTable

    records = sorted(RunsTable(Lake(lake)).current(job="compact").values(), key=lambda r: r.window_end)
    return [{"window_end": r.window_end.isoformat(), "status": str(r.status),
             "seconds": round((r.ended_at - r.started_at).total_seconds(), 1) if r.ended_at else None,
             "files_removed": r.results.get("files_removed")} for r in records]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def glibc_mmapped_mb() -> float:
    """MB in glibc's blocks served by their own mmap (large ones: part of ``other_anon``)."""
    info = ctypes.CDLL(None).mallinfo2
    info.restype = _Mallinfo2
    return round(info().hblkhd / 2**20, 1)


def python_arenas_mb() -> float:
    """MB in Python's small-object arenas (1 MiB mmaps, part of ``other_anon``): ``sys._debugmallocstats``, which
    writes to the C-level stderr, read back through a temporary file."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    for line in text.splitlines():
        if line.startswith("# arenas allocated current"):
            return float(line.split("=")[1].strip().replace(",", ""))  # 1 MiB each
    return float("nan")


def glibc_malloc_mb() -> tuple[float, float]:
    """(in use, free but kept) in glibc malloc's arenas and mmaps, MB (``mallinfo2``; Linux glibc only)."""
    info = ctypes.CDLL(None).mallinfo2
    info.restype = _Mallinfo2
    m = info()
    return round((m.uordblks + m.hblkhd) / 2**20, 1), round(m.fordblks / 2**20, 1)


def workload_values(workload: Workload, *, tasks: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of each kept workload event, as a producer sends it."""
    for event in generate_events(workload.config(tasks, seed)):
        if workload.keep(event):
            yield event["rollout_id"].encode(), json.dumps(event, separators=(",", ":")).encode()


def producer(bootstrap_servers: str):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=20, batch_size=1 << 20,
                         max_request_size=64 << 20)


def produce_workload(bootstrap_servers: str, topic: str, workload: Workload, *, tasks: int,
                     seed: int) -> tuple[int, int, int]:
    """Send the workload's events (key = rollout_id); returns (messages, value bytes, token ids)."""
    out = producer(bootstrap_servers)
    n = size = ids = 0
    for key, value in workload_values(workload, tasks=tasks, seed=seed):
        out.send(topic, key=key, value=value)
        n, size, ids = n + 1, size + len(value), ids + value.count(b",")  # upper bound: commas, ~all in id lists
    out.flush()
    out.close()
    return n, size, ids


def baseline(bootstrap_servers: str, topic: str, out: Path, *, expected: int, batch_max_events: int) -> Run:
    """Consume everything with the ingester's client and write raw Parquet files, one per batch."""
    start, cpu = time.perf_counter(), time.process_time()
    consumer = open_consumer(bootstrap_servers, topic, group=None, partitions=PARTITIONS, flag=AssignmentFlag())
    consumer.seek({p: None for p in PARTITIONS})
    got = size = files = 0
    while got < expected:
        records = consumer.poll(timeout_ms=200, max_records=batch_max_events)
        if not records:
            continue
        write_raw(records, out / f"part-{files:05d}.parquet")
        got, size, files = got + len(records), size + sum(len(r.value) for r in records), files + 1
    consumer.close()
    return Run("baseline", time.perf_counter() - start, time.process_time() - cpu, got, size, peak_rss_mb())


def write_raw(records: list[Record], path: Path) -> None:
    """The baseline's work per batch: the raw messages (value, key, partition, offset) as one plain Parquet file."""
    table = pa.table({
        "value": pa.array([r.value for r in records], pa.binary()),
        "key": pa.array([r.key for r in records], pa.binary()),
        "partition": pa.array([r.partition for r in records], pa.int32()),
        "offset": pa.array([r.offset for r in records], pa.int64()),
    })
    pq.write_table(table, path)


def ingester(bootstrap_servers: str, topic: str, lake: Path, *, expected: int, batch_max_events: int) -> Run:
    """Run the real ingester until it has committed every message.

    Neither side runs an ``RssSampler``: its thread (every 0.1 s: glibc's arenas, Python's blocks, the thread list)
    cost the ingester 4-7 CPU us per ``large`` event (more than the baseline, which runs shorter), and each side's
    peak is its fresh process's high-water mark (VmHWM) anyway."""
    stop = threading.Event()

    def done(stats: IngestStats) -> None:
        if stats.consumed >= expected:
            stop.set()

    config = IngesterConfig(lake=str(lake), bootstrap_servers=bootstrap_servers, topic=topic, group="bench",
                            partitions=PARTITIONS, batch_max_events=batch_max_events)
    start, cpu = time.perf_counter(), time.process_time()
    stats = run_ingester(config, stop, on_progress=done)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if stats.events + stats.duplicates + stats.quarantined != expected:
        raise RuntimeError(f"ingester accounted for {stats.events + stats.duplicates + stats.quarantined} of "
                           f"{expected} messages: {stats}")
    return Run("ingester", seconds, cpu, stats.consumed, stats.bytes, peak_rss_mb(),
               dict(stats.cpu_s))


SIDES: dict[str, Callable[..., Run]] = {"baseline": baseline, "ingester": ingester}


def measure(side: str, bootstrap_servers: str, topic: str, out: Path, *, expected: int, batch_max_events: int) -> Run:
    """One side over every message of ``topic``, in a fresh process with the ingester's allocator settings (as
    ``trajlake ingest`` runs), timed after its imports: no state carried over from earlier rounds, and its CPU
    seconds and peak RSS are its own (not the broker's, not this process's)."""
    done = subprocess.run(
        [sys.executable, __file__, "--side", side, bootstrap_servers, topic, str(expected), str(out),
         "--batch-max-events", str(batch_max_events)],
        capture_output=True, text=True, cwd=REPO, env=configured_environment(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} round failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return Run(**json.loads(done.stdout.strip().splitlines()[-1]))


def side_child(side: str, bootstrap_servers: str, topic: str, expected: int, out: Path, batch_max_events: int) -> None:
    """``measure``'s child: run one side and print its figures as JSON (peak RSS: this process's high-water mark)."""
    out.mkdir(parents=True, exist_ok=True)
    run = SIDES[side](bootstrap_servers, topic, out, expected=expected, batch_max_events=batch_max_events)
    print(json.dumps(asdict(run)))


def bench_workload(broker: EmbeddedBroker, tmp: Path, workload: Workload, args: argparse.Namespace) -> dict:
    topic = f"bench.{workload.name}"
    broker.create_topic(topic, partitions=len(PARTITIONS))
    messages, size, ids = produce_workload(broker.bootstrap_servers, topic, workload, tasks=args.tasks, seed=args.seed)
    print(f"{workload.name}: produced {messages:,} events ({size / 1e6:,.1f} MB, {size / messages / 1e3:.1f} KB "
          f"and <= {ids / messages:,.0f} token ids each) on {len(PARTITIONS)} partitions", flush=True)
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    loads: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(args.rounds):
        for side in SIDES if i % 2 == 0 else reversed(SIDES):  # each side goes first in every other round
            loads[side].append(os.getloadavg()[0])
            run = measure(side, broker.bootstrap_servers, topic, tmp / f"{workload.name}-{side}-{i}",
                          expected=messages, batch_max_events=args.batch_max_events)
            runs[side].append(run)
            print(f"  round {i + 1} {side:9s} {run.seconds:6.2f} s {run.events_per_s:9,.0f} events/s "
                  f"{run.cpu_seconds / messages * 1e6:5.0f} CPU us/event (peak RSS {run.peak_rss_mb:,.0f} MB, "
                  f"load {loads[side][-1]:.1f})", flush=True)
    ratios = [o.events_per_s / b.events_per_s for b, o in zip(runs["baseline"], runs["ingester"])]
    cpu_ratios = [b.cpu_seconds / o.cpu_seconds for b, o in zip(runs["baseline"], runs["ingester"])]
    ours = runs["ingester"]
    stages = {s: statistics.median(r.cpu_s.get(s, 0.0) for r in ours) for s in ours[0].cpu_s}
    stages["other"] = max(0.0, statistics.median(r.cpu_seconds for r in ours) - sum(stages.values()))
    figures = {
        "events": messages, "bytes": size, "token_ids_at_most": ids,
        **{f"{side}_events_per_s": statistics.median(r.events_per_s for r in rs) for side, rs in runs.items()},
        **{f"{side}_cpu_us_per_event": statistics.median(r.cpu_seconds for r in rs) / messages * 1e6
           for side, rs in runs.items()},
        "ingester_peak_rss_mb": statistics.median(r.peak_rss_mb for r in ours),
        "ratios": ratios, "cpu_ratios": cpu_ratios,
        "seconds": {side: [r.seconds for r in rs] for side, rs in runs.items()},
        "cpu_seconds": {side: [r.cpu_seconds for r in rs] for side, rs in runs.items()},
        "peak_rss_mb": {side: [r.peak_rss_mb for r in rs] for side, rs in runs.items()},
        "load_average_1min": loads,
    }
    split = "  ".join(f"{s} {v / messages * 1e6:.0f}" for s, v in stages.items())
    print(f"  {workload.name}: per CPU second {statistics.median(cpu_ratios):.2f} (rounds: "
          f"{', '.join(f'{r:.2f}' for r in cpu_ratios)}); events/s {statistics.median(ratios):.2f} (rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}) | ingester {figures['ingester_events_per_s']:,.0f} vs baseline "
          f"{figures['baseline_events_per_s']:,.0f} events/s\n"
          f"  ingester CPU us/event by stage: {split}", flush=True)
    return {"workload": workload, "ratios": ratios, "cpu_ratios": cpu_ratios, "stages": stages, "figures": figures}


def main_bench(args: argparse.Namespace) -> int:
    recorder = Recorder("ingest", "broker -> committed Delta rows (validation, dedupe, quarantine, exactly-once "
                                  "markers) vs a consumer writing raw Parquet (both confluent-kafka), 4 partitions, "
                                  "each round one fresh process per side, sides alternating; "
                                  + "; ".join(f"`{w}`: {WORKLOADS[w].description}" for w in args.workloads.split(",")))
    done = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        for name in args.workloads.split(","):
            done.append(bench_workload(broker, Path(tmp), WORKLOADS[name], args))
    ratios = []
    for d in done:
        name = d["workload"].name
        ratios += [Ratio(f"{name}_cpu", f"{name}: CPU per committed event, baseline / ingester (the figure: "
                                        "steadier under load)", d["cpu_ratios"], goal=GOAL),
                   Ratio(name, f"{name}: events/s, ingester / baseline", d["ratios"], goal=GOAL)]
    summary = "; ".join(
        f"{d['workload'].name}: {d['figures']['ingester_cpu_us_per_event']:,.0f} vs "
        f"{d['figures']['baseline_cpu_us_per_event']:,.0f} CPU us/event, {d['figures']['ingester_events_per_s']:,.0f} "
        f"vs {d['figures']['baseline_events_per_s']:,.0f} events/s ({d['figures']['events']:,} events of "
        f"{d['figures']['bytes'] / d['figures']['events'] / 1e3:.1f} KB, {args.rounds} rounds)" for d in done)
    recorder.write(
        ratios=ratios, summary=summary,
        peak_rss_mb={f"ingester, {d['workload'].name}": d["figures"]["ingester_peak_rss_mb"] for d in done},
        cpu_s_by_stage={d["workload"].name: d["stages"] for d in done},
        detail={"rounds": args.rounds, "batch_max_events": args.batch_max_events, "tasks": args.tasks,
                "seed": args.seed, "partitions": len(PARTITIONS), "allocator_environment": configured_environment(
                    only_settings=True), "workloads": {d["workload"].name: d["figures"] for d in done}},
    )
    for r in ratios:
        print(f"{r.label}: {r.value:.2f} ({'meets' if r.meets else 'MISSES'} the {r.goal:.0%} goal)")
    return 0


def soak_producer(bootstrap_servers: str, topic: str, rate: float, seconds: float) -> None:
    """Send fresh workload events (new seed per pass) at ``rate`` events/s for ``seconds``."""
    out = producer(bootstrap_servers)
    started, sent, seed = time.monotonic(), 0, 1000
    while time.monotonic() - started < seconds:
        for key, value in workload_values(WORKLOADS["full_prompt"], tasks=4, seed=seed):
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            if time.monotonic() - started >= seconds:
                break
            out.send(topic, key=key, value=value)
            sent += 1
        seed += 1
    out.flush()
    out.close()
    print(json.dumps({"sent": sent}), flush=True)


def slope_mb_per_min(samples: list[tuple[float, float]], *, after_s: float) -> float:
    points = [(t / 60, mb) for t, mb in samples if t >= after_s]
    if len(points) < 2:
        return float("nan")
    return statistics.linear_regression([t for t, _ in points], [mb for _, mb in points]).slope


def main_soak(args: argparse.Namespace) -> int:
    seconds = args.soak_minutes * 60
    recorder = Recorder("ingest_soak", "the ingester alone against a producer of fresh full_prompt events, static "
                                       "assignment; RSS, Arrow pool, glibc malloc and Python blocks every 10 s")
    topic = "bench.soak"
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-ingest-soak-") as tmp:
        broker.create_topic(topic, partitions=len(PARTITIONS))
        feeder = subprocess.Popen(
            [sys.executable, __file__, "--soak-producer", broker.bootstrap_servers, "--soak-rate", str(args.soak_rate),
             "--soak-minutes", str(args.soak_minutes)], stdout=subprocess.PIPE, text=True)
        stop = threading.Event()
        config = IngesterConfig(lake=str(Path(tmp) / "lake"), bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                group="soak", partitions=PARTITIONS, dedupe_max_ids=args.soak_dedupe_ids)
        timer = threading.Timer(seconds + 5, stop.set)
        timer.start()
        sampler = RssSampler(SOAK_SAMPLE_S, by_region=True, lake=Path(config.lake))
        compactions: list[float] = []
        between = BetweenBatches(sampler)
        compactor = threading.Thread(target=compact_every, args=(config.lake, args.soak_compact_every_s, stop, compactions),
                                     daemon=True)
        heap = HeapSnapshots(args.soak_tracemalloc, sampler)
        scheduler = None
        try:
            with sampler, heap:
                if args.soak_compact_every_s:
                    compactor.start()
                if args.soak_compact_cron:
                    scheduler = scheduler_beside(config.lake, args.soak_compact_cron)
                stats = run_ingester(config, stop, on_progress=between)
        finally:
            timer.cancel()
            stop.set()
            if compactor.is_alive():
                compactor.join()
            if scheduler is not None:
                scheduler.terminate()  # SIGTERM: a running compaction finishes first
                scheduler.wait(600)
            feeder.wait(60)
        checkpoints = checkpoint_files(Path(config.lake))
        scheduled = scheduled_compactions(config.lake) if args.soak_compact_cron else []
    slope = slope_mb_per_min(sampler.samples, after_s=seconds / 2)
    slope_after_warm_up = slope_mb_per_min(sampler.samples, after_s=60)
    slope_after_2_min = slope_mb_per_min(sampler.samples, after_s=120)
    by_minute = [next((mb for t, mb in sampler.samples if t >= 60 * m), sampler.samples[-1][1])
                 for m in range(1, int(args.soak_minutes) + 1)]
    after_1_min = next(mb for t, mb in sampler.samples if t >= 60) if seconds > 60 else sampler.samples[0][1]
    growth = Ratio("rss_growth", f"ingester RSS at the end / after its first minute, {args.soak_minutes:g}-minute "
                                 f"soak at {args.soak_rate:g} events/s", [sampler.samples[-1][1] / after_1_min],
                   goal=1.10, better="lower")
    between_slope = slope_mb_per_min(between.samples, after_s=120)
    between_swing = swing_mb(between.samples, after_s=120)
    per_table_hour = {name: {"files": n, "bytes_per_hour": size * 3600 / seconds, "versions": v}
                      for name, (n, size, v) in checkpoints.items()}
    checkpoint_mb_per_hour = statistics.mean(t["bytes_per_hour"] for t in per_table_hour.values()) / 2**20
    result = {"minutes": args.soak_minutes, "rate": args.soak_rate, "dedupe_max_ids": args.soak_dedupe_ids,
              "allocators": args.soak_allocators, "cadence": args.soak_cadence,
              "between_batches_slope_mb_per_min_after_minute_2": between_slope,
              "between_batches_swing_mb_after_minute_2": between_swing,
              "between_batches_rss_mb_samples": [[round(t, 1), round(mb, 1)] for t, mb in between.samples],
              "between_batches_threads_samples": between.threads, "between_batches_consumed": between.consumed,
              "checkpoints_by_table": per_table_hour, "checkpoint_mb_per_hour_per_table": checkpoint_mb_per_hour,
              "allocator_environment": {k: v for k, v in os.environ.items()
                                        if k in allocators.ENVIRONMENT or k.startswith("MALLOC_")},
              "slope_mb_per_min_after_minute_2": slope_after_2_min,
              "events": stats.events, "batches": stats.batches, "slope_mb_per_min_second_half": slope,
              "slope_mb_per_min_after_first_minute": slope_after_warm_up,
              "rss_mb_at_minutes": [round(mb, 1) for mb in by_minute],
              "rss_mb_samples": [[round(t, 1), round(mb, 1)] for t, mb in sampler.samples],
              "arrow_pool_mb_samples": [round(mb, 1) for mb in sampler.arrow],
              "glibc_malloc_mb_in_use_free_samples": sampler.malloc,
              "python_allocated_blocks_samples": sampler.python_blocks, "threads_samples": sampler.threads,
              "live_files_samples": sampler.files, "compact_every_s": args.soak_compact_every_s,
              "compactions_s": [round(c, 1) for c in compactions],
              "compact_cron": args.soak_compact_cron, "scheduled_compactions": scheduled,
              "tracemalloc_frames": args.soak_tracemalloc, "python_heap_growth": heap.growth(),
              "python_heap_traced_mb_at_minutes": heap.traced_mb,
              "anon_mappings_at_minutes": sampler.mappings, "glibc_heaps_at_minutes": sampler.glibc_heaps,
              "threads_by_name_at_minutes": sampler.threads_by_name,
              "live_files_per_min_after_minute_2": slope_mb_per_min(
                  [(t, n) for (t, _), n in zip(sampler.samples, sampler.files)], after_s=120),
              "resident_mb_by_region_samples": sampler.regions}
    first, last = sampler.samples[0][1], sampler.samples[-1][1]
    recorder.write(ratios=[growth], summary=f"RSS {first:,.0f} -> {after_1_min:,.0f} MB after 1 min -> {last:,.0f} MB "
                   f"at the end; slope after minute 2 {slope_after_2_min:+.1f} MB/min (second half {slope:+.1f}, after the "
                   f"first minute {slope_after_warm_up:+.1f}); between batches {between_slope:+.1f} MB/min, swing "
                   f"{between_swing:.0f} MB; cadence {args.soak_cadence}, checkpoints {checkpoint_mb_per_hour:.1f} MB/h "
                   f"per table; allocators {args.soak_allocators}"
                   f"{f'; trajlake compact every {args.soak_compact_every_s:g} s' if args.soak_compact_every_s else ''}"
                   f"{f'; scheduler compact {args.soak_compact_cron!r}: {len(scheduled)} run(s)' if scheduled else ''}"
                   f"{f'; tracemalloc on ({args.soak_tracemalloc} frames)' if args.soak_tracemalloc else ''}; "
                   f"data files {sampler.files[0]:,} -> {sampler.files[-1]:,}; threads {sampler.threads[0]} -> {sampler.threads[-1]}; {stats.events:,} events",
                   peak_rss_mb={"soak": sampler.peak}, detail=result, path=Path(args.soak_out))
    print(f"soak: {args.soak_minutes} min, {stats.events:,} events in {stats.batches:,} batches; RSS {first:,.0f} -> "
          f"{last:,.0f} MB (peak {sampler.peak:,.0f}); slope after minute 2 {slope_after_2_min:+.2f} MB/min, over the second "
          f"half {slope:+.2f}; between batches {between_slope:+.2f} (swing {between_swing:.0f} MB); cadence "
          f"{args.soak_cadence}: checkpoints {checkpoint_mb_per_hour:.2f} MB/h per table; threads "
          f"{min(between.threads, default=0)}-{max(between.threads, default=0)}")
    return 0


class BetweenBatches:
    """RSS and threads right after each committed batch (the ingester's ``on_progress``, after its free-memory trim):
    every sample at the same point of the cycle, with no batch in flight, where the 10-s samples land anywhere in it."""

    def __init__(self, sampler: RssSampler) -> None:
        self.samples: list[tuple[float, float]] = []
        self.threads: list[int] = []
        self.consumed: list[int] = []
        """Messages consumed by then: the batches' sizes, which grow when the ingester falls behind."""
        self._started = sampler.started

    def __call__(self, stats: IngestStats) -> None:
        self.samples.append((time.monotonic() - self._started, rss_mb()))
        self.threads.append(threading_native_count())
        self.consumed.append(stats.consumed)


def swing_mb(samples: list[tuple[float, float]], *, after_s: float) -> float:
    """Highest less lowest RSS after ``after_s`` once the least-squares line is taken off (MB)."""
    points = [(t / 60, mb) for t, mb in samples if t >= after_s]
    if len(points) < 2:
        return float("nan")
    fit = statistics.linear_regression([t for t, _ in points], [mb for _, mb in points])
    residuals = [mb - (fit.intercept + fit.slope * t) for t, mb in points]
    return max(residuals) - min(residuals)


def checkpoint_files(lake: Path) -> dict[str, tuple[int, int, int]]:
    """Per ingested table of a local lake: checkpoint files, their bytes, and the table's last version."""
    out = {}
    for table in INGESTED_TABLES:
        log = lake / table / "_delta_log"
        files = list(log.glob("*.checkpoint*.parquet"))
        versions = [int(path.name.split(".")[0]) for path in log.glob("*.json")]
        out[table] = (len(files), sum(path.stat().st_size for path in files), max(versions, default=-1))
    return out


def compact_every(lake: str, every_s: float, stop: threading.Event, took_s: list[float]) -> None:
    """Run ``trajlake compact`` on the ingested tables of ``lake`` in its own process every ``every_s`` seconds until
    ``stop``; the seconds each run took go to ``took_s``. Removed files are vacuumed at once, so that the files on disk
    are the live ones."""
    tables = [arg for name in INGESTED_TABLES for arg in ("--table", name)]
    while not stop.wait(every_s):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "from trajlake.cli import main; main()", "compact", "--lake", lake,
                        "--vacuum-hours", "0", *tables], check=True, stdout=subprocess.DEVNULL)
        took_s.append(time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=60, help="workload tasks (x 8 rollouts each)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs both sides, alternating which first")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--batch-max-events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--soak-minutes", type=float, default=0, help="run the RSS soak instead of the ratio bench")
    parser.add_argument("--soak-rate", type=float, default=300, help="events/s sent during the soak")
    parser.add_argument("--soak-dedupe-ids", type=int, default=1_000_000, help="the ingester's dedupe_max_ids")
    parser.add_argument("--soak-out", default=str(Path(__file__).parent / "soak.json"), help="where the soak's samples go")
    parser.add_argument("--soak-allocators", choices=("configured", "default"), default="configured",
                        help="the ingester's allocator settings (ingest.allocators, as `trajlake ingest` applies "
                             "them) or the libraries' defaults")
    parser.add_argument("--soak-compact-every-s", type=float, default=0,
                        help="during the soak, run `trajlake compact` every this many seconds (0: never)")
    parser.add_argument("--soak-compact-cron", default=SchedulerSettings.model_fields["compact_cron"].default,
                        help="during the soak, run the scheduler's compaction job beside the ingester "
                             "(`trajlake scheduler --job compact`, TRAJLAKE_COMPACT_CRON; default: the service's "
                             "default; '': off)")
    parser.add_argument("--soak-tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="trace Python's heap with this many frames per allocation and report the sites that grew "
                             "(0: off; a diagnostic: tracing costs CPU and memory)")
    parser.add_argument("--soak-cadence", choices=sorted(store.commit.CADENCES),
                        default=next(k for k, v in store.commit.CADENCES.items() if v == store.commit.CADENCE),
                        help="when the ingester's tables reopen their Delta snapshots (store.commit.CADENCES)")
    parser.add_argument("--soak-producer", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    parser.add_argument("--side", nargs=5, metavar=("SIDE", "BOOTSTRAP", "TOPIC", "EXPECTED", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        side, bootstrap, topic, expected, out = args.side
        side_child(side, bootstrap, topic, int(expected), Path(out), args.batch_max_events)
        return 0
    unknown = set(args.workloads.split(",")) - WORKLOADS.keys()
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}: choose from {', '.join(WORKLOADS)}")
    if args.soak_producer:
        soak_producer(args.soak_producer, "bench.soak", args.soak_rate, args.soak_minutes * 60)
        return 0
    if args.soak_minutes and args.soak_allocators == "configured" and not allocators_configured():
        configure_and_restart()
    store.commit.CADENCE = store.commit.CADENCES[args.soak_cadence]
    return main_soak(args) if args.soak_minutes else main_bench(args)


GLIBC_ENVIRONMENT = {"MALLOC_ARENA_MAX": str(allocators.GLIBC_ARENAS),
                     "MALLOC_MMAP_THRESHOLD_": str(allocators.GLIBC_MMAP_THRESHOLD)}
"""glibc's ``M_ARENA_MAX`` and ``M_MMAP_THRESHOLD`` as variables: what ``ingest.allocators.configure`` sets by
``mallopt`` in ``trajlake ingest``."""


def allocators_configured() -> bool:
    return all(name in os.environ for name in (*allocators.ENVIRONMENT, *GLIBC_ENVIRONMENT))


def configured_environment(*, only_settings: bool = False) -> dict[str, str]:
    """This process's environment with the ingester's allocator settings added (a variable already set wins);
    ``only_settings``: just those variables."""
    env = {**allocators.ENVIRONMENT, **GLIBC_ENVIRONMENT, **os.environ}
    return {k: env[k] for k in (*allocators.ENVIRONMENT, *GLIBC_ENVIRONMENT)} if only_settings else env


def configure_and_restart() -> NoReturn:
    """This process again with the ingester's allocator settings in its environment (they must be in place before
    Arrow and delta-rs load, and this module imports both)."""
    os.execve(sys.executable, [sys.executable, *sys.argv], configured_environment())


if __name__ == "__main__":
    sys.exit(main())
