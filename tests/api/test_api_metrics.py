"""Query API metrics: requests by route and outcome, latency, parsed from GET /metrics."""

from __future__ import annotations

from tests.api.two_tenants import ACME, make_client
from prometheus_client.parser import text_string_to_metric_families


def test_queries_are_counted_by_route_and_outcome(api_lake):
    for client in make_client(api_lake):
        assert client.post("/v1/sql", json={"sql": "SELECT 1 AS one"}, headers=ACME).status_code == 200
        assert client.post("/v1/sql", json={"sql": "SELECT nope FROM llm_calls"}, headers=ACME).status_code == 400
        assert client.post("/v1/sql", json={"sql": "DROP TABLE events"}, headers=ACME).status_code == 400
        assert client.get("/v1/rollouts/no-such-rollout", headers=ACME).status_code == 404
        assert client.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 401
        answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    counted = {(s.labels["route"], s.labels["outcome"]): s.value
               for s in families["trajlake_query_api_requests"].samples if s.name.endswith("_total")}
    unauthorized = next(o for (r, o) in counted if r == "/v1/sql" and o not in ("ok", "query_error", "query_refused"))
    assert counted == {("/v1/sql", "ok"): 1, ("/v1/sql", "query_error"): 1, ("/v1/sql", "query_refused"): 1,
                       ("/v1/rollouts/{rollout_id}", "not_found"): 1, ("/v1/sql", unauthorized): 1}
    latency = {s.labels["route"]: s.value for s in families["trajlake_query_api_request_seconds"].samples
               if s.name.endswith("_count")}
    assert latency["/v1/sql"] == 4 and latency["/v1/rollouts/{rollout_id}"] == 1
