"""A fresh deployment: the lake root does not exist yet, and every route still answers sensibly."""

from __future__ import annotations

from tests.api.two_tenants import ACME, make_client

from store.lake import Lake


def test_a_lake_with_nothing_in_it_yet_answers_empty_or_404(tmp_path):
    for client in make_client(Lake(str(tmp_path / "not-created-yet"))):
        response = client.post("/v1/sql", json={"sql": "SELECT count(*) FROM rollouts"}, headers=ACME)
        assert response.json()["rows"] == [[0]]
        assert client.get("/v1/rollouts", headers=ACME).json()["items"] == []
        assert client.get("/v1/datasets", headers=ACME).json()["items"] == []
        for path in ("/v1/rollouts/r1", "/v1/datasets/d", "/v1/lineage/r1"):
            assert client.get(path, headers=ACME).status_code == 404, path
