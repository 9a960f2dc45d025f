"""After ``trajlake forget --tenant acme --rollout r1 -y`` every read path keeps working for every tenant.

The forget rewrites files (string_view columns) and drops each table's history before it, so dataset
versions built before it can no longer be read: they are listed as vacuumed, never a 500.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone

import pytest
from tests.api.two_tenants import ACME, BETA, build_two_tenant_lake, make_client
from typer.testing import CliRunner

from pipelines import BuildConfig, build_dataset
from store.lake import Lake
from trainer.records import CheckpointRecord, write_checkpoint
from trajlake.cli import build_app


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_app(), list(args))
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(scope="module")
def forgotten(tmp_path_factory, broker) -> tuple[Lake, str]:
    """The two-tenant lake after forgetting acme's r1 (in both acme datasets and in everyone@0)."""
    lake = Lake(str(tmp_path_factory.mktemp("forgotten") / "lake"))
    build_two_tenant_lake(lake)
    shutil.rmtree(lake.uri("checkpoints"))  # the shared builder's is a stub; forget lists checkpoints to retrain
    for checkpoint_id, dataset, version in (("ck-acme", "acme-only", 1), ("ck-all", "everyone", 0)):
        write_checkpoint(lake, CheckpointRecord(
            checkpoint_id=checkpoint_id, dataset=dataset, dataset_version=version, base_model="tiny",
            parent_checkpoint_id=None, mode="pg", config={}, code_version="test", metrics={}, ds_path="ds",
            hf_path="hf", tokenizer="tok", world_size=1, n_samples=1, n_tokens=2, steps=1,
            created_at=datetime(2026, 11, 1, tzinfo=timezone.utc)))
    broker.create_topic("forget-events")
    code, output = cli("forget", "--tenant", "acme", "--rollout", "r1", "-y", "--lake", lake.root,
                       "--bootstrap-servers", broker.bootstrap_servers, "--topic", "forget-events")
    assert code == 0, output
    return lake, output


@pytest.fixture(scope="module")
def client(forgotten):
    # these are read-path checks, not limit tests: a slow shared machine must not hit the 2 s test default
    yield from make_client(forgotten[0], query_timeout_s=30.0)


def test_forget_says_what_it_cannot_reach(forgotten):
    _, output = forgotten
    assert "raw events stay in Kafka topic forget-events until its retention" in output
    assert "retention unknown" in output and "DescribeConfigs" in output  # tansu does not implement it
    assert "DELETE commit's commitInfo" in output and "names the tenant and rollout ids" in output
    assert "checkpoints trained on them (retrain, then delete): ck-acme" in output


@pytest.mark.parametrize(("headers", "tenant", "events"), [(ACME, "acme", 4), (BETA, "beta", 22)])
def test_every_api_read_path_answers_for_every_tenant(client, headers, tenant, events):
    assert client.post("/v1/sql", json={"sql": "SELECT tenant, count(*) FROM events GROUP BY ALL"},
                       headers=headers).json()["rows"] == [[tenant, events]]
    filtered = "SELECT count(*) FROM llm_calls WHERE rollout_id IN ('r1', 'r2', 'r9')"
    assert client.post("/v1/sql", json={"sql": filtered}, headers=headers).status_code == 200
    for path in ("/v1/rollouts", "/v1/sql/views", "/v1/datasets", "/v1/viewer/rollouts", "/v1/viewer/facets",
                 "/v1/viewer/success-rate"):
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)
    kept = "r2" if tenant == "acme" else "r9"
    for path in (f"/v1/rollouts/{kept}", f"/v1/viewer/rollouts/{kept}", f"/v1/lineage/{kept}"):
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)


def test_the_forgotten_rollout_is_gone_and_the_other_tenants_r1_stays(client):
    assert client.get("/v1/rollouts/r1", headers=ACME).status_code == 404
    assert client.get("/v1/rollouts/r1", headers=BETA).json()["summary"]["tenant"] == "beta"
    assert client.get("/v1/viewer/rollouts/r1", headers=BETA).status_code == 200


def test_dataset_versions_whose_history_was_vacuumed_are_shown_as_such(client):
    versions = {d["name"]: d["versions"] for d in client.get("/v1/datasets", headers=ACME).json()["items"]}
    assert [(v["version"], v["history"]) for v in versions["acme-only"]] == [(0, "vacuumed"),
                                                                            (1, "forgotten_rows_removed")]
    detail = client.get("/v1/datasets/acme-only", params={"version": 0}, headers=ACME)
    assert detail.status_code == 200 and detail.json()["manifest"]
    beta = client.get("/v1/datasets", headers=BETA).json()["items"]
    assert [(v["version"], v["history"]) for v in beta[0]["versions"]] == [(0, "kept")]
    rows = client.post("/v1/sql", json={"sql": "SELECT count(*) FROM datasets__acme_only"}, headers=ACME)
    assert rows.json()["rows"] == [[0]]  # the newest build, minus the forgotten rollout
    assert client.post("/v1/sql", json={"sql": "SELECT count(*) FROM datasets__beta_only"},
                       headers=BETA).json()["rows"] == [[1]]


def test_cli_sql_lineage_and_builds_work_after_the_forget(forgotten):
    lake, _ = forgotten
    code, output = cli("sql", "SELECT tenant, count(*) AS n FROM events GROUP BY ALL ORDER BY tenant",
                       "--lake", lake.root)
    assert code == 0 and "acme 4" in output and "beta 22" in output, output
    for ref in ("acme-only@0", "acme-only@1", "r9", "ck-acme"):
        code, output = cli("lineage", ref, "--lake", lake.root)
        assert code == 0, (ref, output)
    built = build_dataset(lake, "everyone", BuildConfig(advantage="raw"))
    assert built.version > 0 and built.manifest


def test_a_new_build_after_the_forget_is_readable_through_the_api(forgotten, client):
    lake, _ = forgotten
    build_dataset(lake, "beta-only", BuildConfig(advantage="raw", selection={"tenants": ["beta"]}))
    versions = client.get("/v1/datasets/beta-only", headers=BETA).json()["versions"]
    assert [v["history"] for v in versions] == ["kept", "kept"]
    assert client.post("/v1/sql", json={"sql": "SELECT count(DISTINCT rollout_id) FROM datasets__beta_only"},
                       headers=BETA).json()["rows"] == [[2]]
