"""Forget a tenant, rollouts or a user: Delta deletes in every table, vacuum, audit.

What a request selects:

- ``tenant``: every row of that tenant;
- ``rollouts``: those rollout ids (inside ``tenant`` when one is given);
- ``user``: the rollouts of one user of one tenant. A user is the ``user``
  key (or ``user_id``) of the rollout's ``rollout.started`` metadata, which
  harnesses set (the SDK's ``metadata={"user": ...}``); user ids are scoped
  to their tenant, so ``user`` needs ``tenant``.

Every Delta table of the lake is covered: tables with a ``tenant`` column
(the ingested tables, ``datasets/*``) are deleted from by tenant and rollout,
tables with only ``rollout_id`` (``dataset_lineage``) by the selected
rollouts, and ``quarantine`` (raw bytes, no tenant column) by the Kafka
coordinates of the rejected messages whose key is a selected rollout or whose
JSON names the tenant. Each table that lost rows is vacuumed at once
(retention 0), so the Parquet files holding the rows leave the disk, and
older versions of that table stop being readable by time travel. A dataset
whose older versions (not the current one) used a forgotten rollout, as
``dataset_lineage`` records, is vacuumed the same way.

Datasets built before the request are also marked: ``forget_audit`` lists,
per dataset, the versions that contained forgotten rollouts (from
``dataset_lineage`` when present). Those versions' files are vacuumed; the
current version has had the rows deleted, but its advantages were computed
with the forgotten rollouts in their groups: rebuild the dataset
(``trajlake build-dataset``) and retrain checkpoints trained on a marked
version. ``forgotten_dataset_versions`` answers which versions are marked.

The log entries before the forget are dropped too (after a checkpoint),
because old commits carry column statistics (min/max values) of the deleted
files; the table's commit history before the forget goes with them, which is
why ``forget_audit`` keeps the record.

Not covered, and said by ``trajlake forget`` after each run:

- the raw events in the Kafka topic stay until its ``retention.ms`` drops
  them (keep it below your deletion deadline); the command asks the broker
  (``ingest.topic_retention``) and prints when that will be;
- each DELETE commit's ``commitInfo`` in ``_delta_log`` holds its predicate,
  which names the tenant and rollout ids (``tenant = 'acme' AND rollout_id IN
  (...)``). deltalake 1.6.6 writes it for every delete and offers no way to
  leave it out (``CommitProperties`` only adds custom metadata); the commit
  files go at log cleanup (``delta.logRetentionDuration``, 30 days by
  default, when a later checkpoint is written).

Readers after a forget: rewritten files can hold ``string_view`` columns
(``store.tenant_sql`` reads them safely), and versions before the forget can
no longer be opened (the query API shows such dataset versions as vacuumed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake.exceptions import CommitFailedError

from schemas.errors import InputError
from schemas.tables import (
    DATASET_LINEAGE_TABLE,
    DATASETS_PREFIX,
    FORGET_AUDIT,
    FORGET_AUDIT_TABLE,
    QUARANTINE_TABLE,
    ROLLOUT_STARTS_TABLE,
)
from store import tail_cache
from store.compact import COMPACT_WRITER_PROPERTIES
from store.lake import Lake, list_tables
from store.prejoin import PREJOINED_TABLES, fence
from store.storage import arrow_filesystem

log = logging.getLogger(__name__)


MAX_ID_CHARS = 512
IDS_PER_DELETE = 1000
DELETE_RETRIES = 5
"""A delete that races with the ingester's appends is retried on a fresh snapshot this often."""

@dataclass(frozen=True)
class ForgetRequest:
    """What to forget; see the module docstring. ``kind`` is recorded in the audit."""

    tenant: str | None = None
    rollouts: tuple[str, ...] = ()
    user: str | None = None
    reason: str | None = None
    kind: str = "forget"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rollouts", tuple(self.rollouts))
        for name, value in (("tenant", self.tenant), ("user", self.user)):
            if value is not None:
                _check_id(name, value)
        for rollout in self.rollouts:
            _check_id("rollout", rollout)
        if self.user is not None and self.tenant is None:
            raise InputError("forget --user needs --tenant: user ids are scoped to their tenant")
        if self.tenant is None and not self.rollouts:
            raise InputError("say what to forget: --tenant, --rollout (repeatable) or --tenant with --user")

    @property
    def whole_tenant(self) -> bool:
        return self.tenant is not None and not self.rollouts and self.user is None


