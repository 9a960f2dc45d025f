"""The tail's recomputed rows kept on disk, so that one-shot queries (``trajlake sql``) do not recompute them.

A connection that answers one statement (``store.prejoin.prejoined_views`` with ``keep=False``) recomputes the
rollouts the tail touched from the typed tables inside that statement: on the 1M-call bench lake with a 5-minute
tail, finding their old rows reads the ``rollout_id`` column of every compacted typed file (no index; the files are
z-ordered): 0.7-2.0 CPU s a ``trajlake sql`` process, most of it those scans (README, "SQL at scale"). Those rows
depend only on the marks and on the typed tables' commits since: the first one-shot query of a tail that has taken no
commit for ``QUIET_S`` writes each view's rows it recomputed (and the touched ids) to a DuckDB file under the lake,
``_sql_cache/tail/<key>/<view>.duckdb``; the next ones attach it read-only.

``key`` hashes the marks (versions, offsets, when written), the text of every typed table's log entry past its mark
(so a new commit, a forget's delete, an optimize, a recreated table all give another key), the views' statements
and DuckDB's version. Only a local lake keeps one (an object store would pay a request per log entry and a shared
writable folder; it recomputes as before), and only when the typed tables the connection pinned are the versions
hashed (``Heads``: read before they were pinned, checked after). Files are written under a temporary name and
renamed, so a reader sees a whole file or none; ``store.forget`` removes the folder (a forgotten rollout's rows must
not stay in it), and a write keeps the newest ``KEEP`` keys. A folder that cannot be written (a read-only lake, a
full disk), a tail too big to hold in memory (``MAX_TAIL_BYTES``, ``MAX_KEPT_TOKENS``), running out of memory, or a
damaged kept file (discarded, written again) only costs the recompute; a failed write leaves no scratch file. Known limit: a one-shot
killed (SIGKILL) between renaming its files and checking that no forget landed meanwhile leaves rows of a forgotten
rollout under a key that never matches again, until four newer keys are written or the next forget clears the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from store.lake import Lake

log = logging.getLogger(__name__)

CACHE_DIR = "_sql_cache/tail"
"""Under the lake root: a folder starting with ``_`` is never a table (``store.sql.discover_tables``)."""
KEEP = 4
"""Keys kept (the newest by change time): an older key never matches again once the typed tables moved."""
QUIET_S = 60.0
"""A tail is kept once no typed table it reads has taken a commit for this long. Writing the rows costs the one-shot
that does it about what a kept connection's connect costs (every column of the tail's typed rows: on the 1M-call bench
lake 1.5-1.9 CPU s against 0.9-1.0 for ``count(*)`` of ``llm_calls`` recomputed in the statement), and an ingester
that commits every ~20 s would make each kept tail stale before the next question: a lake still being written
recomputes in the statement, as before."""
MAX_TAIL_BYTES = 32 << 20
"""A tail is kept only when the data files its log entries add hold at most this many bytes (Parquet, compressed):
writing it reads every column of the tail's typed rows into memory at once (~8-10x the files' bytes: 150 rollouts of
200k-token prompts took a one-shot from ~130 MiB to 1.0-1.3 GiB); a bigger tail is recomputed in the statement,
which streams."""
MAX_KEPT_TOKENS = 4_000_000
"""A tail is kept only when the rollouts it touched held at most this many prompt and response tokens when they were
compacted (``store.prejoin``'s estimate from the compacted tables' counts): writing the rows reads every typed row of
those rollouts, old ones included, and late rewards for long-context rollouts are a small tail over big rows
(measured: ~35-40 bytes of a one-shot's memory per token; 60 rollouts of 200k-token prompts took it from 175 to
642 MB behind a 7.8 KB tail). About 150 MB here; a bigger one is recomputed in the statement, which streams."""
FORMAT = "1"
"""Changes when what a file holds changes: older files then never match."""


@dataclass(frozen=True)
class Heads:
    """The typed tables' newest versions, read before a connection pinned them, and their log entries past the
    marks (what ``key`` hashes)."""

    versions: Mapping[str, int]
    entries: Mapping[str, tuple[bytes, ...]]
    newest: float | None = None
    """When the newest of those entries was written (epoch seconds; None: no entry past the marks)."""

    def keepable(self, now: float) -> bool:
        """Whether to write the tail's rows: no typed table has taken a commit for ``QUIET_S``, and the files the
        entries add are small enough to hold in memory (``MAX_TAIL_BYTES``)."""
        return self.newest is not None and now - self.newest >= QUIET_S and self.added_bytes() <= MAX_TAIL_BYTES

    def added_bytes(self) -> int:
        """Bytes of the data files the entries past the marks add."""
        total = 0
        for texts in self.entries.values():
            for text in texts:
                for line in text.splitlines():
                    if line.startswith(b'{"add"'):
                        total += int(json.loads(line)["add"].get("size") or 0)
        return total


def heads(lake: Lake, marked: Mapping[str, int], sources: Iterable[str]) -> Heads | None:
    """Each of ``sources``' newest version, walked from its marked version (``marked``; -1: not written then) one log
    entry at a time; None for a lake that keeps no cache, or when an entry cannot be read."""
    if not lake.is_local:
        return None
    versions, entries, newest = {}, {}, None
    for source in sources:
        version, texts = marked.get(source, -1), []
        while (text := lake.read_file(f"{source}/_delta_log/{version + 1:020d}.json")) is not None:
            texts.append(text)
            version += 1
        if version == marked.get(source, -1) and lake.checkpointed_past(source, version):
            return None  # entries past the mark were cleaned up: the tail is told by offsets, not cached
        if texts:
            written = _mtime(lake, f"{source}/_delta_log/{version:020d}.json")
            newest = written if newest is None else max(newest, written)
        versions[source], entries[source] = version, tuple(texts)
    return Heads(versions, entries, newest)


def unchanged(lake: Lake, found: Heads) -> bool:
    """Whether no typed table has a commit past ``found`` (one file stat each): the tables pinned since are then
    exactly those versions."""
    root = lake.root.removeprefix("file://")
    return not any(os.path.exists(os.path.join(root, source, "_delta_log", f"{version + 1:020d}.json"))
                   for source, version in found.versions.items())


def key(found: Heads, marks: object, statements: Mapping[str, str]) -> str:
    """What the tail's rows depend on, hashed (``marks``: ``store.prejoin.Marks``, compared by its ``repr``)."""
    digest = hashlib.sha256()
    for part in (FORMAT, duckdb.__version__, repr(marks), json.dumps(sorted(statements.items()))):
        digest.update(part.encode() + b"\0")
    for source in sorted(found.entries):
        digest.update(source.encode() + b"\0")
        for text in found.entries[source]:
            digest.update(hashlib.sha256(text).digest())
    return digest.hexdigest()[:32]


