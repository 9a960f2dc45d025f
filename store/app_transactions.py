"""A Delta table's app transaction versions (the ingester's markers), kept up to date from the new log entries.

deltalake 1.6.6's ``DeltaTable.transaction_version`` replays the whole log since the last checkpoint on
every call (up to 100 commit JSONs), reading every entry at once: on a local lake each read is a task on
tokio's blocking pool, which grows to the most reads ever in flight and keeps its threads while they are
reused within 10 s. Measured on a table 95 commits past its checkpoint: one call took the process from 4
to 63 threads; the ingester made 4 such calls per table per commit cycle, 9 tables side by side, and held
80-306 threads (bench/ingest/README.md, memory). Here each version is read that way once per app id, and
afterwards only the commits since are read (one entry per table per commit cycle; several are read
``ENTRY_READERS`` at a time).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from deltalake import DeltaTable

from store.lake import Lake


class AppTransactions:
    """App id -> latest transaction version of one table, replayed forward commit by commit."""

    def __init__(self, lake: Lake, table: str) -> None:
        self._lake = lake
        self._log = f"{table}/_delta_log"
        self._versions: dict[str, int | None] = {}
        self._through: int | None = None
        """Table version the versions above are current through."""

    def versions(self, delta: DeltaTable, app_ids: Iterable[str]) -> dict[str, int | None]:
        """The latest version of each app id in ``delta``'s snapshot (None: never committed)."""
        current = delta.version()
        if self._through is not None and not self._replay(self._through, current):
            self._versions.clear()  # entries gone (forget drops old log entries) or table replaced: read afresh
        self._through = current
        for app_id in app_ids:
            if app_id not in self._versions:
                self._versions[app_id] = delta.transaction_version(app_id)
        return {app_id: self._versions[app_id] for app_id in app_ids}

    def _replay(self, through: int, current: int) -> bool:
        """Apply the ``txn`` actions of commits ``through + 1 .. current``; False when one cannot be read."""
        if current < through:
            return False
        committed = _txn_versions(self._lake, self._log, through + 1, current)
        if committed is None:
            return False
        self._versions.update((app_id, v) for app_id, v in committed.items() if app_id in self._versions)
        return True


def _txn_versions(lake: Lake, log: str, first: int, last: int) -> dict[str, int] | None:
    """App id -> the version its latest ``txn`` action in commits ``first .. last`` of the log folder ``log`` set;
    None when one of those commits cannot be read. Entries are read ``ENTRY_READERS`` at a time (an object store's
    round trips, not its bandwidth, are the cost; measured in README, "Operations"), and no further than the first
    group holding one that cannot be read (a log cleaned up below its checkpoint must not cost a read per version)."""
    versions: dict[str, int] = {}
    paths = [f"{log}/{version:020d}.json" for version in range(first, last + 1)]
    for start in range(0, len(paths), ENTRY_READERS):
        for entry in _read_entries(lake, paths[start:start + ENTRY_READERS]):
            if entry is None:
                return None
            for line in entry.splitlines():
                if b'"txn"' in line and (txn := json.loads(line).get("txn")):
                    versions[txn["appId"]] = int(txn["version"])
    return versions


ENTRY_READERS = 16
"""Log entries read at once by ``_read_entries`` (Python threads over pyarrow's filesystem, not tokio's pool)."""


def _read_entries(lake: Lake, paths: list[str]) -> list[bytes | None]:
    """``Lake.read_file`` of each of ``paths``, in order; several at once when there are several."""
    if len(paths) <= 1:
        return [lake.read_file(path) for path in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(ENTRY_READERS, len(paths))) as pool:
        return list(pool.map(lake.read_file, paths))


