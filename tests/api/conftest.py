"""Fixtures of the API tests: the two-tenant lake of ``tests.api.two_tenants``, built once, and the app over it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from store.lake import Lake
from tests.api.two_tenants import build_two_tenant_lake, make_client


@pytest.fixture(scope="package")
def api_lake(tmp_path_factory) -> Lake:
    """Built once for the API tests: every test only reads it."""
    lake = Lake(str(tmp_path_factory.mktemp("api") / "lake"))
    build_two_tenant_lake(lake)
    return lake


@pytest.fixture(scope="package")
def client(api_lake: Lake) -> Iterator[TestClient]:
    """The app over the shared lake (default limits, 2 s query timeout)."""
    yield from make_client(api_lake)
