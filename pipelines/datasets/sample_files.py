"""Writing one dataset version: Parquet files streamed to the lake, then one Delta overwrite commit.

delta-rs 1.6's ``write_deltalake`` holds what it writes until the commit: its
RSS grew with the output (+130 MB per 160 MB of token lists, measured; a
smaller ``target_file_size`` changed nothing). PyArrow's ``ParquetWriter``
encodes row group by row group straight to storage, so memory follows one
row group; the files are then committed with ``create_table_with_add_actions``
(first version) or ``create_write_transaction`` (overwrite), each one commit,
as before. Per-file statistics (row count, min/max/null count of the scalar
columns) go into the Delta log, as delta-rs would write them.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, create_table_with_add_actions

from store.lake import Lake
from store.storage import arrow_filesystem

ROWS_PER_GROUP = 1024
FILE_BYTES = 16 * 1024 * 1024
"""A file is closed once this many bytes of Arrow data went in (compressed files are ~1/3 of that)."""


def write_version(
    lake: Lake,
    table: str,
    batches: Iterable[pa.RecordBatch],
    *,
    schema: pa.Schema,
    observe: Callable[[pa.RecordBatch], None] | None = None,
) -> None:
    """Replace ``table``'s rows with ``batches`` in one Delta commit (creating the table if absent).

    ``observe`` (e.g. the content hash) sees every batch in order, on a helper
    thread while the batch is encoded (both release the GIL), and is done with
    it before the next batch is taken: no batch is held longer than without it.
    """
    lake.write_uri(table)  # TableNotCatalogued before any file is written
    filesystem, root = arrow_filesystem(lake.root, lake.storage_options)
    folder = f"{root}/{table}"
    filesystem.create_dir(folder, recursive=True)
    files = _Files(filesystem, folder, schema)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajlake-dataset-observe") as helper:
            for batch in batches:
                observing = helper.submit(observe, batch) if observe is not None else None
                files.write(batch)
                if observing is not None:
                    observing.result()
        _commit(lake, table, files.close(), schema)
    except BaseException:
        files.abandon()
        raise


class _Files:
    """The files of one version, each closed once ``FILE_BYTES`` of Arrow data went in."""

    def __init__(self, filesystem: Any, folder: str, schema: pa.Schema) -> None:
        self._filesystem, self._folder, self._schema = filesystem, folder, schema
        self._stem = uuid.uuid4()
        self._actions: list[AddAction] = []
        self._open: _File | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._open is None:
            name = f"part-{len(self._actions):05d}-{self._stem}-c000.zstd.parquet"
            self._open = _File(self._filesystem, self._folder, name, self._schema)
        self._open.write(batch)
        if self._open.bytes_in >= FILE_BYTES:
            self._actions.append(self._open.close())
            self._open = None

    def close(self) -> list[AddAction]:
        if self._open is not None:
            self._actions.append(self._open.close())
            self._open = None
        return self._actions

    def abandon(self) -> None:
        if self._open is not None:
            self._open.abandon()
            self._open = None
        for action in self._actions:
            _delete(self._filesystem, f"{self._folder}/{action.path}")


def _delete(filesystem: Any, path: str) -> None:
    """A failed build leaves no file behind (readers ignore them, but they take space until a vacuum)."""
    try:
        filesystem.delete_file(path)
    except OSError:
        pass


def _commit(lake: Lake, table: str, actions: list[AddAction], schema: pa.Schema) -> None:
    options = dict(lake.storage_options)
    try:
        existing = DeltaTable(lake.uri(table), storage_options=options)
    except TableNotFoundError:
        create_table_with_add_actions(lake.uri(table), Schema.from_arrow(schema), actions, mode="error",
                                      storage_options=options)
        return
    existing.create_write_transaction(actions, mode="overwrite", schema=schema)


class _File:
    """One Parquet file being written, with the Delta statistics of what went in."""

    def __init__(self, filesystem: Any, folder: str, name: str, schema: pa.Schema) -> None:
        self.name, self._filesystem, self._path = name, filesystem, f"{folder}/{name}"
        self._scalars = [f.name for f in schema if not pa.types.is_list(f.type)]
        self._writer = pq.ParquetWriter(
            self._path, schema, filesystem=filesystem, compression="zstd", compression_level=1,
            use_dictionary=False,  # token lists don't dictionary-encode well: 5x faster writes, smaller files
            write_statistics=self._scalars,
        )
        self.bytes_in = self._rows = 0
        self._min: dict[str, Any] = {}
        self._max: dict[str, Any] = {}
        self._nulls = dict.fromkeys(schema.names, 0)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch, row_group_size=ROWS_PER_GROUP)
        self.bytes_in += batch.nbytes
        self._rows += batch.num_rows
        for name in batch.schema.names:
            self._nulls[name] += batch.column(name).null_count
        for name in self._scalars:
            low, high = pc.min_max(batch.column(name)).values()
            if low.is_valid:
                self._min[name] = min(self._min.get(name, low.as_py()), low.as_py())
                self._max[name] = max(self._max.get(name, high.as_py()), high.as_py())

    def abandon(self) -> None:
        try:
            self._writer.close()
        except OSError:
            pass
        _delete(self._filesystem, self._path)

    def close(self) -> AddAction:
        self._writer.close()
        finite = lambda v: not isinstance(v, float) or math.isfinite(v)  # noqa: E731  (JSON has no NaN)
        stats = {"numRecords": self._rows, "nullCount": self._nulls,
                 "minValues": {k: v for k, v in self._min.items() if finite(v)},
                 "maxValues": {k: v for k, v in self._max.items() if finite(v)}}
        size = self._filesystem.get_file_info(self._path).size
        return AddAction(self.name, size, {}, int(time.time() * 1000), True, json.dumps(stats))
