"""GET /v1/rollouts and GET /v1/rollouts/{id}: the caller's rollouts only."""

from __future__ import annotations

import pytest
from tests.api.two_tenants import ACME, BETA


def get(client, path, headers=ACME, **params):
    return client.get(path, headers=headers, params=params)


def ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [item["rollout_id"] for item in response.json()["items"]]


def test_each_tenant_lists_its_own_rollouts(client):
    acme = get(client, "/v1/rollouts").json()
    assert [(i["tenant"], i["rollout_id"]) for i in acme["items"]] == [("acme", "r1"), ("acme", "r2")]
    assert (acme["limit"], acme["offset"], acme["next_offset"]) == (100, 0, None)
    assert ids(get(client, "/v1/rollouts", BETA)) == ["r1", "r9"]


def test_filters_narrow_the_list(client):
    assert ids(get(client, "/v1/rollouts", task_id="t2")) == ["r2"]
    assert ids(get(client, "/v1/rollouts", status="running")) == ["r2"]
    assert ids(get(client, "/v1/rollouts", status="failed")) == []
    assert ids(get(client, "/v1/rollouts", harness="swe-agent")) == ["r1", "r2"]
    assert ids(get(client, "/v1/rollouts", harness="swe-agent@1.2")) == ["r1", "r2"]
    assert ids(get(client, "/v1/rollouts", harness="swe-agent@9")) == []
    assert ids(get(client, "/v1/rollouts", task_id="t9")) == []  # beta's task


def test_the_list_pages(client):
    first = get(client, "/v1/rollouts", limit=1).json()
    assert (len(first["items"]), first["next_offset"]) == (1, 1)
    second = get(client, "/v1/rollouts", limit=1, offset=1).json()
    assert (len(second["items"]), second["next_offset"]) == (1, None)
    assert first["items"][0]["rollout_id"] != second["items"][0]["rollout_id"]


@pytest.mark.parametrize("params", [{"status": "done"}, {"limit": -1}, {"limit": "x"}, {"offset": -1},
                                    {"offset": 10**12}, {"task_id": "t" * 600}])
def test_bad_query_parameters_are_422(client, params):
    response = get(client, "/v1/rollouts", **params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"


def test_a_rollout_comes_back_with_every_step_in_order(client):
    body = get(client, "/v1/rollouts/r1").json()
    assert body["summary"]["tenant"] == "acme" and body["summary"]["status"] == "succeeded"
    kinds = [s["kind"] for s in body["steps"]]
    assert kinds == ["rollout.started", "llm.call", "tool.call", "llm.call", "rollout.finished",
                     "reward", "reward", "reward"]
    assert [s["seq"] for s in body["steps"]] == sorted(s["seq"] for s in body["steps"])


def test_the_same_rollout_id_resolves_to_the_callers_own(client):
    assert get(client, "/v1/rollouts/r1", BETA).json()["summary"]["tenant"] == "beta"


@pytest.mark.parametrize("rollout_id", ["r9", "no-such-rollout", "r1' OR '1'='1"])
def test_other_tenants_and_unknown_rollouts_are_404_alike(client, rollout_id):
    response = get(client, f"/v1/rollouts/{rollout_id}")
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "not_found" and "beta" not in error["message"]


def test_an_overlong_rollout_id_is_422(client):
    assert get(client, "/v1/rollouts/" + "r" * 600).status_code == 422
