"""GET /v1/datasets and /v1/datasets/{name}: only versions built for the caller alone."""

from __future__ import annotations

import pytest
from tests.api.two_tenants import ACME, BETA, GAMMA


def test_each_tenant_sees_the_datasets_built_for_it_alone(client):
    acme = client.get("/v1/datasets", headers=ACME).json()["items"]
    assert [(d["name"], [v["version"] for v in d["versions"]]) for d in acme] == [("acme-only", [0, 1])]
    assert acme[0]["versions"][0]["n_rollouts"] == 1
    beta = client.get("/v1/datasets", headers=BETA).json()["items"]
    assert [d["name"] for d in beta] == ["beta-only"]
    assert client.get("/v1/datasets", headers=GAMMA).json()["items"] == []


def test_a_dataset_shows_its_newest_manifest_or_the_version_asked(client):
    body = client.get("/v1/datasets/acme-only", headers=ACME).json()
    assert (body["version"], body["manifest"]["advantage"]) == (1, "mean")
    assert body["manifest"]["filters"]["tenants"] == ["acme"]
    assert [v["version"] for v in body["versions"]] == [0, 1]
    older = client.get("/v1/datasets/acme-only", headers=ACME, params={"version": 0}).json()
    assert (older["version"], older["manifest"]["advantage"]) == (0, "raw")


@pytest.mark.parametrize("path,headers", [
    ("/v1/datasets/everyone", ACME),  # built over every tenant: nobody's
    ("/v1/datasets/beta-only", ACME),
    ("/v1/datasets/acme-only", BETA),
    ("/v1/datasets/acme-only?version=7", ACME),
    ("/v1/datasets/no-such", ACME),
])
def test_invisible_and_unknown_datasets_are_404_alike(client, path, headers):
    response = client.get(path, headers=headers)
    assert response.status_code == 404, response.text
    assert "version" not in response.json()["error"]["message"] or "7" in path


@pytest.mark.parametrize("path", ["/v1/datasets/acme-only?version=-1", "/v1/datasets/acme-only?version=x",
                                  "/v1/datasets/" + "d" * 200])
def test_bad_dataset_parameters_are_422(client, path):
    assert client.get(path, headers=ACME).status_code == 422