@dataclass(frozen=True)
class TableForgotten:
    table: str
    rows_deleted: int
    files_vacuumed: int
    version_before: int | None
    version_after: int | None
    dataset_versions_marked: tuple[int, ...] = ()


@dataclass(frozen=True)
class ForgetReport:
    forget_id: str
    request: ForgetRequest
    rollouts: tuple[str, ...]
    tables: list[TableForgotten] = field(default_factory=list)

    @property
    def rows_deleted(self) -> int:
        return sum(t.rows_deleted for t in self.tables)

    @property
    def marked_datasets(self) -> dict[str, tuple[int, ...]]:
        return {t.table: t.dataset_versions_marked for t in self.tables if t.dataset_versions_marked}


def forget(
    lake: Lake,
    request: ForgetRequest,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> ForgetReport:
    """Delete what ``request`` selects from every table, vacuum, and audit it.

    >>> forget(Lake("./lake"), ForgetRequest(tenant="acme"))  # doctest: +SKIP
    """
    requested_at = clock()
    # the pre-joined tables last, each fenced first: a compaction's refresh that read a rollout's typed rows before
    # they were deleted then conflicts (``store.prejoin.refresh``) instead of writing the rollout back
    tables = sorted((name for name in list_tables(lake) if name != FORGET_AUDIT_TABLE),
                    key=lambda table: table in PREJOINED_TABLES)
    rollouts = _selected_rollouts(lake, request, tables)
    marked = _dataset_versions_with(lake, rollouts, tables)
    audited = rollouts | _quarantined_rollouts(lake, request, tables)
    report = ForgetReport(forget_id=uuid.uuid4().hex, request=request, rollouts=tuple(sorted(audited)))
    for name in tables:
        predicates = _predicates(lake, name, request, rollouts)
        if predicates is None:
            continue
        if name in PREJOINED_TABLES:
            fence(lake, name, f"forget {report.forget_id}")
        is_dataset = name.startswith(DATASETS_PREFIX)
        old_versions = marked.get(name.removeprefix(DATASETS_PREFIX), set()) if is_dataset else set()
        result = _delete_and_vacuum(lake, name, predicates, purge_history=bool(old_versions))
        if is_dataset and (old_versions or result.rows_deleted):
            versions = old_versions or {result.version_before}
            result = replace(result, dataset_versions_marked=tuple(sorted(versions)))
        report.tables.append(result)
        log.info("forget.table id=%s table=%s rows=%d files=%d", report.forget_id, name, result.rows_deleted, result.files_vacuumed)
    tail_cache.clear(lake)  # after the deletes: a one-shot query that read the rows before writes no file after
    _audit(lake, report, requested_at, clock())
    return report


def forgotten_dataset_versions(lake: Lake) -> dict[str, set[int]]:
    """Dataset name -> versions marked as containing forgotten data (by any request)."""
    if not lake.exists(FORGET_AUDIT_TABLE):
        return {}
    marked: dict[str, set[int]] = defaultdict(set)
    for row in lake.read(FORGET_AUDIT_TABLE, columns=["table", "dataset_versions_marked"]).to_pylist():
        if row["dataset_versions_marked"]:
            marked[row["table"].removeprefix(DATASETS_PREFIX)].update(row["dataset_versions_marked"])
    return dict(marked)


def _selected_rollouts(lake: Lake, request: ForgetRequest, tables: list[str]) -> set[str]:
    """Every rollout id the request reaches, looked up in the tables that carry a tenant."""
    if request.user is not None:
        return _user_rollouts(lake, request.tenant or "", request.user)
    if request.rollouts:
        return set(request.rollouts) if request.tenant is None else _tenant_rollouts(lake, request.tenant, tables) & set(request.rollouts)
    return _tenant_rollouts(lake, request.tenant or "", tables)


def _tenant_rollouts(lake: Lake, tenant: str, tables: list[str]) -> set[str]:
    found: set[str] = set()
    for name in tables:
        if {"tenant", "rollout_id"} <= set(_columns(lake, name)):
            data = lake.read(name, columns=["tenant", "rollout_id"])
            found.update(data.filter(pc.equal(data["tenant"], tenant))["rollout_id"].to_pylist())
    return found


def _quarantined_rollouts(lake: Lake, request: ForgetRequest, tables: list[str]) -> set[str]:
    """Rollout ids in the envelopes of the tenant's quarantined messages a whole-tenant forget deletes: the audit
    names them, so an ingester's log check knows those messages were forgotten (not lost)."""
    if not request.whole_tenant or QUARANTINE_TABLE not in tables:
        return set()
    envelopes = (_json_object(raw) for raw in lake.read(QUARANTINE_TABLE, columns=["raw"]).column("raw").to_pylist())
    return {e["rollout_id"] for e in envelopes
            if e.get("tenant") == request.tenant and isinstance(e.get("rollout_id"), str) and e["rollout_id"]}


def _user_rollouts(lake: Lake, tenant: str, user: str) -> set[str]:
    if not lake.exists(ROLLOUT_STARTS_TABLE):
        return set()
    starts = lake.read(ROLLOUT_STARTS_TABLE, columns=["tenant", "rollout_id", "metadata"])
    starts = starts.filter(pc.equal(starts["tenant"], tenant))
    return {row["rollout_id"] for row in starts.to_pylist() if _metadata_user(row["metadata"]) == user}


def _metadata_user(metadata: str | None) -> str | None:
    try:
        values = json.loads(metadata or "{}")
    except json.JSONDecodeError:
        return None
    if not isinstance(values, dict):
        return None
    user = values.get("user", values.get("user_id"))
    return None if user is None else str(user)


def _dataset_versions_with(lake: Lake, rollouts: set[str], tables: list[str]) -> dict[str, set[int]]:
    """Dataset -> versions whose lineage names one of ``rollouts``."""
    if DATASET_LINEAGE_TABLE not in tables or not rollouts:
        return {}
    lineage = lake.read(DATASET_LINEAGE_TABLE, columns=["dataset", "version", "rollout_id"])
    hits = lineage.filter(pc.is_in(lineage["rollout_id"], pa.array(sorted(rollouts))))
    versions: dict[str, set[int]] = defaultdict(set)
    for row in hits.to_pylist():
        versions[row["dataset"]].add(row["version"])
    return versions


def _predicates(lake: Lake, name: str, request: ForgetRequest, rollouts: set[str]) -> list[str] | None:
    """Delete predicates for one table; None when the table holds nothing per rollout."""
    columns = set(_columns(lake, name))
    if name == QUARANTINE_TABLE:
        return _quarantine_predicates(lake, request, rollouts)
    if "rollout_id" not in columns:
        return None
    if "tenant" in columns and request.whole_tenant:
        return [f"tenant = {_sql(request.tenant)}"]
    scope = f"tenant = {_sql(request.tenant)} AND " if "tenant" in columns and request.tenant is not None else ""
    return [f"{scope}rollout_id IN ({', '.join(map(_sql, chunk))})" for chunk in _chunks(sorted(rollouts))]


def _quarantine_predicates(lake: Lake, request: ForgetRequest, rollouts: set[str]) -> list[str]:
    """Rejected messages of the selection, addressed by their Kafka coordinates."""
    data = lake.read(QUARANTINE_TABLE, columns=["raw", "kafka_key", "kafka_topic", "kafka_partition", "kafka_offset"])
    hits: dict[tuple[str, int], list[int]] = defaultdict(list)
    for row in data.to_pylist():
        key = (row["kafka_key"] or b"").decode("utf-8", "replace")
        envelope = _json_object(row["raw"])
        selected = key in rollouts or envelope.get("rollout_id") in rollouts
        if selected or (request.whole_tenant and envelope.get("tenant") == request.tenant):
            hits[(row["kafka_topic"], row["kafka_partition"])].append(row["kafka_offset"])
    return [
        f"kafka_topic = {_sql(topic)} AND kafka_partition = {partition} AND kafka_offset IN ({', '.join(map(str, chunk))})"
        for (topic, partition), offsets in sorted(hits.items())
        for chunk in _chunks(sorted(offsets))
    ]


def _delete_and_vacuum(lake: Lake, name: str, predicates: list[str], *, purge_history: bool) -> TableForgotten:
    """Delete, then vacuum when rows went (or ``purge_history``: an older version held them)."""
    before = lake.version(name)
    deleted = 0
    for predicate in predicates:
        deleted += _delete(lake, name, predicate)
    vacuumed = 0
    if (deleted or purge_history) and before is not None:
        vacuumed = len(lake.table(name).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False))
        _drop_log_history(lake, name, through=before)
    return TableForgotten(name, deleted, vacuumed, before, lake.version(name))


