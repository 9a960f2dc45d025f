"""The lake: one root folder (or ``s3://`` prefix) holding every Delta table.

``Lake`` knows where each table lives, appends Arrow data with Delta
transaction markers (the exactly-once mechanism: ``app_id -> version`` in the
same commit as the rows) and reads tables back, optionally at a past version.

Every Arrow read goes through ``Lake.dataset`` / ``Lake.scan``: the table's
files (``DeltaTable.file_uris()``) scanned by ``pyarrow.dataset`` with the
table's own schema in plain Arrow types (``string``, ``list<int32>``):

- Files delta-rs 1.6 rewrites in a DELETE (forget, retention) carry
  ``string_view`` columns (optimize/z-order writes ``string`` again); the
  plain schema casts them back, so every reader sees the catalogue's types.
  PyArrow has no comparison kernels for ``string_view``, so ``scan(filter=)``
  filters such a file after the cast, and ``split_rewritten`` lets DuckDB
  read such files through a scanner rather than push its WHERE into them.
- deltalake's own PyArrow route (``to_pyarrow_table``/``to_pyarrow_dataset``,
  which scans through deltalake's Rust object store wrapped as a PyArrow
  filesystem) ends the process in SIGABRT at interpreter shutdown ("terminate
  called without an active exception": a C++ thread still joinable at exit,
  no Python frame on the stack; delta-rs issue 2184): 3 of 60 plain reads
  here, against 0 of 60 through ``file_uris()`` and ``pyarrow.dataset``.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.errors import NotFound
from store.storage import StoreUnreachable, arrow_filesystem, check_root, is_local, storage_options, store_problem

if TYPE_CHECKING:  # deltalake, Arrow and the catalogue's Arrow schemas load when a table is opened, scanned or
    import pyarrow as pa  # written: a DuckDB query over a local lake (``store.sql``, ``trajlake sql``) needs none
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    from deltalake import DeltaTable


@dataclass(frozen=True)
class Lake:
    """A lake root plus the storage options object stores need.

    >>> lake = Lake("/tmp/lake")
    >>> lake.uri("events")
    '/tmp/lake/events'
    """

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_root(self.root)
        if "://" not in self.root:
            object.__setattr__(self, "root", str(Path(self.root).expanduser().resolve()))
        elif not self.storage_options:
            # An object-store lake built from a bare URI takes its credentials from AWS_* etc.
            object.__setattr__(self, "storage_options", storage_options(self.root))

    @property
    def is_local(self) -> bool:
        return is_local(self.root)

    def uri(self, table: str) -> str:
        """Location of a table; ``datasets/NAME`` style names nest."""
        return f"{self.root.rstrip('/')}/{table}"

    def write_uri(self, table: str) -> str:
        """Location of a table this process writes; ``TableNotCatalogued`` unless ``schemas.tables`` lists it."""
        from schemas.tables import catalogued

        if not catalogued(table):
            raise TableNotCatalogued(table)
        return self.uri(table)

    def exists(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.uri(table), storage_options=dict(self.storage_options))

    def table(self, table: str, *, version: int | None = None) -> DeltaTable:
        """Open a table (at ``version`` for time travel); ``TableMissing`` if absent."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(table), version=version, storage_options=dict(self.storage_options))
        except TableNotFoundError:
            raise TableMissing(table, self.root) from None

    def version(self, table: str) -> int | None:
        """Current Delta version of a table, None when it does not exist yet. One load of the log (``exists`` is
        itself one: on an object store a table 96 commits past its checkpoint took ~0.4 s and ~200 requests each)."""
        try:
            return self.table(table).version()
        except TableMissing:
            return None

    def dataset(self, table: str | DeltaTable, *, version: int | None = None,
                prune_on: Sequence[str] = ()) -> ds.Dataset:
        """The table's files as a ``pyarrow.dataset`` typed with the table's plain Arrow schema.

        ``table`` is a name (opened at ``version``) or an open ``DeltaTable``.
        Projections and unfiltered scans always yield the catalogue's types;
        filter string columns through ``scan(filter=)`` (see the module doc).
        ``prune_on`` names columns whose per-file min/max from the Delta log
        become each file's guarantee, so ``get_fragments(filter=)`` skips files.
        """
        import pyarrow as pa
        import pyarrow.dataset as ds

        from schemas.tables import CATALOGUE

        delta = self.table(table, version=version) if isinstance(table, str) else table
        schema = table_schema(delta)
        if isinstance(table, str) and table in CATALOGUE:  # columns added since the table was written read NULL
            schema = pa.schema([*schema, *(f for f in CATALOGUE[table].schema if f.name not in schema.names)])
        filesystem, _ = arrow_filesystem(self.root, self.storage_options)
        parquet = ds.ParquetFileFormat()
        guarantees = _file_guarantees(delta, prune_on)
        fragments = [
            parquet.make_fragment(uri if self.is_local else uri.split("://", 1)[1], filesystem,
                                  partition_expression=guarantees.get(uri.rsplit("/", 1)[-1], ds.scalar(True)))
            for uri in delta.file_uris()
        ]
        return ds.FileSystemDataset(fragments, schema, parquet, filesystem)

    def scan(
        self,
        table: str | DeltaTable,
        *,
        version: int | None = None,
        columns: list[str] | None = None,
        filter: pc.Expression | None = None,
        batch_rows: int = 65_536,
        prune_on: Sequence[str] = (),
    ) -> pa.RecordBatchReader:
        """Stream a table's rows (``columns`` of those matching ``filter``) in the catalogue's types.

        ``prune_on``: columns of ``filter`` whose Delta file statistics skip files (see ``dataset``).

        >>> Lake("./lake").scan("events", columns=["event_id"], filter=pc.field("tenant") == "acme")  # doctest: +SKIP
        """
        import pyarrow as pa

        dataset = self.dataset(table, version=version, prune_on=prune_on if filter is not None else ())
        schema = dataset.schema if columns is None else pa.schema([dataset.schema.field(c) for c in columns])
        if filter is None:
            batches = dataset.to_batches(columns=columns, batch_size=batch_rows)
        else:
            batches = _filtered_batches(dataset, columns, filter, batch_rows)
        return pa.RecordBatchReader.from_batches(schema, batches)

    def read(
        self,
        table: str | DeltaTable,
        *,
        version: int | None = None,
        columns: list[str] | None = None,
        filter: pc.Expression | None = None,
        prune_on: Sequence[str] = (),
    ) -> pa.Table:
        """Read a whole table (or some columns, or the rows matching ``filter``) into Arrow."""
        return self.scan(table, version=version, columns=columns, filter=filter, prune_on=prune_on).read_all()

    def append(
        self,
        table: str,
        data: pa.Table,
        *,
        markers: Mapping[str, int] | None = None,
        schema: pa.Schema | None = None,
    ) -> int:
        """Append rows in one Delta commit carrying ``markers`` (app_id -> version).

        Creates the table on first write (with ``schema`` when given, so an
        empty first batch still fixes the column types). Returns the new
        table version. Only catalogued tables are written (``write_uri``).
        """
        from deltalake import CommitProperties, Transaction, write_deltalake

        uri = self.write_uri(table)
        if schema is not None:
            data = data.cast(schema)
        txns = [Transaction(app_id=app, version=int(v)) for app, v in (markers or {}).items()]
        write_deltalake(
            uri,
            data,
            mode="append",
            storage_options=dict(self.storage_options),
            commit_properties=CommitProperties(app_transactions=txns) if txns else None,
        )
        return self.table(table).version()

    def marker(self, table: str, app_id: str) -> int | None:
        """The last version committed under ``app_id`` in ``table``, None if never."""
        if not self.exists(table):
            return None
        return self.table(table).transaction_version(app_id)

    def read_file(self, path: str) -> bytes | None:
        """The bytes of the file at ``path`` under the root (``events/_delta_log/00000000000000000007.json``);
        None when it is absent or cannot be read. A local lake reads it without pyarrow.

        >>> Lake("/tmp/no-such-lake").read_file("events/_delta_log/_last_checkpoint") is None
        True
        """
        try:
            return self._read_bytes(path)
        except OSError:
            return None

    def checkpointed_past(self, table: str, version: int) -> bool:
        """Whether ``table``'s last checkpoint (``_last_checkpoint``) is past ``version``: the table moved on even
        where log entry ``version + 1`` is gone (a forget drops the entries before its checkpoint, log cleanup the
        old ones). A pointer that is there but cannot be read (an object store's 503) or parsed counts as past (what
        the table holds is not known); no pointer as not."""
        try:
            pointer = self._read_bytes(f"{table}/_delta_log/_last_checkpoint")
        except FileNotFoundError:
            return False
        except OSError:
            return True
        try:
            return int(json.loads(pointer)["version"]) > version
        except (ValueError, KeyError, TypeError):
            return True

    def _read_bytes(self, path: str) -> bytes:
        """The bytes at ``path`` under the root; raises ``FileNotFoundError`` when nothing is there, another
        ``OSError`` when it cannot be read."""
        if self.is_local:
            with open(f"{self.root.removeprefix('file://').rstrip('/')}/{path}", "rb") as f:
                return f.read()
        filesystem, root = self._filesystem
        with filesystem.open_input_stream(f"{root.rstrip('/')}/{path}") as stream:
            return stream.read()

    @functools.cached_property
    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem of an object-store root and the root's path on it, built once."""
        return arrow_filesystem(self.root, self.storage_options)


