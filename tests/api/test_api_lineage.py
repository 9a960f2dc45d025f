"""GET /v1/lineage/{id}: both directions, cut down to the caller's rows and datasets."""

from __future__ import annotations

import pytest
from tests.api.two_tenants import ACME, BETA

from pipelines.lineage import trace


def lineage(client, ref, headers=ACME, **params) -> dict:
    response = client.get(f"/v1/lineage/{ref}", headers=headers, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_rollout_traces_to_the_callers_datasets_and_checkpoints(client):
    body = lineage(client, "r1")
    assert (body["kind"], body["rollouts"]) == ("rollout", ["r1"])
    assert [(d["dataset"], d["version"]) for d in body["datasets"]] == [("acme-only", 0), ("acme-only", 1)]
    assert [c["checkpoint_id"] for c in body["checkpoints"]] == ["ck-acme"]
    assert body["n_events"] == 11  # acme's r1 only, not beta's r1 with the same id


def test_the_same_rollout_id_traces_each_tenant_to_its_own(client):
    body = lineage(client, "r1", BETA)
    assert body["datasets"] == [] and body["checkpoints"] == []  # beta's r1 came after every build
    acme_events = {e["event_id"] for e in lineage(client, "r1", limit=1000)["events"]}
    beta_events = {e["event_id"] for e in lineage(client, "r1", BETA, limit=1000)["events"]}
    assert len(acme_events) == len(beta_events) == 11 and not acme_events & beta_events


def test_a_dataset_version_goes_down_to_events_and_kafka_offsets(client, api_lake):
    body = lineage(client, "acme-only@0")
    assert (body["kind"], body["subject"], body["rollouts"]) == ("dataset", "acme-only@0", ["r1"])
    assert (body["n_events"], len(body["events"])) == (5, 5)  # 2 calls x (request + response), the reward used
    assert {e["event_id"] for e in body["events"]} == set(trace.lineage(api_lake, "acme-only@0")
                                                           .events["event_id"].to_pylist())
    assert sum(r["events"] for r in body["offset_ranges"]) == 5


def test_a_checkpoint_on_the_callers_dataset_is_traced(client):
    body = lineage(client, "ck-acme")
    assert (body["kind"], body["datasets"][0]["version"]) == ("checkpoint", 1)


def test_events_page(client):
    first = lineage(client, "r1", limit=4)
    assert (len(first["events"]), first["next_offset"], first["n_events"]) == (4, 4, 11)
    last = lineage(client, "r1", limit=4, offset=8)
    assert (len(last["events"]), last["next_offset"]) == (3, None)


def test_an_event_id_of_the_callers_traces_up(client):
    event_id = lineage(client, "r1")["events"][0]["event_id"]
    body = lineage(client, event_id)
    assert body["kind"] == "event" and body["rollouts"] == ["r1"]
    response = client.get(f"/v1/lineage/{event_id}", headers=BETA)
    assert response.status_code == 404


@pytest.mark.parametrize("ref,headers", [
    ("r9", ACME),  # beta's rollout
    ("r2", BETA),  # acme's
    ("everyone@0", ACME),  # built over every tenant
    ("everyone", ACME),
    ("ck-all", ACME),  # a checkpoint on it
    ("acme-only@1", BETA),
    ("ck-acme", BETA),
    ("acme-only@9", ACME),
    ("nothing-at-all", ACME),
])
def test_what_is_not_the_callers_is_404_like_what_does_not_exist(client, ref, headers):
    response = client.get(f"/v1/lineage/{ref}", headers=headers)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["message"] == f"nothing of yours has the id {ref!r}"


@pytest.mark.parametrize("params", [{"limit": -1}, {"offset": "x"}])
def test_bad_lineage_parameters_are_422(client, params):
    assert client.get("/v1/lineage/r1", headers=ACME, params=params).status_code == 422