def _drop_log_history(lake: Lake, name: str, *, through: int) -> None:
    """Checkpoint the table, then delete its log entries up to version ``through``.

    Commits up to ``through`` (the version before the forget) hold column
    statistics (min/max values, e.g. the start of a prompt) of the files the
    delete removed; after the vacuum above those versions are unreadable
    anyway. The checkpoint carries the live files and every app transaction
    (the ingester's exactly-once markers) forward. Later commits stay, so a
    writer that read the table during the forget can still check its commit
    against them.
    """
    table = lake.table(name)
    table.create_checkpoint()
    filesystem, log_dir = arrow_filesystem(f"{lake.uri(name)}/_delta_log", lake.storage_options)
    for info in filesystem.get_file_info(pafs.FileSelector(log_dir)):
        version = info.base_name.split(".", 1)[0]
        if info.type == pafs.FileType.File and version.isdigit() and int(version) <= through < table.version():
            filesystem.delete_file(info.path)


def _delete(lake: Lake, name: str, predicate: str) -> int:
    for attempt in range(1, DELETE_RETRIES + 1):
        try:
            return int(lake.table(name).delete(predicate, writer_properties=COMPACT_WRITER_PROPERTIES)
                       ["num_deleted_rows"])
        except CommitFailedError as exc:
            if attempt == DELETE_RETRIES:
                raise RuntimeError(
                    f"forget: table {name} kept changing under the delete ({exc}); run the forget again "
                    "(it is idempotent) or pause ingestion of this tenant first"
                ) from exc
            log.info("forget.retry table=%s attempt=%d reason=%r", name, attempt, str(exc))
    raise AssertionError("unreachable")