def folder(lake: Lake, cache_key: str) -> Path:
    return Path(lake.root.removeprefix("file://")) / CACHE_DIR / cache_key


def attach(con: duckdb.DuckDBPyConnection, lake: Lake, cache_key: str, views: Iterable[str]) -> list[str] | None:
    """Attach the kept rows of ``views`` (catalog ``_tail_<view>``, table ``rows``); returns the touched ids kept
    with them, None when any view's file is missing (nothing attached then)."""
    paths = {view: folder(lake, cache_key) / f"{view}.duckdb" for view in views}
    if not all(path.exists() for path in paths.values()):
        return None
    attached = []
    try:
        for view, path in paths.items():
            con.execute(f"ATTACH '{_quote(str(path))}' AS \"_tail_{view}\" (READ_ONLY)")
            attached.append(view)
        return [row[0] for row in con.execute(f'SELECT rollout_id FROM "_tail_{attached[0]}".touched '
                                              f'ORDER BY rollout_id').fetchall()]
    except duckdb.Error as exc:  # removed meanwhile (a forget, another key's write) or damaged: recompute
        log.info("tail_cache.attach_failed error=%r", str(exc).splitlines()[0])
        for view in attached:
            con.execute(f'DETACH "_tail_{view}"')
        discard(lake, cache_key)  # a damaged file is written again by the next one-shot
        return None


