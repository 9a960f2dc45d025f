"""Re-derive the typed tables from ``events`` (the log is the source of truth).

Each typed table is overwritten in ONE Delta version, streamed from the events
table type by type (memory stays at one scan batch), through the same
``store.event_rows.typed_tables`` the ingester uses. The overwrite commits
carry the events table's transaction markers for ``group``, so an ingester of
that group resumes afterwards without writing any typed row twice.
Run it with the ingesters of that group stopped: a commit they make during the
rebuild is detected afterwards (``RebuildRaced``) and the rebuild must be rerun.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from schemas.tables import EVENTS_TABLE, TYPED_TABLES
from store import prejoin
from store.commit import WRITER_PROPERTIES, marker_app_id
from store.event_rows import typed_tables
from store.lake import Lake
from schemas.errors import Conflict

log = logging.getLogger(__name__)

Progress = Callable[[str, int], None]
"""Called with (table name, rows written so far) as a rebuild streams."""


class RebuildRaced(Conflict):
    """The events table changed while rebuilding: an ingester is running."""


def rebuild_typed_tables(lake: Lake, *, group: str = "trajlake-ingest", batch_rows: int = 20_000,
                         progress: Progress | None = None) -> dict[str, int]:
    """Overwrite every typed table from ``events``; returns rows per table.

    >>> rebuild_typed_tables(Lake("./lake"))  # doctest: +SKIP
    {'rollout_starts': 300, 'llm_requests': 600, ...}
    """
    events = lake.table(EVENTS_TABLE)
    version = events.version()
    txns = _markers(lake, events, group)
    counts: dict[str, int] = {}
    for event_type, (name, schema) in TYPED_TABLES.items():
        counter = _Counter(name, progress)
        reader = pa.RecordBatchReader.from_batches(
            schema, counter.wrap(_typed_batches(lake, events, event_type, name, batch_rows))
        )
        write_deltalake(
            lake.write_uri(name), reader, mode="overwrite", schema_mode="overwrite",
            storage_options=dict(lake.storage_options), writer_properties=WRITER_PROPERTIES,
            commit_properties=CommitProperties(app_transactions=txns) if txns else None,
        )
        counts[name] = counter.rows
        log.info("rebuilt table=%s rows=%d from_events_version=%d", name, counter.rows, version)
    prejoin.reset(lake)  # the rebuilt rows may differ from what compaction folded in
    if lake.table(EVENTS_TABLE).version() != version:
        raise RebuildRaced(
            f"events moved past version {version} during the rebuild: stop the ingesters of group "
            f"{group!r} and run `trajlake rebuild` again"
        )
    return counts


def _typed_batches(lake: Lake, events: DeltaTable, event_type: str, name: str,
                   batch_rows: int) -> Iterator[pa.RecordBatch]:
    for batch in lake.scan(events, filter=pc.field("type") == event_type, batch_rows=batch_rows):
        if batch.num_rows:
            yield from typed_tables(pa.Table.from_batches([batch]))[name].to_batches()


def _markers(lake: Lake, events: DeltaTable, group: str) -> list[Transaction]:
    """The events table's markers of ``group`` for every (topic, partition) it holds."""
    sources = lake.read(events, columns=["kafka_topic", "kafka_partition"]).group_by(
        ["kafka_topic", "kafka_partition"]).aggregate([])
    txns = []
    for topic, partition in zip(sources.column("kafka_topic").to_pylist(), sources.column("kafka_partition").to_pylist()):
        app_id = marker_app_id(group, topic, partition)
        offset = events.transaction_version(app_id)
        if offset is not None:
            txns.append(Transaction(app_id=app_id, version=offset))
    return txns


class _Counter:
    def __init__(self, name: str, progress: Progress | None) -> None:
        self.name, self.progress, self.rows = name, progress, 0

    def wrap(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.rows += batch.num_rows
            if self.progress is not None:
                self.progress(self.name, self.rows)
            yield batch
