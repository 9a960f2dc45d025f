"""Prefix references in the lake: stored as sent, full prompts resolved in SQL, in Python and in the dataset build.

A rollout of three calls, each prompt extending the previous call's prompt +
response, is written once with full prompts and once with references; every
reader must see the same full prompts and the same samples. A reference to a
call that is not in the lake is skipped and counted, never guessed.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pipelines import BuildConfig, build_dataset, read_dataset
from store.lake import Lake
from store.prompts import StoredCall, full_prompts
from store.sql import run_query
from store.trajectory import load_trajectory
from tests.store.lake_builder import event, write_events
from trajlake.cli import build_app

PROMPTS = {"c1": [1, 2, 3], "c2": [1, 2, 3, 4, 5, 6], "c3": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
RESPONSES = {"c1": [4, 5], "c2": [7, 8], "c3": [11]}
REFERENCES = {"c2": ("c1", 5), "c3": ("c2", 8)}


def rollout(rollout_id: str, *, references: bool, missing: str | None = None) -> list:
    events, seq = [event("rollout.started", {}, seq=0, rollout_id=rollout_id)], 1
    for call_id, prompt in PROMPTS.items():
        payload = {"call_id": call_id, "prompt_token_ids": prompt}
        if references and call_id in REFERENCES:
            extends, shared = REFERENCES[call_id]
            payload.update(extends_call_id=extends, extends_tokens=shared, prompt_token_ids=prompt[shared:])
        if call_id != missing:
            events += [
                event("llm.request", payload, seq=seq, rollout_id=rollout_id),
                event("llm.response", {"call_id": call_id, "response_token_ids": RESPONSES[call_id],
                                       "logprobs": [-0.5] * len(RESPONSES[call_id]), "token_source": "engine"},
                      seq=seq + 1, rollout_id=rollout_id),
            ]
        seq += 2
    events.append(event("reward", {"name": "pass", "value": 1.0}, seq=seq, rollout_id=rollout_id))
    events.append(event("rollout.finished", {"status": "succeeded"}, seq=seq + 1, rollout_id=rollout_id))
    return events


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(str(tmp_path / "lake"))
    write_events(lake, rollout("full", references=False) + rollout("refs", references=True)
                 + rollout("gap", references=True, missing="c2"))
    return lake


def test_references_are_stored_as_sent_and_count_the_full_prompt(lake):
    rows = run_query(lake, "SELECT call_id, prompt_token_ids, n_prompt_tokens, extends_call_id, extends_tokens "
                           "FROM llm_calls WHERE rollout_id = 'refs' ORDER BY seq").to_pylist()
    assert [r["prompt_token_ids"] for r in rows] == [[1, 2, 3], [6], [9, 10]]
    assert [r["n_prompt_tokens"] for r in rows] == [3, 6, 10]  # the full prompt, as without references
    assert [(r["extends_call_id"], r["extends_tokens"]) for r in rows] == [(None, None), ("c1", 5), ("c2", 8)]
    totals = run_query(lake, "SELECT rollout_id, n_prompt_tokens FROM rollouts ORDER BY rollout_id").to_pylist()
    assert {r["rollout_id"]: r["n_prompt_tokens"] for r in totals}["refs"] == 19


def test_the_sql_view_resolves_full_prompts(lake):
    rows = run_query(lake, "SELECT rollout_id, call_id, prompt_token_ids, resolved FROM llm_call_prompts "
                           "ORDER BY rollout_id, seq").to_pylist()
    got = {(r["rollout_id"], r["call_id"]): (r["prompt_token_ids"], r["resolved"]) for r in rows}
    for call_id, prompt in PROMPTS.items():
        assert got[("full", call_id)] == (prompt, True)
        assert got[("refs", call_id)] == (prompt, True)
    assert got[("gap", "c1")] == (PROMPTS["c1"], True)
    assert got[("gap", "c3")] == (None, False)  # extends c2, which never arrived


def test_python_resolution_names_why_a_chain_breaks():
    calls = [StoredCall("a", [1], [2]), StoredCall("b", [3], [4], "a", 2), StoredCall("c", [5], None, "b", 9),
             StoredCall("d", [6], None, "zz", 1), StoredCall("e", [7], None, "d", 1),
             StoredCall("f", [], None, "g", 0), StoredCall("g", [], None, "f", 0), StoredCall("h", None, None, "a", 1)]
    prompts, problems = full_prompts(calls)
    assert {k: v.tolist() for k, v in prompts.items()} == {"a": [1], "b": [1, 2, 3]}
    assert problems == {"c": "beyond_prefix", "d": "missing_call", "e": "missing_call", "f": "cycle", "g": "cycle",
                        "h": "no_ids"}


def test_the_dataset_build_trains_full_prompts_and_counts_unresolved_references(lake):
    result = build_dataset(lake, "refs", BuildConfig())
    samples = {r["rollout_id"]: r for r in read_dataset(lake, "refs").to_pylist()}
    assert samples["refs"]["input_ids"] == samples["full"]["input_ids"] == PROMPTS["c3"] + RESPONSES["c3"]
    assert samples["refs"]["loss_mask"] == samples["full"]["loss_mask"]
    assert result.manifest["counts"]["calls"]["unresolved_prefix"] == 1  # gap/c3 (gap/c2 never arrived)
    assert samples["gap"]["call_ids"] == ["c1"]


def test_a_table_written_before_the_columns_existed_reads_them_as_null(tmp_path):
    lake = Lake(str(tmp_path / "old"))
    write_events(lake, rollout("full", references=False))
    table = lake.read("llm_requests")
    old = table.drop_columns(["extends_call_id", "extends_tokens"])
    old_lake = Lake(str(tmp_path / "older"))
    old_lake.append("llm_requests", old)
    assert old_lake.read("llm_requests").column("extends_call_id").null_count == 3
    rows = run_query(old_lake, "SELECT call_id, prompt_token_ids, resolved FROM llm_call_prompts ORDER BY seq")
    assert rows.column("resolved").to_pylist() == [True] * 3
    assert rows.column("prompt_token_ids").to_pylist() == list(PROMPTS.values())
    assert pa.types.is_string(old_lake.dataset("llm_requests").schema.field("extends_call_id").type)


def test_rollout_show_counts_full_prompts(lake):
    steps = [s for s in load_trajectory(lake, "refs").steps if s.kind == "llm.call"]
    assert [s.n_prompt_tokens for s in steps] == [len(p) for p in PROMPTS.values()]
    shown = CliRunner().invoke(build_app(), ["rollout", "show", "refs", "--lake", lake.root], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "10 -> 1 tokens" in shown.output, shown.output