def _audit(lake: Lake, report: ForgetReport, requested_at: datetime, finished_at: datetime) -> None:
    request = report.request
    common = {
        "forget_id": report.forget_id, "requested_at": requested_at, "kind": request.kind,
        "tenant": request.tenant, "rollouts": list(report.rollouts),
        "user_sha256": hashlib.sha256(request.user.encode()).hexdigest() if request.user is not None else None,
        "reason": request.reason, "finished_at": finished_at,
    }
    tables = report.tables or [TableForgotten("", 0, 0, None, None)]
    rows = [
        {**common, "table": t.table, "rows_deleted": t.rows_deleted, "files_vacuumed": t.files_vacuumed,
         "version_before": t.version_before, "version_after": t.version_after,
         "dataset_versions_marked": list(t.dataset_versions_marked)}
        for t in tables
    ]
    lake.append(FORGET_AUDIT_TABLE, pa.Table.from_pylist(rows, schema=FORGET_AUDIT), schema=FORGET_AUDIT)


def _columns(lake: Lake, name: str) -> list[str]:
    return [f.name for f in lake.table(name).schema().fields]


def _json_object(raw: bytes | None) -> dict:
    try:
        value = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise InputError(f"{name} must be a non-empty printable string of at most {MAX_ID_CHARS} characters, got {value!r:.80}")


def _chunks(values: list, size: int = IDS_PER_DELETE) -> Iterable[list]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