def write(con: duckdb.DuckDBPyConnection, lake: Lake, cache_key: str, rows: Mapping[str, str], touched: str) -> bool:
    """Write each view's rows (``rows``: view -> a query of them) and the touched ids (``touched``: a query of
    ``rollout_id``) to the key's folder, then ``attach`` them; False when the folder cannot be written."""
    target = folder(lake, cache_key)
    try:
        target.mkdir(parents=True, exist_ok=True)
        for view, query in rows.items():
            path = target / f"{view}.duckdb"
            if path.exists():
                continue
            scratch = target / f".{view}.{uuid.uuid4().hex}.tmp"
            try:
                con.execute(f"ATTACH '{_quote(str(scratch))}' AS _tail_write")
                try:
                    con.execute(f"CREATE TABLE _tail_write.rows AS {query}")
                    con.execute(f"CREATE TABLE _tail_write.touched AS {touched}")
                finally:
                    con.execute("DETACH DATABASE IF EXISTS _tail_write")
                os.replace(scratch, path)
            except BaseException:  # a full disk, out of memory, Ctrl-C: no scratch left behind
                for leftover in (scratch, scratch.with_name(scratch.name + ".wal")):
                    leftover.unlink(missing_ok=True)
                raise
    except (OSError, duckdb.Error) as exc:
        log.info("tail_cache.write_failed error=%r", str(exc).splitlines()[0])
        return False
    _prune(target.parent, keep=target.name)
    return True


def writable(lake: Lake) -> bool:
    """Whether kept files can be written under the lake (checked before the tail's rows are read to keep them: a
    read-only lake would pay that read on every one-shot for nothing)."""
    parent = Path(lake.root.removeprefix("file://")) / CACHE_DIR
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(parent, os.W_OK)


def damaged_keys(con: duckdb.DuckDBPyConnection, error: str) -> list[str]:
    """The keys attached to ``con`` whose files ``error`` (DuckDB's IO error of a failed statement) is about: one
    that names a path under a key's folder, or DuckDB's "Corrupt database file" (only kept files are DuckDB
    databases here; it names no path): every attached key. Any other IO error (a lake file gone) names none."""
    paths = [Path(path) for (path,) in con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name LIKE '\\_tail\\_%' ESCAPE '\\'").fetchall() if path]
    corrupt = "Corrupt database file" in error
    return sorted({path.parent.name for path in paths if corrupt or str(path.parent) in error})


def discard(lake: Lake, cache_key: str) -> None:
    """Remove one key's files (written for versions that moved while they were computed)."""
    shutil.rmtree(folder(lake, cache_key), ignore_errors=True)


def clear(lake: Lake) -> None:
    """Remove every kept file (``store.forget``: a forgotten rollout's rows must not stay on disk)."""
    if lake.is_local:
        shutil.rmtree(Path(lake.root.removeprefix("file://")) / CACHE_DIR, ignore_errors=True)


def _prune(parent: Path, *, keep: str) -> None:
    """Remove all but the newest ``KEEP`` keys' folders (and ``keep``'s)."""
    try:
        folders = sorted((p for p in parent.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in folders[KEEP:]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def _mtime(lake: Lake, path: str) -> float:
    try:
        return os.stat(os.path.join(lake.root.removeprefix("file://"), path)).st_mtime
    except OSError:
        return time.time()  # gone meanwhile: as if just written


def _quote(s: str) -> str:
    return s.replace("'", "''")
