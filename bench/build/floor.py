"""The floor of any build that writes its output: read the token columns, write the dataset's bytes.

``read_write`` does what a build cannot avoid and nothing else: the bare
Arrow scan of every prompt/response id and logprob (``scan.arrow_scan``),
on a second thread as the build reads ahead, while the main thread writes
the rows of the dataset the pipeline built in the same round through the
same writer (``write_version``, zstd-1, one Delta commit) into
``datasets/bench_floor``. The rows are loaded before the clock starts,
batch by batch as the build yielded them (one row group per batch); each
batch's list columns are copied into fresh buffers before they are written,
the least a build does to lay out new output. No selection, plan, merge or
content hash.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scan import arrow_scan

from pipelines.datasets.sample_files import write_version
from schemas.tables import SAMPLES, dataset_table
from store.lake import Lake

FLOOR_DATASET = "bench_floor"


def built_batches(lake: Lake, name: str) -> list[pa.RecordBatch]:
    """The rows of ``datasets/NAME``'s current version, one record batch per row group, in file order."""
    paths = sorted(lake.table(dataset_table(name)).file_uris())
    batches = []
    for path in paths:
        parquet = pq.ParquetFile(path)
        for group in range(parquet.num_row_groups):
            batches.extend(parquet.read_row_group(group).cast(SAMPLES).combine_chunks().to_batches())
    return batches


def read_write(lake: Lake, batches: list[pa.RecordBatch]) -> float:
    """Scan the token columns beside writing ``batches`` (fresh copies) as a new version; the scan's sum."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="floor-scan") as pool:
        scanning = pool.submit(arrow_scan, lake)
        write_version(lake, dataset_table(FLOOR_DATASET), map(_fresh, batches), schema=SAMPLES)
        return scanning.result()


def _fresh(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its numeric list columns' offsets and values copied into new memory."""
    columns = []
    for column in batch.columns:
        if pa.types.is_list(column.type) and pa.types.is_primitive(column.type.value_type):
            offsets = pa.array(column.offsets.to_numpy().copy())
            values = pa.array(np.array(column.values.to_numpy(), copy=True))
            column = pa.ListArray.from_arrays(offsets, values)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
