"""Observation-prediction datasets: the loss mask covers exactly the tool-result tokens the harness appended."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from pipelines import BuildConfig, EmptyDataset, build_dataset, read_dataset
from pipelines.datasets.merging import Call, merge_calls
from pipelines.datasets.registry import lineage_rows
from tests.pipelines.conftest import LakeRows
from trainer.dataset import DatasetRef, load_samples
from trajlake.cli import build_app

SYSTEM = {"role": "system", "content": "the agent reads the file and runs the tests"}
TASK = {"role": "user", "content": "fix the bug in parser module"}
RESULTS = ["tool result output error failed", "tool result passed"]


def render(tok, messages: list[dict]) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def sampled(tok, text: str, *, finished: bool = True) -> list[int]:
    return tok.encode(text) + ([tok.convert_tokens_to_ids("<|im_end|>")] if finished else [])


def episode(tok, rows: LakeRows, rollout_id: str, *, results: list[str] = RESULTS, cut_first: bool = False,
            reward: float = 1.0) -> list[tuple[list[int], list[int]]]:
    """An agent rollout: a call, then one call after each tool result; returns (prompt, response) per call."""
    rows.rollout(rollout_id, "t1")
    messages = [SYSTEM, TASK]
    calls = []
    for i in range(len(results) + 1):
        response = sampled(tok, f"the agent runs the tests {i}", finished=not (cut_first and i == 0))
        prompt = render(tok, messages)
        calls.append((prompt, response))
        rows.call(rollout_id, f"c{i}", prompt, response)
        if i < len(results):
            messages += [{"role": "assistant", "content": tok.decode(response, skip_special_tokens=True)},
                         {"role": "tool", "content": results[i]}]
    rows.reward(rollout_id, reward)
    return calls


def observation_spans(calls: list[tuple[list[int], list[int]]]) -> list[tuple[int, int]]:
    """Where each next prompt goes past the previous prompt + response: (start, stop)."""
    spans = []
    for (prompt, response), (next_prompt, _) in zip(calls, calls[1:]):
        held = prompt + response
        assert next_prompt[: len(held)] == held  # the rollout extends token-exactly
        spans.append((len(held), len(next_prompt)))
    return spans


def test_observation_samples_mask_exactly_the_tool_result_tokens(lake, rows, chat_tokenizer):
    tok = chat_tokenizer
    calls = episode(tok, rows, "r1")
    rows.flush()
    build_dataset(lake, "obs", BuildConfig(mask="observations"))
    [row] = read_dataset(lake, "obs").to_pylist()
    spans = observation_spans(calls)
    expected = np.zeros(len(row["input_ids"]), dtype=np.int8)
    for start, stop in spans:
        expected[start:stop] = 1
    assert row["input_ids"] == calls[-1][0] + calls[-1][1]
    assert row["loss_mask"] == expected.tolist()
    # the span is the tool message with its chat-template wrapper and the next generation prompt, nothing else
    for (start, stop), result in zip(spans, RESULTS):
        wrapped = f"\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(row["input_ids"][start:stop]) == wrapped
    # no sampled token, no first-prompt token
    for prompt, response in calls:
        assert set(row["loss_mask"][len(prompt) : len(prompt) + len(response)]) == {0}
    assert set(row["loss_mask"][: len(calls[0][0])]) == {0}
    assert row["n_trained_tokens"] == sum(stop - start for start, stop in spans)
    assert set(row["old_logprobs"]) == {0.0} and row["advantage"] == 0.0


def test_a_closing_token_the_engine_did_not_sample_is_an_observation(lake, rows, chat_tokenizer):
    tok = chat_tokenizer
    calls = episode(tok, rows, "r1", results=RESULTS[:1], cut_first=True)  # max_tokens cut the first response
    rows.flush()
    build_dataset(lake, "obs", BuildConfig(mask="observations"))
    [row] = read_dataset(lake, "obs").to_pylist()
    [(start, stop)] = observation_spans(calls)
    assert row["input_ids"][start] == tok.convert_tokens_to_ids("<|im_end|>")  # the template closed the turn
    assert row["loss_mask"] == [0] * start + [1] * (stop - start) + [0] * (len(row["input_ids"]) - stop)


def test_action_and_observation_masks_split_everything_after_the_first_prompt(lake, rows, chat_tokenizer):
    calls = episode(chat_tokenizer, rows, "r1")
    rows.flush()
    actions = build_dataset(lake, "act")
    observations = build_dataset(lake, "obs", BuildConfig(mask="observations"))
    [a] = read_dataset(lake, "act").to_pylist()
    [o] = read_dataset(lake, "obs").to_pylist()
    assert a["sample_id"] == o["sample_id"] and a["input_ids"] == o["input_ids"]
    mask_a, mask_o = np.array(a["loss_mask"]), np.array(o["loss_mask"])
    first = len(calls[0][0])
    assert not (mask_a & mask_o).any()
    assert ((mask_a | mask_o)[first:] == 1).all() and not (mask_a | mask_o)[:first].any()
    assert observations.content_hash != actions.content_hash
    assert observations.manifest["mask"] == "observations" and actions.manifest["mask"] == "actions"
    assert observations.manifest["config"]["mask"] == "observations"
    assert "mask" not in BuildConfig().identity()  # default configs keep the hash they had before the option
    assert observations.manifest["counts"]["trained_tokens"] == int(mask_o.sum())
    # traced like any dataset: the same rollouts and events
    assert lineage_rows(lake, "obs", 0)["call_event_ids"].to_pylist() == \
        lineage_rows(lake, "act", 0)["call_event_ids"].to_pylist()


def test_weights_are_the_observation_token_mean_and_empty_samples_are_left_out(lake, rows, chat_tokenizer):
    tok = chat_tokenizer
    long_calls = episode(tok, rows, "r1", reward=0.0)
    short_calls = episode(tok, rows, "r2", results=RESULTS[:1], reward=-1.0)
    # a sub-agent call in r2 that nothing extends: a sample without observations
    rows.call("r2", "sub", render(tok, [SYSTEM, {"role": "user", "content": "summary of previous steps"}]),
              sampled(tok, "passed"), span_id="sub")
    episode(tok, rows, "r3", results=[])  # one call: no observation at all
    rows.flush()
    seen: list[tuple[int, int]] = []
    result = build_dataset(lake, "obs", BuildConfig(mask="observations"), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(3, 6), (4, 4)]  # one bar over both passes: counting (3 rollouts), writing (2 left)
    table = read_dataset(lake, "obs")
    by_id = {r["sample_id"]: r for r in table.to_pylist()}
    assert sorted(by_id) == ["r1/0", "r2/0"]
    o1 = sum(b - a for a, b in observation_spans(long_calls))
    o2 = sum(b - a for a, b in observation_spans(short_calls))
    assert by_id["r1/0"]["token_weight"] == pytest.approx(1 / (2 * o1))
    assert by_id["r2/0"]["token_weight"] == pytest.approx(1 / (2 * o2))
    weights = np.array(table["token_weight"].to_pylist()) * np.array(table["n_trained_tokens"].to_pylist())
    assert weights.sum() == pytest.approx(1.0, abs=1e-6)
    counts = result.manifest["counts"]
    assert counts["rollouts"]["without_trained_tokens"] == 1 and counts["rollouts"]["in_dataset"] == 2
    assert counts["samples_without_observations"] == 1 and counts["samples"] == 2
    assert set(table["advantage"].to_pylist()) == {0.0}  # rewards 0 and -1 differ, yet no advantage
    assert [r["n_samples"] for r in lineage_rows(lake, "obs", 0).to_pylist()] == [1, 1]
    # every row passes the trainer's checks (a row without a masked token would fail the version)
    samples = load_samples(lake, DatasetRef("obs", 0), vocab_size=len(tok), max_len=4096)
    assert len(samples) == 2


def test_no_rollout_with_an_observation_is_an_empty_dataset(lake, rows, chat_tokenizer):
    episode(chat_tokenizer, rows, "r1", results=[])
    rows.flush()
    with pytest.raises(EmptyDataset, match="none with an observation"):
        build_dataset(lake, "obs", BuildConfig(mask="observations"))


def test_observation_spans_of_interleaved_and_restarted_samples():
    """Merging records where each extension's observation sits, per sample, whatever the call order."""
    def call(call_id, prompt, response, span=None):
        return Call(call_id, span, "tok", "tpl", np.array(prompt, np.int32), np.array(response, np.int32),
                    np.zeros(len(response), np.float32))
    parent0 = call("p0", [1, 2], [3])
    child0 = call("s0", [9], [8], span="sub")
    parent1 = call("p1", [1, 2, 3, 4, 5], [6])
    child1 = call("s1", [9, 8, 7], [6], span="sub")
    restart = call("p2", [1, 2, 30], [31])  # cannot extend: a new sample, its prompt is no observation
    samples = merge_calls([parent0, child0, parent1, child1, restart])
    assert [s.observed for s in samples] == [[(3, 2)], [(2, 1)], []]
    assert samples[0].observation_arrays()[1].tolist() == [0, 0, 0, 1, 1, 0]
    assert [s.n_observed for s in samples] == [2, 1, 0]
    # a call whose prompt is exactly the sample so far adds no observation span
    [same] = merge_calls([parent0, call("p1", [1, 2, 3], [4])])
    assert same.observed == [] and same.observation_arrays()[1].sum() == 0


@pytest.mark.parametrize("value", ["obs", "", "ACTIONS", 1, None])
def test_unknown_mask_modes_are_refused(value):
    with pytest.raises(ValidationError):
        BuildConfig(mask=value)


def test_observation_datasets_refuse_advantage_options():
    with pytest.raises(ValidationError, match="carry no advantage"):
        BuildConfig(mask="observations", drop_degenerate=True)


def test_the_cli_builds_observation_datasets(lake, rows, chat_tokenizer, monkeypatch):
    episode(chat_tokenizer, rows, "r1")
    rows.flush()
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    monkeypatch.delenv("TRAJLAKE_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    built = runner.invoke(build_app(), ["build-dataset", "obs", "--mask", "observations"])
    assert built.exit_code == 0, built.output
    assert "loss on observations (tool results), not actions: train with --mode sft" in built.output
    bad = runner.invoke(build_app(), ["build-dataset", "obs", "--mask", "tools"])
    assert bad.exit_code == 1 and "mask" in bad.output
