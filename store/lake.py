"""The lake: one root folder (or ``s3://`` prefix) holding every Delta table.

``Lake`` knows where each table lives, appends Arrow data with Delta
transaction markers (the exactly-once mechanism: ``app_id -> version`` in the
same commit as the rows) and reads tables back, optionally at a past version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError


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
        if "://" not in self.root:
            object.__setattr__(self, "root", str(Path(self.root).expanduser().resolve()))
        elif not self.storage_options:
            # An object-store lake built from a bare URI takes its credentials from AWS_* etc.
            from store.storage import storage_options

            object.__setattr__(self, "storage_options", storage_options(self.root))

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def uri(self, table: str) -> str:
        """Location of a table; ``datasets/NAME`` style names nest."""
        return f"{self.root.rstrip('/')}/{table}"

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=dict(self.storage_options))

    def table(self, table: str, *, version: int | None = None) -> DeltaTable:
        """Open a table (at ``version`` for time travel); ``TableMissing`` if absent."""
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=dict(self.storage_options))
        except TableNotFoundError:
            raise TableMissing(table, self.root) from None

    def version(self, table: str) -> int | None:
        """Current Delta version of a table, None when it does not exist yet."""
        if not self.exists(table):
            return None
        return self.table(table).version()

    def read(self, table: str, *, version: int | None = None, columns: list[str] | None = None) -> pa.Table:
        """Read a whole table (or some columns) into Arrow."""
        return self.table(table, version=version).to_pyarrow_table(columns=columns)

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
        table version.
        """
        if schema is not None:
            data = data.cast(schema)
        txns = [Transaction(app_id=app, version=int(v)) for app, v in (markers or {}).items()]
        write_deltalake(
            self.uri(table),
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


class TableMissing(LookupError):
    """A table that has not been written yet."""

    def __init__(self, table: str, root: str) -> None:
        super().__init__(
            f"table {table!r} does not exist under lake {root!r}: ingest some events first "
            "(trajlake ingest) or check --lake / TRAJLAKE_LAKE"
        )
        self.table = table
