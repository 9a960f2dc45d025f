"""Shared fixtures: a real embedded broker per test module, temp lakes, the tiny default model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.broker import EmbeddedBroker
from store.lake import Lake


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """A real Kafka-protocol broker (tansu) on a free loopback port."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def topic(broker: EmbeddedBroker) -> str:
    """A fresh 4-partition topic on the module's broker."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions=4)
    return name


@pytest.fixture
def group() -> str:
    """A unique consumer group (a group that dies mid-join can stay stuck on tansu)."""
    return f"g-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(str(tmp_path / "lake"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny default model folder (built once into ``$TRAJLAKE_HOME``, then reused).

    Shared by every test and every run: treat it as read-only (copy it before
    changing anything, e.g. ``shutil.copytree(tiny_model_dir, tmp_path / "m")``).
    """
    from trajlake.tiny_model import build_tiny_model, default_model_dir

    return build_tiny_model(default_model_dir())
