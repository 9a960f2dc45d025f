"""build_dataset on real Delta tables: rows, weights, hashes, rewards, selection, exclusions, versions."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from kafka.errors import KafkaTimeoutError

from pipelines import (
    BadFilter,
    BuildConfig,
    DatasetNotFound,
    EmptyDataset,
    RewardRule,
    Selection,
    SourceMissing,
    build_dataset,
    diff_versions,
    export_parquet,
    get_manifest,
    list_versions,
    read_dataset,
)
from pipelines.datasets.samples import CorruptTable
from tests.pipelines.conftest import T0, LakeRows


def agent(rows: LakeRows, rollout_id: str, task_id: str, reward: float | None, *, split: bool = False, **kw) -> None:
    """A rollout of two extending calls (plus a third that cannot extend when ``split``)."""
    rows.rollout(rollout_id, task_id, **kw)
    rows.call(rollout_id, "c1", [1, 2, 3], [4, 5])
    rows.call(rollout_id, "c2", [1, 2, 3, 4, 5, 6], [7, 8, 9])
    if split:
        rows.call(rollout_id, "c3", [1, 2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21])
    if reward is not None:
        rows.reward(rollout_id, reward)


@pytest.fixture
def four(rows: LakeRows) -> LakeRows:
    agent(rows, "r1", "t1", 1.0, split=True)
    agent(rows, "r2", "t1", 0.0)
    agent(rows, "r3", "t2", 3.0)
    agent(rows, "r4", "t2", 1.0)
    rows.flush()
    return rows


def by_rollout(table) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in table.sort_by([("rollout_id", "ascending"), ("sample_index", "ascending")]).to_pylist():
        out.setdefault(row["rollout_id"], []).append(row)
    return out


def test_samples_carry_rollout_advantages_and_weights_that_sum_to_one(lake, four):
    result = build_dataset(lake, "ds")
    samples = by_rollout(read_dataset(lake, "ds"))
    assert [len(samples[r]) for r in ("r1", "r2", "r3", "r4")] == [2, 1, 1, 1]
    assert [s["start_reason"] for s in samples["r1"]] == ["first", "other"]
    assert samples["r2"][0]["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert samples["r2"][0]["loss_mask"] == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert samples["r2"][0]["old_logprobs"] == [0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5, -0.5]
    # grpo: t1 rewards 1, 0 -> +1, -1; t2 rewards 3, 1 -> +1, -1
    assert {r: s[0]["advantage"] for r, s in samples.items()} == {"r1": 1.0, "r2": -1.0, "r3": 1.0, "r4": -1.0}
    # r1 trains 5 + 1 tokens over two samples, the others 5: weight 1 / (4 x T_r)
    assert samples["r1"][0]["token_weight"] == pytest.approx(1 / 24)
    assert samples["r1"][1]["token_weight"] == pytest.approx(1 / 24)
    assert samples["r2"][0]["token_weight"] == pytest.approx(1 / 20)
    table = read_dataset(lake, "ds")
    weights = np.array(table["token_weight"].to_pylist()) * np.array(table["n_trained_tokens"].to_pylist())
    assert weights.sum() == pytest.approx(1.0, abs=1e-6)
    assert result.manifest["merge"]["mismatches"]["other"] == 1
    assert result.manifest["merge"]["single_sample_share"] == 0.75
    assert result.manifest["counts"]["trained_tokens"] == 21


def test_content_hash_is_deterministic_across_builds_and_batch_sizes(lake, four):
    first = build_dataset(lake, "ds")
    again = build_dataset(lake, "ds")
    tiny_batches = build_dataset(lake, "ds", BuildConfig(batch_tokens=5))
    other = build_dataset(lake, "ds", BuildConfig(advantage="mean"))
    assert (first.version, again.version, tiny_batches.version) == (0, 1, 2)
    assert first.content_hash == again.content_hash == tiny_batches.content_hash
    assert other.content_hash != first.content_hash
    rows_of = lambda v: read_dataset(lake, "ds", v).sort_by("sample_id").to_pylist()  # noqa: E731
    assert rows_of(2) == rows_of(0)


def test_a_late_reward_is_used_by_the_next_build(lake, four):
    agent(four, "r5", "t2", None)
    four.flush()
    before = build_dataset(lake, "ds")
    assert before.manifest["counts"]["rollouts"]["without_reward"] == 1
    four.reward("r5", 2.0)
    four.reward("r1", 0.0, ts=T0 + timedelta(days=1))  # a newer reward of the same name replaces the old one
    four.flush()
    after = build_dataset(lake, "ds")
    assert after.manifest["counts"]["rollouts"]["without_reward"] == 0
    samples = by_rollout(read_dataset(lake, "ds"))
    assert samples["r5"][0]["reward"] == 2.0 and samples["r1"][0]["reward"] == 0.0
    d = diff_versions(lake, ("ds", before.version), ("ds", after.version))
    assert d.rollouts_added == ["r5"] and d.rewards_changed == ["r1"] and not d.same_content
    assert d.source_changes["rewards"] == (0, 1)


def test_reward_rules_combine_several_rewards(lake, rows):
    for rid, rewards in {"a": {"pass": 1.0, "style": 0.5}, "b": {"pass": 0.0}, "c": {"style": 1.0}}.items():
        agent(rows, rid, "t", None)
        for name, value in rewards.items():
            rows.reward(rid, value, name=name)
    rows.reward("a", 0.25, name="style")  # later: replaces style=0.5
    rows.flush()

    def rewards(rule: str) -> dict[str, float]:
        build_dataset(lake, "ds", BuildConfig(reward_rule=RewardRule.parse(rule), advantage="raw"))
        return {r: s[0]["reward"] for r, s in by_rollout(read_dataset(lake, "ds")).items()}

    assert rewards("sum") == {"a": 1.25, "b": 0.0, "c": 1.0}
    assert rewards("mean") == {"a": 0.625, "b": 0.0, "c": 1.0}
    assert rewards("latest") == {"a": 0.25, "b": 0.0, "c": 1.0}
    assert rewards("latest:pass") == {"a": 1.0, "b": 0.0}
    assert rewards("weighted:pass=1,style=2") == {"a": 1.5}
    assert get_manifest(lake, "ds")["counts"]["rollouts"]["without_reward"] == 2


def test_selection_filters(lake, rows):
    agent(rows, "a", "t1", 1.0, tenant="acme", harness=("swe", "1.0"), policy_version="p1")
    agent(rows, "b", "t2", 1.0, tenant="other", harness=("swe", "2.0"), policy_version="p2", status="failed")
    agent(rows, "c", "t1", 1.0, status=None, started=T0 + timedelta(days=2))
    rows.flush()

    def selected(**kw) -> list[str]:
        build_dataset(lake, "ds", BuildConfig(selection=Selection(**kw), advantage="raw"))
        return sorted(set(read_dataset(lake, "ds")["rollout_id"].to_pylist()))

    assert selected() == ["a", "b"]
    assert selected(include_unfinished=True) == ["a", "b", "c"]
    assert selected(tasks=("t2",)) == ["b"]
    assert selected(tenants=("acme",)) == ["a"]
    assert selected(harnesses=("swe@2.0",)) == ["b"]
    assert selected(harnesses=("swe",)) == ["a", "b"]
    assert selected(policy_versions=("p1",)) == ["a"]
    assert selected(statuses=("failed",)) == ["b"]
    assert selected(since=T0 + timedelta(days=1), include_unfinished=True) == ["c"]
    assert selected(until=T0 + timedelta(days=1), include_unfinished=True) == ["a", "b"]
    assert selected(where="tenant = 'other' OR rollout_id = 'a'") == ["a", "b"]
    manifest = get_manifest(lake, "ds")
    assert manifest["filters"]["where"] == "tenant = 'other' OR rollout_id = 'a'"


def test_calls_that_must_not_be_trained_are_excluded_and_counted(lake, rows):
    rows.rollout("r", "t")
    rows.call("r", "c1", [1, 2], [3], idempotency_key="k1", error="upstream 503")
    rows.call("r", "c1-retry", [1, 2], [3], idempotency_key="k1")  # the retry that worked
    rows.call("r", "c1-retry", [1, 2], [3], idempotency_key="k1")  # a duplicate delivery
    rows.call("r", "c2", [1, 2, 3, 4], [5], token_source="retokenized")
    rows.call("r", "c3", [1, 2, 3, 4, 5, 6], [7])
    rows.call("r", "c4", [1, 2, 3, 4, 5, 6, 7, 8], [9], respond=False)
    rows.call("r", "c5", [1, 2, 3, 4, 5, 6, 7, 8, 10], [11, 12], logprobs=[-0.1])
    rows.call("r", "c6", None, None, token_source="none")
    rows.reward("r", 1.0)
    rows.flush()
    result = build_dataset(lake, "ds")
    assert result.manifest["counts"]["calls"] == {
        "ok": 2, "duplicate": 2, "no_response": 1, "error": 0, "non_engine": 2, "malformed": 1, "unresolved_prefix": 0}
    [sample] = read_dataset(lake, "ds").to_pylist()  # c2 was not trained: its tokens are an observation
    assert sample["call_ids"] == ["c1-retry", "c3"] and sample["loss_mask"] == [0, 0, 1, 0, 0, 0, 1]
    build_dataset(lake, "ds", BuildConfig(allow_non_engine=True))
    [sample] = read_dataset(lake, "ds").to_pylist()
    assert sample["call_ids"] == ["c1-retry", "c2", "c3"]
    assert sample["loss_mask"] == [0, 0, 1, 0, 1, 0, 1]


def test_degenerate_groups_get_zero_advantage_or_are_dropped(lake, rows):
    agent(rows, "solo", "t1", 5.0)
    agent(rows, "same1", "t2", 1.0)
    agent(rows, "same2", "t2", 1.0)
    agent(rows, "g1", "t3", 1.0, group_id="g")  # t3 and t4 share an explicit group
    agent(rows, "g2", "t4", 0.0, group_id="g")
    rows.flush()
    kept = build_dataset(lake, "ds")
    advantages = {r: s[0]["advantage"] for r, s in by_rollout(read_dataset(lake, "ds")).items()}
    assert advantages == {"solo": 0.0, "same1": 0.0, "same2": 0.0, "g1": 1.0, "g2": -1.0}
    assert kept.manifest["counts"]["groups"] == {"count": 3, "singleton": 1, "zero_std": 1, "degenerate_rollouts": 3}
    dropped = build_dataset(lake, "ds", BuildConfig(drop_degenerate=True))
    assert sorted(read_dataset(lake, "ds")["rollout_id"].to_pylist()) == ["g1", "g2"]
    assert dropped.manifest["counts"]["rollouts"]["degenerate_dropped"] == 3
    by_task = build_dataset(lake, "ds", BuildConfig(group_by="task_id"))
    assert by_task.manifest["counts"]["groups"]["singleton"] == 3


def test_past_versions_stay_readable_and_registered(lake, four):
    build_dataset(lake, "ds")
    build_dataset(lake, "ds", BuildConfig(selection=Selection(tasks=("t1",))))
    build_dataset(lake, "other")
    assert read_dataset(lake, "ds", 0).num_rows == 5
    assert read_dataset(lake, "ds").num_rows == 3
    listed = list_versions(lake).to_pylist()
    assert [(r["dataset"], r["version"], r["n_samples"]) for r in listed] == [("ds", 0, 5), ("ds", 1, 3), ("other", 0, 5)]
    manifest = get_manifest(lake, "ds", 1)
    assert manifest["sources"] == {t: 0 for t in ("rollout_starts", "rollout_ends", "llm_requests", "llm_responses",
                                                   "rewards")}
    assert manifest["filters"]["tasks"] == ["t1"] and manifest["code_version"].startswith("trajlake")
    with pytest.raises(DatasetNotFound, match=r"versions are \[0, 1\]"):
        get_manifest(lake, "ds", 7)
    with pytest.raises(DatasetNotFound):
        read_dataset(lake, "nope")


def test_export_writes_parquet_that_reads_back_row_for_row(lake, four, tmp_path):
    build_dataset(lake, "ds")
    result = export_parquet(lake, "ds", tmp_path / "out", rows_per_file=2)
    assert [f.name for f in result.files] == ["train-00000.parquet", "train-00001.parquet", "train-00002.parquet"]
    exported = pq.read_table(tmp_path / "out" / "data")
    original = read_dataset(lake, "ds")
    assert exported.sort_by("sample_id").to_pylist() == original.sort_by("sample_id").to_pylist()
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["content_hash"] == result_hash(lake)
    with pytest.raises(FileExistsError, match="empty directory"):
        export_parquet(lake, "ds", tmp_path / "out")


def result_hash(lake) -> str:
    return get_manifest(lake, "ds")["content_hash"]


def test_clear_errors_for_missing_tables_empty_selection_and_bad_filters(lake, four):
    with pytest.raises(EmptyDataset, match="no rollout is left"):
        build_dataset(lake, "ds", BuildConfig(selection=Selection(tasks=("nope",))))
    with pytest.raises(BadFilter, match="Columns you can use"):
        build_dataset(lake, "ds", BuildConfig(selection=Selection(where="no_such_column = 1")))
    with pytest.raises(ValueError, match="dataset name"):
        build_dataset(lake, "../escape")
    assert not lake.exists("dataset_versions")


def test_a_lake_without_rollouts_is_refused(lake):
    with pytest.raises(SourceMissing, match="ingest rollouts first"):
        build_dataset(lake, "ds")


def test_a_malformed_rollout_table_still_builds(lake, rows):
    rows.keys["x"] = {"tenant": "acme", "task_id": "t", "rollout_id": "x", "attempt": 0, "harness_name": None,
                      "harness_version": None, "harness_config_hash": None}
    rows.finish("x")  # finished, never started: still a rollout, grouped by its task
    rows.call("x", "c", [1], [2])
    rows.reward("x", 1.0)
    rows.flush()
    build_dataset(lake, "ds", BuildConfig(advantage="raw"))
    [sample] = read_dataset(lake, "ds").to_pylist()
    assert (sample["group_id"], sample["policy_version"], sample["advantage"]) == ("t", "p1", 1.0)


class FailingProducer:
    def send(self, topic, value=None, key=None):
        raise KafkaTimeoutError("broker gone")


def test_a_failed_announcement_leaves_the_version_committed(lake, four):
    result = build_dataset(lake, "ds", producer=FailingProducer())
    assert not result.published and "broker gone" in result.publish_error
    assert pc.sum(list_versions(lake)["n_samples"]).as_py() == 5


def test_token_counts_that_disagree_with_the_token_lists_are_reported(lake, rows):
    agent(rows, "r", "t", 1.0)
    rows.rows["llm_responses"][0].update(n_response_tokens=7, logprobs=[-0.1] * 7)  # the token list holds 2
    rows.flush()
    with pytest.raises(CorruptTable, match="trajlake rebuild"):
        build_dataset(lake, "ds")
    assert not lake.exists("datasets/ds")


def test_a_build_that_fails_midway_leaves_the_last_version_and_no_file_behind(lake, rows):
    agent(rows, "r1", "t", 1.0)
    rows.flush()
    build_dataset(lake, "ds")
    folder = Path(lake.root) / "datasets" / "ds"
    files = sorted(folder.glob("*.parquet"))
    agent(rows, "r2", "t", 0.0)
    rows.rows["llm_responses"][-1].update(n_response_tokens=7, logprobs=[-0.1] * 7)  # the token list holds 3
    rows.flush()
    with pytest.raises(CorruptTable):
        build_dataset(lake, "ds", BuildConfig(batch_tokens=1))  # r1's batch is written before r2's fails
    assert lake.version("datasets/ds") == 0
    assert sorted(folder.glob("*.parquet")) == files


def test_a_rollout_id_reused_by_another_tenant_never_mixes_their_rows(lake, rows):
    agent(rows, "r1", "t", 1.0, tenant="acme")
    agent(rows, "r2", "t", 0.0, tenant="acme")
    rows.flush()
    rows.rollout("r1", "t", tenant="beta")  # same rollout_id, another tenant
    rows.call("r1", "beta-call", [1, 2, 3], [4, 5])
    rows.reward("r1", 9.0)
    rows.flush()
    build_dataset(lake, "acme", BuildConfig(selection=Selection(tenants=("acme",))))
    samples = by_rollout(read_dataset(lake, "acme"))
    assert samples["r1"][0]["call_ids"] == ["c1", "c2"] and samples["r1"][0]["reward"] == 1.0
    everyone = build_dataset(lake, "everyone")
    assert everyone.manifest["counts"]["rollouts"]["ambiguous_id"] == 2
    assert read_dataset(lake, "everyone")["rollout_id"].to_pylist() == ["r2"]


def test_a_where_predicate_cannot_read_outside_the_lake(lake, four, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("x\n1\n")
    with pytest.raises(BadFilter, match="(?i)permission|access|disabled"):
        build_dataset(lake, "ds", BuildConfig(selection=Selection(
            where=f"EXISTS (SELECT * FROM read_csv('{secret}'))")))
