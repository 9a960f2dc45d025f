"""Shared fixtures: a real embedded broker per test module, temp lakes, the tiny default model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.broker import EmbeddedBroker
from store.lake import Lake
from tests.object_store import S3Server


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
    from devkit.tiny_model import build_tiny_model, default_model_dir

    return build_tiny_model(default_model_dir())


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (moto) on a free loopback port, shared by the session."""
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The ``AWS_*`` settings of the test S3 server, exported for this test (and its subprocesses)."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return dict(s3_server.env)


@pytest.fixture
def s3_lake(s3_server: S3Server, s3_env: dict[str, str]) -> Lake:
    """An empty lake at ``s3://<fresh bucket>/lake`` on the test S3 server."""
    return Lake(f"s3://{s3_server.new_bucket()}/lake")
