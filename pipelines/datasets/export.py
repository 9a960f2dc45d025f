"""Export a dataset version as plain Parquet for users who train elsewhere.

The layout is what Hugging Face ``datasets`` auto-detects:
``DIR/data/train-00000.parquet, ...`` plus ``DIR/manifest.json``, so
``load_dataset("parquet", data_files="DIR/data/*.parquet")`` or
``load_dataset("DIR")`` loads it. Rows are streamed: memory stays at one file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from pipelines.datasets.registry import get_manifest
from schemas.tables import dataset_table
from store.lake import Lake


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    files: list[Path]
    rows: int
    version: int


def export_parquet(
    lake: Lake, name: str, directory: str | Path, *, version: int | None = None, rows_per_file: int = 50_000
) -> ExportResult:
    """Write ``datasets/NAME`` at ``version`` (latest when None) under ``directory``.

    Refuses a directory that already holds an export, so nothing is mixed.
    """
    manifest = get_manifest(lake, name, version)
    out = Path(directory)
    data = out / "data"
    if data.exists() and any(data.iterdir()):
        raise FileExistsError(f"{data} already holds files: export into an empty directory")
    data.mkdir(parents=True, exist_ok=True)
    dataset = lake.dataset(dataset_table(name), version=manifest["version"])
    files: list[Path] = []
    writer: pq.ParquetWriter | None = None
    in_file = rows = 0
    for batch in dataset.to_batches(batch_size=min(rows_per_file, 8192)):
        if writer is None or in_file >= rows_per_file:
            if writer is not None:
                writer.close()
            files.append(data / f"train-{len(files):05d}.parquet")
            writer, in_file = pq.ParquetWriter(files[-1], dataset.schema), 0
        writer.write_batch(batch)
        in_file += batch.num_rows
        rows += batch.num_rows
    if writer is None:
        files.append(data / "train-00000.parquet")
        pq.write_table(dataset.schema.empty_table(), files[-1])
    else:
        writer.close()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return ExportResult(out, files, rows, manifest["version"])
