"""Every route but /healthz needs a known key; the key decides the tenant."""

from __future__ import annotations

import pytest
from tests.api.two_tenants import ACME

ROUTES = [
    ("POST", "/v1/sql"),
    ("GET", "/v1/sql/views"),
    ("GET", "/v1/rollouts"),
    ("GET", "/v1/rollouts/r1"),
    ("GET", "/v1/datasets"),
    ("GET", "/v1/datasets/acme-only"),
    ("GET", "/v1/lineage/r1"),
]

BAD_HEADERS = [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": "Bearer "},
    {"Authorization": "Basic a2V5LWFjbWU6"},
    {"Authorization": "key-acme"},
    {"X-Api-Key": ""},
    {"X-Api-Key": "key-acme "},
    {"X-Api-Key": "KEY-ACME"},
]


@pytest.mark.parametrize("method,path", ROUTES)
@pytest.mark.parametrize("headers", BAD_HEADERS, ids=lambda h: repr(h)[:40])
def test_missing_or_unknown_keys_get_401(client, method, path, headers):
    response = client.request(method, path, headers=headers, json={"sql": "SELECT 1"})
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthorized"


def test_a_bearer_key_or_an_x_api_key_authenticates(client):
    for headers in (ACME, {"X-Api-Key": "key-acme"}, {"authorization": "bearer key-acme"}):
        response = client.post("/v1/sql", json={"sql": "SELECT DISTINCT tenant FROM events"}, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["rows"] == [["acme"]]


def test_health_needs_no_key(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_the_openapi_document_lists_every_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/sql", "/v1/sql/views", "/v1/rollouts", "/v1/rollouts/{rollout_id}", "/v1/datasets",
            "/v1/datasets/{name}", "/v1/lineage/{ref}", "/healthz"} <= set(paths)