def ingest_positions(lake: Lake, table: str, version: int, *,
                     interval: int | None = None) -> dict[tuple[str, int], int] | None:
    """(topic, partition) -> the furthest offset an ingester committed into ``table`` as of ``version``, from its
    exactly-once markers (``store.commit.marker_app_id``): the last checkpoint at or before ``version``, then the
    commits after it. None when the log cannot be read through ``version``: e.g. a version inside a ``trajlake
    forget``, after its delete and before its new checkpoint, whose older entries and checkpoints it dropped (the
    caller reads a newer version instead). ``interval``: the table's ``delta.checkpointInterval`` (default:
    ``store.commit.DELTA_CHECKPOINT_INTERVAL``), whose multiples are probed for that checkpoint.

    The furthest marker over consumer groups counts, so a group that no longer runs keeps lifting the cap after a
    ``trajlake ingest --recover`` of another group (its marker stays on the old log's offsets, and the new log's rows
    below it count as compacted): a user recovers every group that ever wrote the topic (``trajlake ingest
    --recover --group G``; it re-reads the log and writes only what the lake lacks), then runs ``trajlake rebuild``
    if a compaction ran in between."""
    from store.commit import DELTA_CHECKPOINT_INTERVAL, MARKER_PREFIX

    log = f"{table}/_delta_log"
    start, versions = _checkpoint_at_most(lake, log, version, interval or DELTA_CHECKPOINT_INTERVAL) or (0, {})
    since = _txn_versions(lake, log, start, version)
    if since is None:
        return None
    versions.update(since)
    positions: dict[tuple[str, int], int] = {}
    for app_id, offset in versions.items():
        if app_id.startswith(MARKER_PREFIX):
            _, topic, partition = app_id.rsplit(":", 2)  # a group may hold ":", a Kafka topic cannot
            key = (topic, int(partition))
            positions[key] = max(offset, positions.get(key, offset))
    return positions


CHECKPOINT_PROBES = 3
"""Multiples of the checkpoint interval probed (newest first) before the log folder is listed."""


def _checkpoint_at_most(lake: Lake, log: str, version: int, interval: int) -> tuple[int, dict[str, int]] | None:
    """(the version after the newest single-file checkpoint at or before ``version``, the app transactions it holds);
    None when there is none (the commits are then read from the first). ``_last_checkpoint`` names the newest; when
    one was written since (past ``version``), the ``CHECKPOINT_PROBES`` multiples of ``interval`` at or below
    ``version`` are tried (the ingester's checkpoints), and only then the log folder listed (a forget's checkpoint
    sits at its own version; a 30-day log holds ~1M objects, 1,000+ LIST pages)."""
    pointer = lake.read_file(f"{log}/_last_checkpoint")
    try:
        newest = json.loads(pointer) if pointer else None
        at = int(newest["version"]) if newest and not newest.get("parts") else None
    except (ValueError, KeyError, TypeError):
        at = None
    if at is not None and at <= version:
        return _checkpoint_txns(lake, log, at)
    for probe in range(version - version % interval, -1, -interval)[:CHECKPOINT_PROBES]:
        if (found := _checkpoint_txns(lake, log, probe)) is not None:
            return found
    at = max((v for v in _checkpoint_versions(lake, log) if v <= version), default=None)
    return None if at is None else _checkpoint_txns(lake, log, at)


def _checkpoint_txns(lake: Lake, log: str, at: int) -> tuple[int, dict[str, int]] | None:
    """(``at + 1``, the app transactions of the single-file checkpoint at ``at``); None when it is absent."""
    import io

    import pyarrow.parquet as pq

    data = lake.read_file(f"{log}/{at:020d}.checkpoint.parquet")
    if data is None:
        return None
    txns = pq.read_table(io.BytesIO(data), columns=["txn"]).column("txn").to_pylist()
    return at + 1, {txn["appId"]: int(txn["version"]) for txn in txns if txn}


def _checkpoint_versions(lake: Lake, log: str) -> list[int]:
    """Versions of the single-file checkpoints in the log folder ``log``."""
    from pyarrow import fs as pafs

    from store.storage import arrow_filesystem

    filesystem, root = arrow_filesystem(f"{lake.root.rstrip('/')}/{log}", lake.storage_options)
    names = [info.base_name for info in filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))]
    return [int(name.split(".", 1)[0]) for name in names
            if name.endswith(".checkpoint.parquet") and name.split(".", 1)[0].isdigit() and name.count(".") == 2]
