"""A real two-tenant lake on disk (events through the ingester's row mapping, real dataset builds) and the app over it.

Tenants ``acme`` and ``beta`` both have a rollout ``r1`` (ids collide across
tenants on purpose; beta's lands after the dataset builds, which key rollouts
by rollout_id alone); acme also has ``r2`` (task t2, running) and beta ``r9``.
Datasets: ``acme-only`` (built for acme alone, two versions), ``beta-only``,
and ``everyone`` (built over all tenants: visible to nobody). Checkpoints
``ck-acme`` (on acme-only@1) and ``ck-all`` (on everyone@0).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from fastapi.testclient import TestClient

from api import create_query_app
from ingest.gateway.auth import KeyRing
from pipelines import BuildConfig, build_dataset
from store.lake import Lake
from tests.store.lake_builder import sample_rollout, write_events
from trajlake.commands.query_api import QueryApiSettings

KEYS = {"key-acme": "acme", "key-beta": "beta", "key-gamma": "gamma"}
ACME = {"Authorization": "Bearer key-acme"}
BETA = {"Authorization": "Bearer key-beta"}
GAMMA = {"X-Api-Key": "key-gamma"}
CHECKPOINTS = pa.schema([pa.field("checkpoint_id", pa.string()), pa.field("dataset", pa.string()),
                         pa.field("dataset_version", pa.int64())])


def build_two_tenant_lake(lake: Lake) -> None:
    write_events(lake, [
        *sample_rollout("r1", tenant="acme"),
        *sample_rollout("r2", task_id="t2", tenant="acme")[:4],
        *sample_rollout("r9", task_id="t9", tenant="beta"),
    ])
    raw = {"advantage": "raw"}
    build_dataset(lake, "acme-only", BuildConfig(**raw, selection={"tenants": ["acme"]}))
    build_dataset(lake, "acme-only", BuildConfig(advantage="mean", selection={"tenants": ["acme"]}))
    build_dataset(lake, "beta-only", BuildConfig(**raw, selection={"tenants": ["beta"]}))
    build_dataset(lake, "everyone", BuildConfig(**raw))
    # after the builds: they key rollouts by rollout_id alone and would mix the two r1s
    write_events(lake, sample_rollout("r1", tenant="beta"))
    lake.append("checkpoints", pa.Table.from_pylist([
        {"checkpoint_id": "ck-acme", "dataset": "acme-only", "dataset_version": 1},
        {"checkpoint_id": "ck-all", "dataset": "everyone", "dataset_version": 0},
    ], schema=CHECKPOINTS))


def make_client(lake: Lake, **settings) -> Iterator[TestClient]:
    config = QueryApiSettings(lake=lake.root, **{"query_timeout_s": 2.0, "snapshot_ttl_s": 0.0, **settings})
    with TestClient(create_query_app(config, keys=KeyRing(KEYS))) as client:
        yield client
