"""Merging edge cases on token ids made by a real BPE tokenizer and a ChatML chat template."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines import build_dataset
from pipelines.datasets.config import BuildConfig
from pipelines.datasets.merging import (
    Call,
    classify_mismatch,
    common_prefix_length,
    is_prefix,
    merge_calls,
    tokenizer_decoders,
)
from schemas.tokenizer_identity import tokenizer_identity

SYSTEM = {"role": "system", "content": "the agent reads the file and runs the tests"}
TASK = {"role": "user", "content": "fix the bug in parser module"}


def render(tok, messages: list[dict]) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def sampled(tok, text: str, *, finished: bool = True) -> list[int]:
    """What the engine samples for ``text``: its tokens, then <|im_end|> unless cut by max_tokens."""
    return tok.encode(text) + ([tok.convert_tokens_to_ids("<|im_end|>")] if finished else [])


def call(call_id: str, prompt: list[int], response: list[int], *, span: str | None = None,
         template: str = "chatml-1", tokenizer: str = "tiny-bpe") -> Call:
    logprobs = -np.arange(1, len(response) + 1, dtype=np.float32) / 10
    return Call(call_id, span, tokenizer, template, np.array(prompt, np.int32), np.array(response, np.int32), logprobs)


def turns(tok, n: int, history: list[dict] | None = None) -> tuple[list[Call], list[dict]]:
    """``n`` agent turns: response, tool observation, next prompt rendered from the whole chat."""
    messages = list(history or [SYSTEM, TASK])
    calls = []
    for i in range(n):
        text = f"the agent runs the tests {i}"
        calls.append(call(f"c{i}", render(tok, messages), sampled(tok, text)))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"tool result passed {i}"}]
    return calls, messages


def test_exact_extension_makes_one_sample_with_masks_and_logprobs(chat_tokenizer):
    calls, _ = turns(chat_tokenizer, 3)
    [sample] = merge_calls(calls)
    ids, mask, logprobs = sample.arrays()
    assert sample.call_ids == ["c0", "c1", "c2"] and sample.start_reason == "first"
    assert np.array_equal(ids[: len(calls[2].prompt)], calls[2].prompt)
    assert np.array_equal(ids[len(calls[2].prompt):], calls[2].response)
    for c in calls:  # each response is masked, with its own logprobs, where it sits
        start = len(c.prompt)
        assert mask[start : start + len(c.response)].tolist() == [1] * len(c.response)
        assert np.array_equal(logprobs[start : start + len(c.response)], c.logprobs)
    assert mask.sum() == sum(len(c.response) for c in calls)
    assert logprobs[mask == 0].tolist() == [0.0] * int((mask == 0).sum())
    first_obs = slice(len(calls[0].prompt) + len(calls[0].response), len(calls[1].prompt))
    assert mask[first_obs].sum() == 0 and first_obs.stop > first_obs.start


def test_retokenized_history_breaks_the_prefix(chat_tokenizer):
    tok = chat_tokenizer
    messages = [SYSTEM, TASK]
    text = "the agent reads the file"
    canonical = tok.encode(text)
    # the engine sampled a valid but non-canonical split of the last word
    last = tok.convert_ids_to_tokens(canonical[-1])
    assert len(last) > 2, "the tokenizer must merge 'file' for this test to mean anything"
    odd = canonical[:-1] + tok.convert_tokens_to_ids([last[:2], last[2:]]) + sampled(tok, "")
    first = call("c0", render(tok, messages), odd)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "tool result passed"}]
    second = call("c1", render(tok, messages), sampled(tok, "fixes the bug"))
    samples = merge_calls([first, second])
    assert [s.start_reason for s in samples] == ["first", "retokenization"]
    assert [s.call_ids for s in samples] == [["c0"], ["c1"]]


def byte_by_byte(tok, text: str) -> list[int]:
    """A valid, maximally non-canonical split of ``text``: one token per byte-level character."""
    return tok.convert_tokens_to_ids([c for t in tok.tokenize(text) for c in t])


def test_a_text_identical_rerender_is_retokenization_when_the_tokenizer_is_known(chat_tokenizer, tmp_path):
    """The engine sampled odd splits (many more tokens than the canonical re-render): by token counts alone this
    looks like dropped history (truncation); by text the history is all there (retokenization)."""
    tok = chat_tokenizer
    tok.save_pretrained(tmp_path / "tok")
    decoders = tokenizer_decoders([tmp_path / "tok"])
    identity = tokenizer_identity(tok)
    assert list(decoders) == [identity]
    messages = [SYSTEM, TASK]
    text = "the agent reads the file and runs the tests then fixes the bug in parser module"
    first = call("c0", render(tok, messages), byte_by_byte(tok, text) + sampled(tok, ""), tokenizer=identity)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "tool result passed"}]
    second = call("c1", render(tok, messages), sampled(tok, "fixes the bug"), tokenizer=identity)
    assert len(first.response) > 2 * len(tok.encode(text))
    assert [s.start_reason for s in merge_calls([first, second])] == ["first", "truncation"]  # no tokenizer known
    assert [s.start_reason for s in merge_calls([first, second], decoders=decoders)] == ["first", "retokenization"]
    # a real truncation stays one when the tokenizer is known
    summary = [SYSTEM, {"role": "user", "content": "summary of previous steps: tests passed"}]
    third = call("c2", render(tok, summary), sampled(tok, "the agent fixes the bug"), tokenizer=identity)
    calls, _ = turns(tok, 3)
    calls = [call(c.call_id, c.prompt.tolist(), c.response.tolist(), tokenizer=identity) for c in calls] + [third]
    assert [s.start_reason for s in merge_calls(calls, decoders=decoders)] == ["first", "truncation"]


def test_a_folder_without_a_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer could be loaded"):
        tokenizer_decoders([tmp_path])


def test_summarised_history_is_classified_truncation(chat_tokenizer):
    calls, _ = turns(chat_tokenizer, 3)
    summary = [SYSTEM, {"role": "user", "content": "summary of previous steps: tests passed"}]
    calls.append(call("c3", render(chat_tokenizer, summary), sampled(chat_tokenizer, "the agent fixes the bug")))
    samples = merge_calls(calls)
    assert [s.start_reason for s in samples] == ["first", "truncation"]
    assert samples[1].call_ids == ["c3"]


def test_dropped_middle_turns_are_classified_truncation(chat_tokenizer):
    calls, messages = turns(chat_tokenizer, 4)
    kept = messages[:2] + messages[-2:]  # system, task, last turn: the middle turns are dropped
    calls.append(call("c4", render(chat_tokenizer, kept), sampled(chat_tokenizer, "the agent fixes the bug")))
    assert [s.start_reason for s in merge_calls(calls)] == ["first", "truncation"]


def test_subagent_calls_interleaved_with_the_parent_do_not_break_its_sample(chat_tokenizer):
    parent, _ = turns(chat_tokenizer, 3)
    sub_history = [{"role": "system", "content": "summary of previous steps user"}, TASK]
    child, _ = turns(chat_tokenizer, 2, sub_history)
    child = [call(f"sub{i}", c.prompt.tolist(), c.response.tolist(), span="sub") for i, c in enumerate(child)]
    order = [parent[0], child[0], parent[1], child[1], parent[2]]
    samples = merge_calls(order)
    assert [s.call_ids for s in samples] == [["c0", "c1", "c2"], ["sub0", "sub1"]]
    assert [s.start_reason for s in samples] == ["first", "first"]


def test_a_truncated_response_still_extends_and_the_closing_token_is_not_trained(chat_tokenizer):
    tok = chat_tokenizer
    messages = [SYSTEM, TASK]
    full = sampled(tok, "the agent reads the file and runs the tests then", finished=False)
    cut = full[:5]  # max_tokens reached: no <|im_end|> was sampled
    first = call("c0", render(tok, messages), cut)
    messages += [{"role": "assistant", "content": tok.decode(cut)}, {"role": "user", "content": "continue"}]
    second = call("c1", render(tok, messages), sampled(tok, "fixes the bug"))
    [sample] = merge_calls([first, second])
    ids, mask, _ = sample.arrays()
    end = len(first.prompt) + len(cut)
    assert ids[end] == tok.convert_tokens_to_ids("<|im_end|>") and mask[end] == 0
    assert mask.sum() == len(cut) + len(second.response)


def test_a_changed_chat_template_is_classified(chat_tokenizer):
    calls, _ = turns(chat_tokenizer, 2)
    messages = [SYSTEM, TASK, {"role": "assistant", "content": "other words"}]
    late = call("c9", render(chat_tokenizer, messages), [5], template="chatml-2")
    assert [s.start_reason for s in merge_calls(calls + [late])] == ["first", "chat_template"]


def test_a_rewritten_system_prompt_is_other():
    base = call("a", [1, 2, 3, 4, 5, 6], [7, 8])
    rewritten = call("b", [1, 9, 3, 4, 5, 6, 7, 8, 10], [11])
    assert [s.start_reason for s in merge_calls([base, rewritten])] == ["first", "other"]


def test_the_longest_matching_open_sample_is_extended():
    a = call("a", [1, 2], [3])
    b = call("b", [1, 2, 3, 4], [5])   # extends a
    c = call("c", [1, 2, 3], [9])      # a is now [1..5]: no match -> new sample
    d = call("d", [1, 2, 3, 9, 7], [8])  # extends c, not a
    samples = merge_calls([a, b, c, d])
    assert [s.call_ids for s in samples] == [["a", "b"], ["c", "d"]]


@pytest.mark.parametrize(
    ("prefix", "tokens", "expected"),
    [([], [1], True), ([1, 2], [1, 2], True), ([1, 2], [1, 2, 3], True), ([1, 3], [1, 2, 3], False),
     ([1, 2, 3], [1, 2], False)],
)
def test_is_prefix(prefix, tokens, expected):
    assert is_prefix(np.array(prefix, np.int32), np.array(tokens, np.int32)) is expected


def test_common_prefix_length():
    assert common_prefix_length(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix_length(np.array([1, 2]), np.array([1, 2, 4])) == 2


def test_classification_of_an_empty_response_sample():
    sample = merge_calls([call("a", [1, 2, 3], [])])[0]
    assert sample.arrays()[1].sum() == 0
    assert classify_mismatch(sample, call("b", [1, 2, 4], [5])) == "other"


def test_a_build_with_the_tokenizer_reclassifies_only_text_identical_rerenders(chat_tokenizer, lake, rows, tmp_path):
    """``build_dataset`` with ``tokenizers``: the re-render's break becomes retokenization; a lake without one keeps
    its content hash."""
    tok = chat_tokenizer
    tok.save_pretrained(tmp_path / "tok")
    identity = tokenizer_identity(tok)
    calls, _ = turns(tok, 3)
    rows.rollout("plain", "t1")
    for c in calls:
        rows.call("plain", c.call_id, c.prompt.tolist(), c.response.tolist(), tokenizer=identity)
    rows.reward("plain", 1.0)
    rows.flush()
    with_tokenizer = BuildConfig(tokenizers=(str(tmp_path / "tok"),))
    before = build_dataset(lake, "plain")
    assert build_dataset(lake, "plain", with_tokenizer).content_hash == before.content_hash

    text = "the agent reads the file and runs the tests then fixes the bug in parser module"
    messages = [SYSTEM, TASK]
    rows.rollout("rerendered", "t1")
    rows.call("rerendered", "r0", render(tok, messages), byte_by_byte(tok, text) + sampled(tok, ""), tokenizer=identity)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "tool result passed"}]
    rows.call("rerendered", "r1", render(tok, messages), sampled(tok, "fixes the bug"), tokenizer=identity)
    rows.reward("rerendered", 0.0)
    rows.flush()
    by_counts, by_text = build_dataset(lake, "a"), build_dataset(lake, "b", with_tokenizer)
    assert by_counts.manifest["merge"]["mismatches"]["truncation"] == 1
    assert by_text.manifest["merge"]["mismatches"] == {"chat_template": 0, "retokenization": 1, "truncation": 0,
                                                       "other": 0}
    assert by_text.content_hash != by_counts.content_hash
