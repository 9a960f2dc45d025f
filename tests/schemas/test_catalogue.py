"""The table catalogue (``schemas.tables``) is the one place a lake table is declared, and the write path obeys it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pyarrow as pa
import pytest

from schemas.tables import CATALOGUE, VIEWS, catalogued, dataset_table
from store.lake import Lake, TableNotCatalogued

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "devkit", "ingest", "pipelines", "schemas", "serve", "store", "trainer", "trajlake")


def sources() -> list[Path]:
    return [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]


def test_every_table_says_what_a_row_is_its_key_and_its_writer() -> None:
    for name, table in CATALOGUE.items():
        assert table.name == name and isinstance(table.schema, pa.Schema)
        assert table.row and table.key and set(table.key) <= set(table.schema.names), name
        importlib.import_module(table.writer.split()[0])  # the writer named is a real module


def test_views_do_not_shadow_tables() -> None:
    assert not set(VIEWS) & set(CATALOGUE)


@pytest.mark.parametrize(("name", "known"), [
    ("events", True), ("checkpoints", True), (dataset_table("nightly"), True),
    ("scores", False), ("datasets/", False), ("datasets/a/b", False), ("llm_calls", False),
])
def test_catalogued_names(name: str, known: bool) -> None:
    assert catalogued(name) is known


def test_the_lake_refuses_to_write_a_table_the_catalogue_does_not_list(tmp_path) -> None:
    lake = Lake(str(tmp_path))
    with pytest.raises(TableNotCatalogued, match="schemas/tables.py"):
        lake.append("scores", pa.table({"x": [1]}))
    with pytest.raises(TableNotCatalogued):
        lake.write_uri("datasets/a/b")
    assert not lake.exists("scores")
    lake.append(dataset_table("ok"), pa.table({"x": [1]}))
    assert lake.read(dataset_table("ok")).num_rows == 1


def test_every_delta_write_goes_through_the_checked_path() -> None:
    """``write_deltalake`` / ``DeltaTable.create`` on a lake location use ``Lake.write_uri``, never ``uri``."""
    raw = re.compile(r"(write_deltalake|DeltaTable\.create)\(\s*[\w.]*\.uri\(")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources()
                 for n, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert not offenders, offenders


def test_tables_are_declared_only_in_the_catalogue() -> None:
    declaration = re.compile(r"^[A-Z_]+ = pa\.(schema|timestamp)\(|^[A-Z_]*TABLE[A-Z_]* = [\"']")
    catalogue = (ROOT / "schemas" / "tables.py", ROOT / "schemas" / "table_names.py")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources() if p not in catalogue
                 for n, line in enumerate(p.read_text().splitlines(), 1) if declaration.search(line)]
    assert not offenders, offenders