def plain_type(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with view and large layouts replaced by the plain ones (string, binary, list)."""
    import pyarrow as pa

    if pa.types.is_string_view(data_type) or pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_binary_view(data_type) or pa.types.is_large_binary(data_type):
        return pa.binary()
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_list_view(data_type) \
            or pa.types.is_large_list_view(data_type):
        return pa.list_(plain_field(data_type.value_field))
    if pa.types.is_struct(data_type):
        return pa.struct([plain_field(f) for f in data_type.fields])
    if pa.types.is_map(data_type):
        return pa.map_(plain_type(data_type.key_type), plain_field(data_type.item_field))
    return data_type


def plain_field(f: pa.Field) -> pa.Field:
    return f.with_type(plain_type(f.type))


def table_schema(delta: DeltaTable) -> pa.Schema:
    """The table's schema as the catalogue writes it: Delta's logical types in plain Arrow types."""
    import pyarrow as pa

    if delta.metadata().partition_columns:
        raise ValueError(f"partitioned table {delta.table_uri!r}: trajlake reads unpartitioned tables only")
    return pa.schema([plain_field(f) for f in pa.schema(delta.schema().to_arrow())])


def split_rewritten(dataset: ds.FileSystemDataset) -> tuple[ds.FileSystemDataset | None, ds.FileSystemDataset | None]:
    """``dataset`` split into (its files in plain types, its files delta-rs rewrote with ``string_view``).

    DuckDB pushes its WHERE clauses into a registered dataset, and PyArrow
    cannot compare ``string_view``: register the first part as a dataset (it
    keeps the pushdown) and the second as a ``scanner()`` (DuckDB gets its
    batches after the cast to plain types and filters them itself). Either
    part is None when it holds no file.
    """
    import pyarrow.dataset as ds

    plain, rewritten = [], []
    for fragment in dataset.get_fragments():
        (plain if _is_plain(fragment) else rewritten).append(fragment)

    def part(fragments: list[ds.Fragment]) -> ds.FileSystemDataset | None:
        return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem) if fragments else None

    return part(plain), part(rewritten)


_PLAIN_FILES: dict[str, bool] = {}
"""Data file path -> its physical types are plain. A cache of facts that never change: Delta never
rewrites a file in place, and file names carry a UUID."""


def _is_plain(fragment: ds.FileFragment) -> bool:
    plain = _PLAIN_FILES.get(fragment.path)
    if plain is None:
        if len(_PLAIN_FILES) >= 1_000_000:
            _PLAIN_FILES.clear()
        plain = _PLAIN_FILES[fragment.path] = all(plain_type(f.type) == f.type for f in fragment.physical_schema)
    return plain


def _file_guarantees(delta: DeltaTable, columns: Sequence[str]) -> dict[str, pc.Expression]:
    """File name -> ``min <= column <= max`` for ``columns`` without nulls in that file (Delta's add stats)."""
    if not columns:
        return {}
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(delta.get_add_actions(flatten=True))
    guarantees: dict[str, pc.Expression] = {}
    for i, path in enumerate(actions.column("path").to_pylist()):
        bounds = [
            (pc.field(c) >= actions[f"min.{c}"][i]) & (pc.field(c) <= actions[f"max.{c}"][i])
            for c in columns
            if f"max.{c}" in actions.column_names and actions[f"null_count.{c}"][i].as_py() == 0
            and actions[f"min.{c}"][i].is_valid and actions[f"max.{c}"][i].is_valid
        ]
        if bounds:
            guarantees[path.rsplit("/", 1)[-1]] = functools.reduce(operator.and_, bounds)
    return guarantees


def _filtered_batches(dataset: ds.Dataset, columns: list[str] | None, filter: pc.Expression,
                      batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Batches matching ``filter``, file by file (skipping files whose guarantee excludes it), so a
    rewritten file can be filtered after its cast."""
    import pyarrow as pa

    for fragment in dataset.get_fragments(filter=filter):
        try:
            table = fragment.to_table(schema=dataset.schema, columns=columns, filter=filter)
        except pa.ArrowNotImplementedError:  # string_view columns delta-rs wrote: no comparison kernel
            table = fragment.to_table(schema=dataset.schema).filter(filter)
            table = table if columns is None else table.select(columns)
        yield from table.to_batches(max_chunksize=batch_rows)


def list_tables(lake: Lake) -> list[str]:
    """Names of the Delta tables in the lake, one folder level deep (``events``, ``datasets/nightly``).

    Raises ``StoreUnreachable`` when an object-store lake's bucket does not answer.
    """
    if lake.is_local:
        root = Path(lake.root.removeprefix("file://"))
        if not root.is_dir():
            return []
        return sorted(
            str(path.parent.relative_to(root))
            for pattern in ("*/_delta_log", "*/*/_delta_log")
            for path in root.glob(pattern)
            if path.is_dir()
        )
    if problem := store_problem(lake.root, lake.storage_options):
        raise StoreUnreachable(problem)
    import pyarrow.fs as pafs

    filesystem, prefix = arrow_filesystem(lake.root, lake.storage_options)
    names: list[str] = []
    for parent in ("", *_child_dirs(filesystem, prefix)):
        for child in _child_dirs(filesystem, f"{prefix}/{parent}".rstrip("/")):
            name = f"{parent}/{child}".lstrip("/")
            if filesystem.get_file_info(f"{prefix}/{name}/_delta_log").type == pafs.FileType.Directory:
                names.append(name)
    return sorted(names)


def _child_dirs(filesystem: pafs.FileSystem, path: str) -> list[str]:
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(path, allow_not_found=True)
    return [
        info.base_name for info in filesystem.get_file_info(selector)
        if info.type == pafs.FileType.Directory and info.base_name != "_delta_log"
    ]


class TableNotCatalogued(ValueError):
    """A write to a table ``schemas.tables.CATALOGUE`` does not list: declare the table there first."""

    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} is not in the lake's catalogue: declare its name and schema in "
                         "schemas/tables.py (CATALOGUE) before writing it")
        self.table = table


class TableMissing(NotFound):
    """A table that has not been written yet."""

    def __init__(self, table: str, root: str) -> None:
        super().__init__(
            f"table {table!r} does not exist under lake {root!r}: ingest some events first "
            "(trajlake ingest) or check --lake / TRAJLAKE_LAKE"
        )
        self.table = table
