"""The viewer's pages and JSON endpoints over the shared two-tenant lake (see conftest.py)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from tests.api.two_tenants import ACME, BETA, GAMMA, KEYS

from ingest.gateway.auth import KeyRing
from pipelines import read_dataset
from api import create_query_app
from api.viewer import STATIC_DIR, tokens as viewer_tokens
from api.viewer.service import MAX_TEXT_CHARS, _cut
from api.viewer.stats import wilson_interval
from store.lake import Lake
from trajlake.commands.query_api import QueryApiSettings
from devkit.tiny_model import build_tiny_model, default_model_dir


@pytest.mark.parametrize("path", ["/viewer", "/viewer/rollout", "/viewer/success"])
def test_pages_are_served_without_a_key_and_lock_scripts_to_this_origin(client, path) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert 'id="key-form"' in response.text


def test_every_asset_is_local() -> None:
    files = sorted(STATIC_DIR.glob("*.*"))
    assert {f.suffix for f in files} == {".html", ".js", ".css"}
    for file in files:
        text = file.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), f"{file.name} loads from another origin"
        assert "@import" not in text and "innerHTML" not in text, file.name


def test_assets_are_served(client) -> None:
    for name in ("viewer.js", "rollouts.js", "rollout.js", "success.js", "viewer.css"):
        assert client.get(f"/viewer/static/{name}").status_code == 200
    assert client.get("/viewer/static/../app.py").status_code == 404


@pytest.mark.parametrize("path", ["/v1/viewer/rollouts", "/v1/viewer/facets", "/v1/viewer/rollouts/r1",
                                  "/v1/viewer/success-rate"])
def test_data_needs_a_key(client, path) -> None:
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [r["rollout_id"] for r in response.json()["items"]]


def test_list_shows_the_keys_tenant_only(client) -> None:
    acme = client.get("/v1/viewer/rollouts", headers=ACME).json()["items"]
    assert {(r["rollout_id"], r["task_id"]) for r in acme} == {("r1", "t1"), ("r2", "t2")}
    assert sorted(_ids(client.get("/v1/viewer/rollouts", headers=BETA))) == ["r1", "r9"]
    assert _ids(client.get("/v1/viewer/rollouts", headers=GAMMA)) == []


@pytest.mark.parametrize("query, expected", [
    ({"status": "succeeded"}, ["r1"]),
    ({"status": "running"}, ["r2"]),
    ({"task_id": "t2"}, ["r2"]),
    ({"harness": "swe-agent"}, ["r1", "r2"]),
    ({"harness": "swe-agent@1.2"}, ["r1", "r2"]),
    ({"harness": "swe-agent@9"}, []),
    ({"min_reward": 1.5}, ["r1"]),
    ({"min_reward": 1.6}, []),
    ({"max_reward": 1.0}, []),
    ({"min_reward": 0, "max_reward": 2, "status": "succeeded", "task_id": "t1"}, ["r1"]),
])
def test_list_filters(client, query, expected) -> None:
    assert sorted(_ids(client.get("/v1/viewer/rollouts", params=query, headers=ACME))) == expected


def test_list_pages(client) -> None:
    first = client.get("/v1/viewer/rollouts", params={"limit": 1}, headers=ACME).json()
    second = client.get("/v1/viewer/rollouts", params={"limit": 1, "offset": 1}, headers=ACME).json()
    assert first["next_offset"] == 1 and second["next_offset"] is None
    assert {first["items"][0]["rollout_id"], second["items"][0]["rollout_id"]} == {"r1", "r2"}


@pytest.mark.parametrize("query", [
    {"min_reward": "abc"}, {"max_reward": "nan"}, {"min_reward": "inf"}, {"status": "done"}, {"limit": -1},
    {"offset": -1}, {"limit": "many"}, {"task_id": "t" * 513}, {"harness": "h" * 513},
])
def test_list_refuses_bad_filters(client, query) -> None:
    response = client.get("/v1/viewer/rollouts", params=query, headers=ACME)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_facets(client) -> None:
    assert client.get("/v1/viewer/facets", headers=ACME).json() == {
        "harnesses": ["swe-agent@1.2"], "statuses": ["running", "succeeded"], "n_rollouts": 2}
    assert client.get("/v1/viewer/facets", headers=GAMMA).json() == {"harnesses": [], "statuses": [], "n_rollouts": 0}


def test_rollout_detail_has_full_text_and_the_newest_visible_dataset(client, api_lake: Lake) -> None:
    detail = client.get("/v1/viewer/rollouts/r1", headers=ACME).json()
    assert [s["kind"] for s in detail["trajectory"]["steps"]][:3] == ["rollout.started", "llm.call", "tool.call"]
    calls = {c["call_id"]: c for c in detail["calls"]}
    assert '"fix the bug"' in calls["c1"]["messages"] and calls["c1"]["text"] == "I will run the tests"
    assert detail["tools"] == [{"call_id": "t1", "arguments": '{"cmd":"pytest"}', "result": '"1 failed"',  # JSON text
                                "truncated": False}]
    tokens = detail["tokens"]
    assert (tokens["source"], tokens["dataset"], tokens["version"]) == ("dataset", "acme-only", 1)
    rows = read_dataset(api_lake, "acme-only", 1).to_pylist()
    assert [b["ids"] for b in tokens["blocks"]] == [r["input_ids"] for r in rows]
    assert [b["mask"] for b in tokens["blocks"]] == [r["loss_mask"] for r in rows]
    assert [b["start_reason"] for b in tokens["blocks"]] == ["first"]
    assert tokens["n_masked"] == sum(sum(r["loss_mask"]) for r in rows) == 5
    assert tokens["blocks"][0]["pieces"] is None and "TRAJLAKE_VIEWER_TOKENIZER" in tokens["note"]


def test_rollout_in_no_visible_dataset_shows_its_calls_tokens(client) -> None:
    # beta's r1 landed after every build; acme's r1 (same id) is in acme-only and everyone
    tokens = client.get("/v1/viewer/rollouts/r1", headers=BETA).json()["tokens"]
    assert tokens["source"] == "calls" and tokens["dataset"] is None
    assert [(b["call_ids"], b["ids"], b["mask"]) for b in tokens["blocks"]] == [
        (["c1"], [1, 2, 3, 4, 5], [0, 0, 0, 1, 1]),
        (["c2"], [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 0, 0, 0, 0, 0, 1, 1, 1]),
    ]
    assert "no dataset contains this rollout" in tokens["note"]


@pytest.mark.parametrize("headers, rollout", [(ACME, "r9"), (GAMMA, "r1"), (ACME, "nope")])
def test_rollout_of_another_tenant_is_not_found(client, headers, rollout) -> None:
    response = client.get(f"/v1/viewer/rollouts/{rollout}", headers=headers)
    assert response.status_code == 404
    assert response.json()["error"]["hint"] == "GET /v1/rollouts lists your rollouts"


def test_rollout_id_too_long_is_refused(client) -> None:
    assert client.get("/v1/viewer/rollouts/" + "r" * 513, headers=ACME).status_code == 422


def test_token_view_is_cut_at_the_cap(client, monkeypatch) -> None:
    monkeypatch.setattr(viewer_tokens, "MAX_TOKENS_SHOWN", 7)
    tokens = client.get("/v1/viewer/rollouts/r1", headers=BETA).json()["tokens"]
    assert [(len(b["ids"]), b["truncated"]) for b in tokens["blocks"]] == [(5, False), (2, True)]
    assert (tokens["n_tokens"], tokens["n_masked"]) == (14, 5)  # counted before the cut


def test_long_text_is_cut() -> None:
    row = {"call_id": "c", "arguments": "x" * (MAX_TEXT_CHARS + 1), "result": None}
    assert _cut(row, ("arguments", "result")) == {"call_id": "c", "arguments": "x" * MAX_TEXT_CHARS,
                                                  "result": None, "truncated": True}
    assert _cut({**row, "arguments": "{}"}, ("arguments", "result"))["truncated"] is False


def _viewer_client(lake: Lake) -> TestClient:
    """The app with settings read from the environment (TRAJLAKE_VIEWER_TOKENIZER included)."""
    return TestClient(create_query_app(QueryApiSettings(lake=lake.root, snapshot_ttl_s=0.0), keys=KeyRing(KEYS)))


def test_tokenizer_from_the_environment_decodes_pieces(api_lake, monkeypatch) -> None:
    folder = build_tiny_model(default_model_dir())
    monkeypatch.setenv("TRAJLAKE_VIEWER_TOKENIZER", str(folder))
    with _viewer_client(api_lake) as client:
        tokens = client.get("/v1/viewer/rollouts/r1", headers=ACME).json()["tokens"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokens["blocks"][0]["pieces"] == [tokenizer.decode([i]) for i in tokens["blocks"][0]["ids"]]
    assert tokens["blocks"][0]["pieces"][:2] == ["<|im_start|>", "<|im_end|>"]
    assert "TRAJLAKE_VIEWER_TOKENIZER" not in tokens["note"]


def test_unloadable_tokenizer_falls_back_to_ids(api_lake, tmp_path, monkeypatch) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    monkeypatch.setenv("TRAJLAKE_VIEWER_TOKENIZER", str(tmp_path))
    with _viewer_client(api_lake) as client:
        response = client.get("/v1/viewer/rollouts/r1", headers=ACME)
    assert response.status_code == 200
    tokens = response.json()["tokens"]
    assert tokens["blocks"][0]["pieces"] is None and "could not be loaded" in tokens["note"]


def test_success_rate_counts_ended_rollouts_of_the_tenant(client) -> None:
    chart = client.get("/v1/viewer/success-rate", headers=ACME).json()
    assert chart["bucket"] == "hour" and chart["confidence"] == 0.95
    [series] = chart["series"]  # r2 is still running: not counted
    assert series["harness"] == "swe-agent@1.2"
    [point] = series["points"]
    assert (point["bucket"], point["n"], point["succeeded"], point["rate"]) == ("2026-01-01T00:00:00Z", 1, 1, 1.0)
    assert (point["low"], point["high"]) == pytest.approx(wilson_interval(1, 1))
    assert client.get("/v1/viewer/success-rate", headers=GAMMA).json()["series"] == []


@pytest.mark.parametrize("query, buckets", [({"bucket": "day"}, "day"), ({"harness": "swe-agent"}, "hour")])
def test_success_rate_options(client, query, buckets) -> None:
    chart = client.get("/v1/viewer/success-rate", params=query, headers=BETA).json()
    assert chart["bucket"] == buckets and [s["harness"] for s in chart["series"]] == ["swe-agent@1.2"]
    assert chart["series"][0]["points"][0]["n"] == 2  # beta's r1 and r9


def test_success_rate_of_an_unknown_harness_is_empty(client) -> None:
    assert client.get("/v1/viewer/success-rate", params={"harness": "other"}, headers=ACME).json()["series"] == []


@pytest.mark.parametrize("query", [{"bucket": "week"}, {"confidence": 0.2}, {"confidence": 1}, {"confidence": "x"},
                                   {"harness": ""}, {"harness": "h" * 513}])
def test_success_rate_refuses_bad_options(client, query) -> None:
    assert client.get("/v1/viewer/success-rate", params=query, headers=ACME).status_code == 422


@pytest.mark.parametrize("k, n, expected", [(9, 10, (0.5958, 0.9821)), (0, 10, (0.0, 0.2775)),
                                            (10, 10, (0.7225, 1.0)), (1, 1, (0.2065, 1.0))])
def test_wilson_interval_matches_reference_values(k, n, expected) -> None:
    assert wilson_interval(k, n) == pytest.approx(expected, abs=1e-4)


def test_wilson_interval_is_wider_at_higher_confidence() -> None:
    low95, high95 = wilson_interval(5, 20)
    low99, high99 = wilson_interval(5, 20, confidence=0.99)
    assert low99 < low95 < 0.25 < high95 < high99


@pytest.mark.parametrize("k, n", [(0, 0), (3, 2), (-1, 4)])
def test_wilson_interval_refuses_impossible_counts(k, n) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


def test_decoder_marks_ids_outside_its_vocabulary() -> None:
    decoder = viewer_tokens.TokenDecoder(build_tiny_model(default_model_dir()))
    assert decoder.pieces([1, 2, 10_000_000, -1]) == ["<|im_start|>", "<|im_end|>", "<10000000>", "<-1>"]
    assert decoder.problem is None
    assert viewer_tokens.TokenDecoder(None).pieces([1]) is None
