"""Fixtures of the gateway tests: the fake engine over HTTP, gateway settings, the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_fake_engine import create_fake_engine
from gateway_helpers import KEY, OTHER_KEY, TENANT, serve

from trajlake.commands.gateway import GatewaySettings


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, object]]:
    """The fake engine's base URL (ending in /v1) and its app (for call counters)."""
    app = create_fake_engine()
    with serve(app) as url:
        yield f"{url}/v1", app


@pytest.fixture
def settings(tmp_path: Path, engine) -> GatewaySettings:
    return GatewaySettings(
        upstream_url=engine[0],
        gateway_keys=f"{KEY}={TENANT},{OTHER_KEY}=globex",
        spool_dir=tmp_path / "spool",
        upstream_timeout_s=1.0,
        upstream_retries=2,
        max_body_bytes=64 * 1024,
        bootstrap_servers="127.0.0.1:1",
        broker_timeout_s=1.0,
    )
